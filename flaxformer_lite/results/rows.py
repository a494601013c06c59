"""Results rows (DESIGN.md §7): one per run x evaluation cell x metric, with provenance.

A row's subject is the evaluation plan's label, as separate fields (``encoding`` -- the
display label --, ``positional``, ``variant``, ``randomized_positions``, and the exact
``encoding_options``), so tables group and order rows without parsing label strings. Its
setting is recorded beside it: ``learning_rate`` (the peak rate), ``model_size`` (the sweep's
size name, None when the study sweeps no sizes) and ``num_params`` (the model's parameters),
so a study sweeping them is tabulated per rate and size; ``train_seconds`` times
``train_steps`` steps and ``eval_seconds`` every evaluation of the run (the report's cost
table). What made it is recorded too, so the report can refuse rows that must not share a
table (`results.comparable`): ``setting`` (the run's identity config,
`RunConfig.identity`, flattened to dotted names: ``{"train.num_steps": 20, ...}``),
``swept`` (the fields its study's sweep set for its cell: they are meant to differ between
cells), ``data`` (the corpus provenance with its content hash; with the tokenizer's hash for a
pretrained model), ``pretrained`` (a pretrained model's id, family, revision and weights hash),
``packages`` and ``python``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flaxformer_lite.base.checks import is_number
from flaxformer_lite.results import store
from flaxformer_lite.train.memory import count_parameters
from flaxformer_lite.train.run_config import RunConfig

SCALAR_METRICS = ("bits_per_byte", "loss", "perplexity", "accuracy")
TASK_METRICS = ("exact_match", "accuracy")
# the context protocol's bits per byte on its key targets (`evaluation.protocols.Context`)
KEY_METRIC = "key_bits_per_byte"
LABEL_FIELDS = ("encoding", "positional", "variant", "randomized_positions", "encoding_options")


def _cell_key(run: RunConfig, name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The fields that say which cell a row or a block record comes from."""
    return {
        "study": run.study,
        "preset": run.preset,
        "run": name,
        "seed": run.seed,
        "train_length": run.data.train_length,
        "task": run.data.task or None,
        "config_hash": summary["config_hash"],
    }


def rows_for_cell(
    run: RunConfig,
    name: str,
    summary: dict[str, Any],
    command: str,
    labels: Mapping[str, Any] | None = None,
    swept: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Results rows of one finished cell (``summary``: `train_and_evaluate`'s result;
    ``labels``: the sweep cell's labels, e.g. ``{"model_size": "m"}``; ``swept``: the
    dotted config fields the sweep set for the cell, e.g. its overrides' keys)."""
    env = summary["provenance"]
    common = _cell_key(run, name, summary) | {
        "git_commit": env["git_commit"],
        "packages": env["packages"],
        "python": env["python"],
        "backend": env["backend"],
        "device_kind": env["device_kind"],
        "device_count": env["device_count"],
        "data": env["data"],
        # a pretrained model's id, family, revision, weights / tokenizer sha256 and format,
        # and random_weights when the sweep says its weights are random (else None)
        "pretrained": _pretrained_record(env.get("pretrained"), labels or {}),
        "train_seconds": round(summary["train_seconds"], 3),
        "train_steps": summary.get("train_steps"),  # None in an eval.json from before it
        "eval_seconds": round(summary["eval_seconds"], 3),
        "learning_rate": run.optim.learning_rate,
        "model_size": (labels or {}).get("model_size"),
        "num_params": count_parameters(run.model),
        "command": command,
        "timestamp": summary.get("finished_at"),
        "setting": flatten(run.identity()),
        "swept": sorted(set(swept)),
    }
    rows = []
    for r in summary["eval"]:
        head = common | {k: r[k] for k in LABEL_FIELDS}
        head |= {
            "eval_length": r["eval_length"],
            "eval_multiple": _multiple(r["eval_length"], run.data.train_length),
            "protocol": r["protocol"],
            "stride": r.get("stride"),
            "tokens": r.get("tokens"),
            "num_scored_tokens": r.get("num_scored_tokens"),
            "split": None if r["protocol"] == "task" else run.eval.split,
            "examples": r.get("examples"),
            "scoring": r.get("scoring"),
            "context_block": r.get("context_block"),
        }
        metrics = TASK_METRICS if r["protocol"] == "task" else SCALAR_METRICS
        if r.get("na") is not None:  # not evaluable here: one row per metric, saying why
            rows += [head | {"metric": m, "value": None, "na": r["na"]} for m in metrics]
            continue
        rows += [head | {"metric": m, "value": r[m]} for m in metrics]
        if KEY_METRIC in r:  # not in expected_keys: a cell scored before it was added is done
            key = head | {"metric": KEY_METRIC, "value": r[KEY_METRIC]}
            key["key_targets"] = r["key_targets"]
            if r[KEY_METRIC] is None:
                key["na"] = "no key target in the scored blocks"
            rows.append(key)
        for bucket, value in r.get("bucket_loss", {}).items():
            rows.append(head | {"metric": "bucket_loss", "bucket": bucket, "value": value})
        if "loss_by_position" in r:
            rows.append(head | {"metric": "loss_by_position", "value": r["loss_by_position"]})
    return rows


def _pretrained_record(record: Any, labels: Mapping[str, Any]) -> Any:
    """A pretrained model's record with ``random_weights: True`` when the sweep's entry says
    its weights are random (the report then says its numbers only show the pipeline runs)."""
    if isinstance(record, dict) and labels.get("random_weights"):
        return record | {"random_weights": True}
    return record


def blocks_for_cell(run: RunConfig, name: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-block sums of one finished cell (one line per evaluated cell, beside its rows in
    ``blocks.jsonl``), keyed like its rows so statistics can pair them across encodings."""
    cell = _cell_key(run, name, summary)
    fields = ("encoding", "positional", "variant", "protocol", "eval_length", "blocks")
    return [cell | {k: r[k] for k in fields} for r in summary["eval"] if "blocks" in r]


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` as ``{"a.b": 1, "c": 2}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _multiple(length: int, train_length: int) -> int | float:
    """``length / train_length``, an int when whole (the context protocol has L / 2)."""
    m = length / train_length
    return int(m) if m.is_integer() else m


def expected_keys(run: RunConfig) -> list[tuple[str, int, str, str]]:
    """``(encoding, eval_length, protocol, metric)`` of every row a finished cell of ``run``
    has (per evaluated cell: its scalar metrics and, for corpus windows, the per-position
    curve, which `rows_for_cell` writes last; bucket rows vary with the data, not counted)."""
    keys = []
    for cell in run.eval_plan().cells:
        task = cell.protocol == "task"
        metrics = TASK_METRICS if task else SCALAR_METRICS
        if cell.na is None and not task:
            metrics = (*metrics, "loss_by_position")

        keys += [(cell.label.encoding, cell.length, cell.protocol, m) for m in metrics]
    return keys


def _missing_keys(rows: list[dict[str, Any]], run: RunConfig) -> list[tuple[str, int, str, str]]:
    """The `expected_keys` of ``run`` that no row of ``rows`` has."""
    have = {(r["encoding"], r["eval_length"], r.get("protocol"), r["metric"]) for r in rows}
    return [k for k in expected_keys(run) if k not in have]


class CellRowsError(ValueError):
    """A finished run's rows are not its results (a non-finite value, an expected row
    missing): the cell failed; the message says which length, model and value."""


def _first_non_finite(value: Any) -> tuple[int | None, Any] | None:
    """``(position or None, value)`` of the first NaN or Inf in a row's value (a number, or
    the list of a per-position curve), or None."""
    values = value if isinstance(value, list) else [value]
    for i, v in enumerate(values):
        if is_number(v) and not math.isfinite(v):
            return (i if isinstance(value, list) else None), v
    return None


def made_rows_problem(rows: list[dict[str, Any]], run: RunConfig) -> str | None:
    """Why ``rows`` (`rows_for_cell` of a run that has just finished) are not the results
    of ``run``, or None: the first non-finite value -- which metric, model or encoding,
    length and value -- or an expected row (`expected_keys`) that is missing. The runner
    fails such a cell instead of writing rows that the study would then drop silently."""
    for row in rows:
        bad = _first_non_finite(row.get("value"))
        if bad is not None:
            position, value = bad
            at = "" if position is None else f" at position {position}"
            return (
                f"{row['metric']} of {row['encoding']!r} at length {row['eval_length']} "
                f"({row.get('protocol')}) is {value}{at}: the model gave non-finite numbers"
            )
    missing = _missing_keys(rows, run)
    if missing:
        encoding, length, protocol, metric = missing[0]
        return (
            f"the evaluation gave no {metric} of {encoding!r} at length {length} ({protocol}); "
            f"{len(missing)} expected row(s) missing"
        )
    return None


def cell_rows_problem(path: Path, run: RunConfig | None, name: str) -> str | None:
    """Why ``path`` (a cell's ``rows.jsonl``) does not hold the finished rows of the cell
    ``name`` of ``run``, or None when it does: unreadable, empty, a line that is not a valid
    row (torn, edited, an exact repeat), a row of another run, or an expected row missing
    (`expected_keys`: a file cut short loses at least its last cell's curve; not checked
    when ``run`` is None)."""
    try:
        rows, numbers, problems = store.read_rows_lines(path)
    except (OSError, UnicodeError) as e:
        return f"cannot be read ({e})"
    if problems:
        first = problems[0]
        return f"line {first.line} is not a valid row ({first.message.removeprefix('skipped: ')})"
    if not rows:
        return "is empty"
    for row, number in zip(rows, numbers, strict=True):
        if row.get("run") != name:
            return f"line {number} is a row of run {row.get('run')!r}, not {name!r}"
    missing = _missing_keys(rows, run) if run is not None else []
    if missing:
        encoding, length, protocol, metric = missing[0]
        return (
            f"misses {len(missing)} expected row(s), e.g. {metric} of {encoding!r} at length "
            f"{length} ({protocol})"
        )
    return None
