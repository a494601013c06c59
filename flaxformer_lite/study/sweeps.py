"""A study's cells as data: ``config.sweep`` expanded into one run per encoding x seed (x task).

``config.sweep`` holds ``encodings`` (registry names), ``seeds``, optionally ``randomized``
(encodings also trained on randomized positions, Ruoss et al. 2023), ``tasks`` (synthetic
tasks; one cell per task), ``learning_rates`` (peak rates; one cell per rate, named
``rope-lr3e-3-seed0``; empty: ``optim.learning_rate`` for every cell) and ``model_sizes``
(dicts of ``model.*`` overrides, each with a ``name``: one cell per size, named
``rope-<name>-seed0``; empty: the config's model). A cell is ``{"name": ..., "overrides":
{"model.positional": ..., "seed": ..., ...}}`` (plus ``"labels": {"model_size": name}`` when
sizes are swept: the results rows record it); its run config is the study config with those
dotted-path overrides. Without rates and sizes the cells are exactly those of encoding x seed
(x task), so the workdirs of studies made before these fields existed stay valid.

A cell the study runs is resolved once (`StudyCell.resolve`): a frozen `StudyCell` holding
its name, labels, overrides, its validated `RunConfig` and, once its data is opened, its
identity; everything downstream takes the `StudyCell`, never the overrides again.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flaxformer_lite.base.checks import ConfigError, fail, is_int, is_number
from flaxformer_lite.results.store import learning_rate_tag
from flaxformer_lite.train.run_config import MAX_SEED, RunConfig

if TYPE_CHECKING:  # the runner's pre-flight, kept with its cell
    from flaxformer_lite.train.loop import Preflight

# the fields of config.sweep and what each adds to the cells (`flaxformer-lite study
# --list-fields` shows these lines)
SWEEP_FIELD_DOCS = {
    "encodings": "registry names: one cell per encoding (x seed, x rate, x size)",
    "seeds": "one cell per seed (initialisation and data order)",
    "randomized": "encodings also trained on randomized positions (Ruoss et al. 2023)",
    "tasks": "synthetic task names: one cell per task",
    "learning_rates": "peak rates, one cell per rate; (): optim.learning_rate for every cell",
    "model_sizes": "dicts of model.* overrides with a 'name': one cell per size",
    "models": "pretrained models (dicts of name, source, train_length, optional revision, "
    "random_weights and unavailable): one cell each",
}
SWEEP_FIELDS = tuple(SWEEP_FIELD_DOCS)
# the keys of one entry of sweep.models (pretrained models, `configs/pretrained.py`)
MODEL_FIELDS = ("name", "source", "train_length", "revision", "random_weights", "unavailable")
# A cell name is one directory under STUDY/runs/: a portable file name, nothing that a path
# resolves (no separators, no "." or ".."), not hidden and not an option-like "-x".
CELL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


def _field(sweep: Any, name: str) -> tuple[Any, ...]:
    value = sweep.get(name, ()) if hasattr(sweep, "get") else ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"config.sweep.{name}={value!r}: must be a tuple")
    return tuple(value)


def _learning_rates(sweep: Any) -> list[float]:
    rates = _field(sweep, "learning_rates")
    if not all(is_number(r) and 0 < r < math.inf for r in rates):
        fail("config.sweep.learning_rates", rates, "each rate must be a finite number > 0")
    tags = [learning_rate_tag(r) for r in rates]
    if len(set(tags)) != len(tags):
        fail("config.sweep.learning_rates", rates, "each rate must be given once")
    return [float(r) for r in rates]


def _model_sizes(sweep: Any) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, {"model.<field>": value})]`` of ``sweep.model_sizes``, in order."""
    sizes = _field(sweep, "model_sizes")
    out: list[tuple[str, dict[str, Any]]] = []
    allowed = (
        "each size must be a dict with a 'name' (letters, digits, '.', '_', '+', '=', not "
        "empty, given once) and at least one model field to override other than positional "
        "and randomized_positions (the sweep's encodings set those)"
    )
    for size in sizes:
        size = dict(size.items()) if hasattr(size, "items") else None  # dict or ConfigDict
        name = None if size is None else size.pop("name", None)
        if (
            not isinstance(name, str)
            or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+=]*", name)
            or name in {n for n, _ in out}
            or not size
            or {"positional", "randomized_positions"} & set(size)
        ):
            fail("config.sweep.model_sizes", sizes, allowed)
        out.append((name, {f"model.{k}": v for k, v in size.items()}))
    return out


def _pretrained_models(sweep: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``sweep.models``: pretrained models, each ``{"name", "source", "train_length"
    (its training context in tokens), "revision" (optional), "random_weights" (optional,
    True for models whose weights are random: the report says so), "unavailable" (optional:
    why the model cannot be loaded here, e.g. its package's pip command; the runner refuses
    with it when the model's cells are selected)}`` -> (cell name, overrides, labels)."""
    out = []
    for i, entry in enumerate(_field(sweep, "models")):
        entry = dict(entry.items()) if hasattr(entry, "items") else entry
        if (
            not isinstance(entry, dict)
            or set(entry) - set(MODEL_FIELDS)
            or not ({"name", "source", "train_length"} <= set(entry))
        ):
            fail(
                f"config.sweep.models[{i}]",
                entry,
                f"must be a mapping with keys name, source, train_length (and revision, "
                "random_weights, unavailable); "
                f"allowed keys: {list(MODEL_FIELDS)}",
            )
        overrides = {
            "pretrained.source": entry["source"],
            "pretrained.name": entry["name"],
            "pretrained.revision": entry.get("revision", ""),
            "data.train_length": entry["train_length"],
        }
        random_weights = entry.get("random_weights", False)
        if not isinstance(random_weights, bool):
            fail(f"config.sweep.models[{i}].random_weights", random_weights, "must be a bool")
        unavailable = entry.get("unavailable", "")
        if not isinstance(unavailable, str):
            fail(f"config.sweep.models[{i}].unavailable", unavailable, "must be a str")
        labels = {"random_weights": True} if random_weights else {}
        labels |= {"unavailable": unavailable} if unavailable else {}
        out.append((entry["name"], overrides, labels))
    return out


def expand_sweep(config: Any) -> list[dict[str, Any]]:
    """The cells of the study ``config`` (a ConfigDict or dict with a ``sweep`` section),
    in order: for each model size, for each learning rate, every encoding x seed, then every
    randomized encoding x seed; all of it for each task."""
    sweep = config.get("sweep") if hasattr(config, "get") else None
    if sweep is None:
        raise ConfigError("config has no sweep section: it is not a study config")
    unknown = sorted(set(sweep.keys()) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(
            f"config.sweep has unknown field(s) {unknown}; allowed: {list(SWEEP_FIELDS)}"
        )
    encodings, seeds = _field(sweep, "encodings"), _field(sweep, "seeds")
    pretrained = _pretrained_models(sweep)
    if pretrained:  # one cell per pretrained model (x seed: the same model; seeds=(0,))
        encodings = ("pretrained",)
    if not encodings or not seeds:
        raise ConfigError(
            f"config.sweep: encodings={encodings!r} and seeds={seeds!r} must both be non-empty"
        )
    if not all(is_int(s) and 0 <= s <= MAX_SEED for s in seeds):
        fail("config.sweep.seeds", seeds, f"each seed must be an int in [0, {MAX_SEED}]")
    models = pretrained or [(e, {"model.positional": e}, {}) for e in encodings]
    models += [
        (f"{e}-randomized", {"model.positional": e, "model.randomized_positions": True}, {})
        for e in _field(sweep, "randomized")
    ]
    sizes: list[tuple[str | None, dict[str, Any]]] = [*_model_sizes(sweep)] or [(None, {})]
    rates: list[float | None] = [*_learning_rates(sweep)] or [None]
    cells = []
    for size, size_overrides in sizes:
        for rate in rates:
            setting = [size] if size else []
            setting += [f"lr{learning_rate_tag(rate)}"] if rate is not None else []
            rate_override = {} if rate is None else {"optim.learning_rate": rate}
            for name, overrides, labels in models:
                for seed in seeds:
                    cell = {
                        "name": "-".join([name, *setting, f"seed{seed}"]),
                        "overrides": overrides | size_overrides | rate_override | {"seed": seed},
                    }
                    labels = labels | ({"model_size": size} if size else {})
                    if labels:
                        cell["labels"] = labels
                    cells.append(cell)
    tasks = _field(sweep, "tasks")
    if not tasks:
        return cells
    return [
        c | {"name": f"{task}-{c['name']}", "overrides": c["overrides"] | {"data.task": task}}
        for task in tasks
        for c in cells
    ]


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of ``config`` with dotted-path overrides, e.g. ``{"model.positional": "rope"}``."""
    config = copy.deepcopy(config)
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = config
        for p in parents:
            if p not in node:
                raise ConfigError(f"sweep override {path!r}: config has no field {p!r}")
            node = node[p]
        if leaf not in node:
            raise ConfigError(f"sweep override {path!r}: config has no field {leaf!r}")
        node[leaf] = value
    return config


@dataclasses.dataclass(frozen=True)
class StudyCell:
    """One cell of a study, resolved: what `expand_sweep` said of it (``name``, ``overrides``,
    ``labels``) and the validated run config those overrides make of the study config
    (``run``, built once, by `resolve`). ``ready``: its `train.loop.preflight` (plan, opened
    data, placement) and ``identity``: the run's identity on that data
    (`train.identity.current`), both None until the runner's pre-flight has made them; the
    cell's run reuses them (one pre-flight per cell)."""

    name: str
    overrides: dict[str, Any]
    labels: dict[str, Any]
    run: RunConfig
    ready: Preflight | None = None
    identity: dict[str, Any] | None = None

    @classmethod
    def resolve(cls, config: Any, cell: Mapping[str, Any]) -> StudyCell:
        """The cell ``cell`` (an entry of `expand_sweep`) of the study ``config``: the one
        place a cell's `RunConfig` is built; raises `ConfigError` naming the bad field."""
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        return cls(
            name=cell["name"],
            overrides=dict(cell["overrides"]),
            labels=dict(cell.get("labels") or {}),
            run=run,
        )

    def checked(self, ready: Preflight, record: dict[str, Any]) -> StudyCell:
        """This cell with its pre-flight and its identity record (`train.identity.current`)."""
        return dataclasses.replace(self, ready=ready, identity=record)


def select_cells(sweep: list[dict], only: Sequence[str]) -> list[dict]:
    """Cells whose name, encoding (``model.positional``), pretrained model (its name), task,
    model size or learning rate (``lr3e-3``) is in ``only`` (all if empty)."""
    if not only:
        return sweep

    def tags(cell: dict) -> set[str]:
        o = cell["overrides"]
        rate = o.get("optim.learning_rate")
        return {
            cell["name"],
            o.get("model.positional"),
            o.get("pretrained.name"),
            o.get("data.task"),
            cell.get("labels", {}).get("model_size"),
            None if rate is None else f"lr{learning_rate_tag(rate)}",
        } - {None}

    known = set().union(*(tags(c) for c in sweep))
    unknown = sorted(set(only) - known)
    if unknown:
        raise ConfigError(
            f"--only={','.join(only)}: {unknown} not in this sweep; known: {sorted(known)}"
        )
    return [c for c in sweep if tags(c) & set(only)]


def check_overrides(sweep: list[dict], overrides: Iterable[tuple[str, Any]]) -> None:
    """Refuse a command-line override (``("config.model.positional", "rope")``) of a field
    the sweep sets for every cell: it would be silently replaced in every cell. On a study
    of pretrained models (``sweep.models``) the hint names the study command's ``--model``."""
    swept = {path for cell in sweep for path in cell["overrides"]}
    for name, value in overrides:
        if name.removeprefix("config.") in swept and "pretrained.source" in swept:
            raise ConfigError(
                f"--{name}={value}: set for every model by the study's sweep.models; give your "
                "own models with --model=DIR_OR_HUB_ID_OR_GGUF (repeatable; it replaces the "
                "preset's models; --model=DIR:LENGTH sets the training context), e.g. "
                "--model=path/to/model"
            )
        if name.removeprefix("config.") in swept:
            raise ConfigError(
                f"--{name}={value}: set for every cell by the study's sweep; select cells "
                "with --only (e.g. --only=rope) or change config.sweep"
            )


def check_cell_names(sweep: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a cell name that is not one plain directory name under ``STUDY/runs/``
    (`CELL_NAME`: ``..``, ``/``, ``\\``, spaces or other characters a path would interpret)
    and two cells of one name (they would share a directory)."""
    seen: set[str] = set()
    for cell in sweep:
        name = cell.get("name") if isinstance(cell, Mapping) else None
        if not isinstance(name, str) or not CELL_NAME.fullmatch(name) or ".." in name:
            fail(
                "sweep cell name",
                name,
                "must be a plain directory name under STUDY/runs/: 1-200 of A-Z a-z 0-9 . _ + "
                "= -, starting with a letter or digit, without '..' (no path separators)",
            )
        if name in seen:
            fail("sweep cell name", name, "is given twice; each cell needs its own name")
        seen.add(name)


def parse_shard(value: Any) -> tuple[int, int]:
    """``"I/N"`` (or ``(I, N)``) as ``(I, N)``: shard I (0-based, 0 <= I < N) of N; a
    `ConfigError` naming ``--shard``, the value and what is allowed otherwise."""
    if isinstance(value, tuple | list) and len(value) == 2:
        text = f"{value[0]}/{value[1]}"
    else:
        text = str(value)
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        fail("--shard", text, "must be I/N with integers 0 <= I < N (0-based), e.g. --shard=0/4")
    i, n = int(match.group(1)), int(match.group(2))
    if n < 1 or not 0 <= i < n:
        fail("--shard", text, "must be I/N with integers N >= 1 and 0 <= I < N (0-based)")
    return i, n


# Relative cost of one evaluation token against one training token (a forward pass only).
EVAL_TOKEN_COST = 1 / 3
# An evaluation with max_bytes=0 (the whole split): tokens assumed per length and protocol.
WHOLE_SPLIT_TOKENS = 2**20


def cell_cost(config: Any, cell: Mapping[str, Any]) -> float:
    """An estimate of the cell's compute, for balancing shards (`shard_cells`); units are
    arbitrary, only ratios between cells matter. Training: ``train.num_steps x data.batch_size
    x data.train_length`` tokens, each weighted by ``1 + L / d_model`` (attention grows with
    the length L). Evaluation: per protocol and evaluation length ``l = L x m``,
    ``eval.max_bytes`` tokens (`WHOLE_SPLIT_TOKENS` when 0: the whole split) weighted by
    ``(1 + l / d_model) x EVAL_TOKEN_COST``. A task study evaluates ``eval.num_examples x l``
    tokens per length instead. Cells of one preset differ only in encoding, seed and task, so
    their costs are equal and the shards differ by at most one cell; the model matters for
    sweeps whose cells override sizes or steps."""
    c = apply_overrides(config, cell.get("overrides", {}))

    def get(section: str, field: str, default: Any) -> Any:
        node = c.get(section) if hasattr(c, "get") else None
        value = node.get(field, default) if hasattr(node, "get") else default
        return value if isinstance(value, int | float) and not isinstance(value, bool) else default

    length = get("data", "train_length", 1)
    width = max(get("model", "d_model", 1), 1)
    train = get("train", "num_steps", 0) * get("data", "batch_size", 1) * length
    cost = train * (1 + length / width)
    evals = c.get("eval") if hasattr(c, "get") else None
    multiples = tuple(evals.get("length_multiples", ())) if hasattr(evals, "get") else ()
    protocols = tuple(evals.get("protocols", ("nonoverlapping",))) if hasattr(evals, "get") else ()
    task = c.get("data", {}).get("task", "") if hasattr(c.get("data", {}), "get") else ""
    for m in multiples:
        ev_length = length * m if isinstance(m, int | float) else length
        if task:
            tokens = get("eval", "num_examples", 1) * ev_length
        else:
            tokens = get("eval", "max_bytes", 0) or WHOLE_SPLIT_TOKENS
        cost += max(len(protocols), 1) * tokens * (1 + ev_length / width) * EVAL_TOKEN_COST
    return float(cost)


def shard_cells(
    cells: Sequence[Mapping[str, Any]], shard: tuple[int, int], config: Any = None
) -> list[Any]:
    """Shard ``I`` of ``N`` of ``cells`` (``shard=(I, N)``, 0-based), in sweep order.

    Greedy longest-processing-time assignment on `cell_cost` (equal costs without ``config``):
    cells in order of decreasing cost (ties: sweep order) each go to the shard with the least
    cost so far (ties: the lowest index). Deterministic, the N shards are disjoint and cover
    every cell; with equal costs cell k goes to shard k mod N. Raises `ConfigError` if
    N exceeds the number of cells (a shard would have nothing to run)."""
    i, n = parse_shard(shard)
    if n > len(cells):
        fail(
            "--shard",
            f"{i}/{n}",
            f"N must be at most the number of selected cells ({len(cells)}): a shard would "
            "have nothing to run",
        )
    costs = [cell_cost(config, c) if config is not None else 1.0 for c in cells]
    loads, owner = [0.0] * n, [0] * len(cells)
    for k in sorted(range(len(cells)), key=lambda k: (-costs[k], k)):
        owner[k] = min(range(n), key=lambda s: (loads[s], s))
        loads[owner[k]] += costs[k]
    return [c for k, c in enumerate(cells) if owner[k] == i]
