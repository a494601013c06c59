"""The cost of each encoding, from each run's own clock: training milliseconds per step
(``train_seconds / train_steps``) and evaluation tokens per second (the tokens passed through
the model in all of a run's evaluations over ``eval_seconds``), for every report whose rows
record run times. Wall-clock figures are not results (a rerun differs): the table is in
``REPORT.md`` only, not in ``tables/``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from flaxformer_lite.report.study_tables import encoding_order, group_by, is_base, number
from flaxformer_lite.report.table import MISSING_MD, Cell, Column, Table

CSV_FIELDS = (
    "study",
    "model_size",
    "encoding",
    "runs",
    "train_ms_per_step",
    "eval_tokens_per_second",
    "eval_examples_per_second",
)
CAPTION = (
    "Cost per encoding, from each run's own clock, mean over its runs (min–max where "
    "several). Training: train_seconds / train_steps, the wall time of the optimizer steps "
    "the run's last call trained (the step's compilation and checkpoint writes included). "
    "Evaluation: tokens read by the model in all of the run's evaluations (every length, "
    "protocol and evaluation-time variant; a context-protocol window counts its c + S − 1 "
    "tokens, a sliding window its full length) per second of eval_seconds (compilations "
    "included){tasks}. × cheapest: the mean over the cheapest encoding's (1.00 = the "
    "cheapest). These are wall-clock figures: they depend on the machine, its backend and "
    "whatever else ran on it at the time (the runs table has each run's seconds); compare "
    "encodings within one study run on one machine only. {missing}: not recorded (rows "
    "written before train_steps was recorded, or no evaluation that reads tokens)."
)


def forward_tokens(row: Mapping[str, Any]) -> float | None:
    """Tokens the model read for one evaluated cell (a bits-per-byte row): non-overlapping,
    its scored tokens; sliding windows, about ``tokens x length / stride``; the context
    protocol, ``tokens / S`` windows of ``c + S - 1`` tokens. None when not recorded."""
    tokens = number(row.get("tokens"))
    if tokens is None or row.get("na") is not None:
        return None
    protocol = row.get("protocol")
    if protocol == "nonoverlapping":
        return tokens
    if protocol == "sliding":
        stride = number(row.get("stride"))
        return tokens * row["eval_length"] / stride if stride else None
    if protocol == "context":
        block = number(row.get("context_block"))
        return tokens / block * (row["eval_length"] + block - 1) if block else None
    return None


@dataclasses.dataclass
class _Run:
    """One run's times and evaluated amounts, from its rows."""

    setting: tuple[Any, ...]  # (study, model_size)
    label: str  # the encoding it trained: the label of its first base-variant row
    train_seconds: float | None = None
    train_steps: float | None = None
    eval_seconds: float | None = None
    tokens: float = 0.0
    examples: float = 0.0
    missing_tokens: bool = False


def _cost_runs(rows: Sequence[Mapping[str, Any]]) -> list[_Run]:
    runs: dict[tuple[Any, ...], _Run] = {}
    labelled: set[tuple[Any, ...]] = set()
    for r in rows:
        key = tuple(str(r.get(k)) for k in ("study", "run", "seed", "config_hash", "command"))
        run = runs.setdefault(key, _Run((r.get("study"), r.get("model_size")), r["encoding"]))
        if key not in labelled and is_base(r):  # a randomized-positions run: its base label
            run.label = r["encoding"]
            if not r.get("randomized_positions"):
                labelled.add(key)
        for field in ("train_seconds", "train_steps", "eval_seconds"):
            value = number(r.get(field))
            if value is not None:
                setattr(run, field, max(getattr(run, field) or 0.0, value))
        if r["metric"] == "bits_per_byte" and r.get("na") is None:
            tokens = forward_tokens(r)
            run.missing_tokens |= tokens is None
            run.tokens += tokens or 0.0
        elif r["metric"] == "exact_match" and r.get("na") is None:
            run.examples += number(r.get("examples")) or 0.0
    return list(runs.values())


def _summary(values: Sequence[float], digits: int, thousands: bool = False) -> str:
    if not values:
        return MISSING_MD

    def fmt(x: float) -> str:
        return f"{x:,.0f}" if thousands else f"{x:.{digits}f}"

    mean = _mean(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt(mean)
    return f"{fmt(mean)} ({fmt(min(values))}–{fmt(max(values))})"


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclasses.dataclass(frozen=True)
class _Group:
    """One encoding of one (study, model size): its runs' per-step times and speeds."""

    key: tuple[Any, ...]  # (study, model size, label)
    runs: int
    per_step: list[float]  # training ms per step
    speed: list[float]  # evaluation tokens per second
    per_example: list[float]  # evaluation examples per second


def _groups(runs: Sequence[_Run], rows: Sequence[Mapping[str, Any]]) -> list[_Group]:
    """The encodings of each setting, settings in order of first appearance (a sweep lists
    sizes smallest first), encodings in the study's order."""
    order = {e: i for i, e in enumerate(encoding_order(rows))}
    by_key = group_by(runs, lambda run: (*run.setting, run.label))
    first = {v: i for i, v in enumerate(dict.fromkeys(run.setting for run in runs))}
    keys = sorted(by_key, key=lambda k: (first[k[:2]], order.get(k[2], len(order)), str(k[2])))
    return [
        _Group(
            key,
            len(by_key[key]),
            [
                1000.0 * r.train_seconds / r.train_steps
                for r in by_key[key]
                if r.train_seconds and r.train_steps
            ],
            [
                r.tokens / r.eval_seconds
                for r in by_key[key]
                if r.eval_seconds and r.tokens > 0 and not r.missing_tokens
            ],
            [r.examples / r.eval_seconds for r in by_key[key] if r.eval_seconds and r.examples > 0],
        )
        for key in keys
    ]


def _cheapest(groups: Sequence[_Group], group: _Group, field: str, low: bool) -> float | None:
    """The setting's cheapest mean (lowest ms/step, highest tokens/s) among its encodings."""
    means = [_mean(getattr(g, field)) for g in groups if g.key[:2] == group.key[:2]]
    means = [m for m in means if m is not None]
    return (min(means) if low else max(means)) if means else None


def _cost_row(groups, g: _Group, labels: Sequence[bool], lm: bool, tasks: bool) -> list[Cell]:
    study, size, label = g.key
    line = [Cell(str(x)) for x, shown in zip((study, size), labels, strict=True) if shown]
    line += [Cell(label), Cell(str(g.runs)), Cell(_summary(g.per_step, 1))]
    step, base = _mean(g.per_step), _cheapest(groups, g, "per_step", low=True)
    line.append(Cell(f"{step / base:.2f}" if step and base else MISSING_MD))
    if lm:
        tokens, top = _mean(g.speed), _cheapest(groups, g, "speed", low=False)
        line.append(Cell(_summary(g.speed, 0, thousands=True)))
        line.append(Cell(f"{top / tokens:.2f}" if tokens and top else MISSING_MD))
    if tasks:
        line.append(Cell(_summary(g.per_example, 0, thousands=True)))
    return line


def cost_tables(rows: Sequence[Mapping[str, Any]]) -> list[Table]:
    """The cost-per-encoding table (one, grouped by study and model size where several), or
    none when no row records a run time."""
    if not any(
        number(r.get(k)) is not None for r in rows for k in ("train_seconds", "eval_seconds")
    ):
        return []
    runs = _cost_runs(rows)
    groups = _groups(runs, rows)
    labels = (len({g.key[0] for g in groups}) > 1, any(g.key[1] is not None for g in groups))
    lm = any(run.tokens > 0 or run.missing_tokens for run in runs)
    tasks = any(run.examples > 0 for run in runs)
    header = [h for h, shown in zip(("study", "model size"), labels, strict=True) if shown]
    columns = [Column(h, "l") for h in (*header, "encoding")]
    numbers = ["runs", "training ms/step", "× cheapest"]
    numbers += ["evaluation tokens/s", "× cheapest"] if lm else []
    numbers += ["evaluation examples/s"] if tasks else []
    records = [
        (*g.key, g.runs, _mean(g.per_step), _mean(g.speed), _mean(g.per_example)) for g in groups
    ]
    return [
        Table(
            name="cost",
            title="Cost per encoding",
            caption=CAPTION.format(
                tasks="; for tasks, examples per second" if tasks else "", missing=MISSING_MD
            ),
            columns=(*columns, *map(Column, numbers)),
            rows=tuple(tuple(_cost_row(groups, g, labels, lm, tasks)) for g in groups),
            csv_fields=CSV_FIELDS,
            csv_rows=tuple(records),
            files=False,
        )
    ]
