"""Report sections for sweeps beyond encoding x seed: learning rate and model size.

* **Learning rate** (the rows' ``learning_rate``, several per encoding: the ``lr`` preset).
  `select_rates` picks each encoding's best peak rate on the evaluation split at 1x
  (bits per byte of non-overlapping windows of L bytes; exact match for a task), one choice
  per trained model (study, task, L, model size, encoding); `rows_at_best_rates` keeps the
  chosen runs for the study tables; `learning_rate_table` shows every rate; `ranking_note`
  says whether the ranking of the encodings at each length differs from the ranking with one
  common rate for all.

  Selection bias: the rate is chosen on the data the tables then report, so the chosen cells
  are optimistic. An unbiased figure evaluates the chosen cells on the test split, without
  training again: copy the study directory and run the same study on the copy with
  ``--config.eval.split=test --restart_changed --only=<the chosen cells>``: only ``eval.*``
  differs, so every cell keeps its training (`runner.run_study`) and the chosen ones are
  evaluated on the test split; the copy's report tabulates them (one rate per encoding).
* **Model size** (the rows' ``model_size`` and ``num_params``: the ``scaling`` preset).
  `gap_tables` and `gap_panels`: bits per byte at 4x and 16x minus at 1x, per encoding and
  size, for the non-overlapping and context protocols; each run's gap is taken within the run
  (same model, same data), then mean and Student-t interval over seeds (`stats.mean_ci`).

Both make `table.Table` s, embedded in ``REPORT.md`` and written as
``tables/<name>.{md,tex,csv}`` beside the study tables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flaxformer_lite.report.study_tables import (
    CONFIDENCE,
    encoding_order,
    group_by,
    is_base,
    number,
)
from flaxformer_lite.report.table import (
    MISSING_MD,
    NOT_APPLICABLE,
    Cell,
    Column,
    Table,
)
from flaxformer_lite.results.comparable import table_group
from flaxformer_lite.results.stats import mean_ci
from flaxformer_lite.results.store import learning_rate_tag

# What picks the learning rate: (metric, protocol, which is better), the first present.
SELECTION = (("bits_per_byte", "nonoverlapping", "lower"), ("exact_match", "task", "higher"))
GAP_MULTIPLES = (4, 16)  # the extrapolation gap: bits per byte at these x L minus at 1 x L
GAP_PROTOCOLS = ("nonoverlapping", "context")


# ----------------------------------------------------------------------------- helpers


def _multiple(row: Mapping[str, Any]) -> float | None:
    length, train = number(row.get("eval_length")), number(row.get("train_length"))
    return length / train if length and train else None


def _kind(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """One trained model in a setting (`comparable.table_group`: what one set of comparable
    runs shares) and the encoding the run trained."""
    trained = row.get("positional") or row["encoding"]
    return (*table_group(row), trained, bool(row.get("randomized_positions")))


def _describe_setting(setting: tuple[Any, ...], varying: Sequence[int]) -> str:
    names = ("study ", "task ", "L = ", "model ")
    return ", ".join(f"{names[i]}{setting[i]}" for i in varying)


def _varying(settings: Iterable[tuple[Any, ...]]) -> list[int]:
    settings = list(dict.fromkeys(settings))
    return [i for i in range(4) if len({s[i] for s in settings}) > 1]


def _fmt_rate(rate: float) -> str:
    return learning_rate_tag(rate)


# ----------------------------------------------------------------------------- learning rate


@dataclasses.dataclass(frozen=True)
class RateChoice:
    """The peak learning rates of one trained model (`_kind`) and the best of them.

    ``scores``: ``(rate, mean, half_width, n)`` per rate, in increasing rate (mean over the
    seeds of ``metric`` at 1x, ``protocol``); ``best``: the rate with the best finite mean
    (ties: the lower rate), or the lowest rate when none is finite (every run diverged)."""

    kind: tuple[Any, ...]
    label: str
    metric: str
    protocol: str
    better: str
    split: str | None
    scores: tuple[tuple[float, float, float | None, int], ...]
    best: float

    @property
    def setting(self) -> tuple[Any, ...]:
        return self.kind[:4]


def select_rates(rows: Sequence[Mapping[str, Any]]) -> list[RateChoice]:
    """One `RateChoice` per trained model with two or more learning rates in ``rows``, in
    the order of the encodings (`tables.encoding_order`); none when no model has several."""
    rates: dict[tuple[Any, ...], set[float]] = {}
    for r in rows:
        rate = number(r.get("learning_rate"))
        if rate is not None:
            rates.setdefault(_kind(r), set()).add(rate)
    swept = {k for k, v in rates.items() if len(v) > 1}
    if not swept:
        return []
    choices = []
    for metric, protocol, better in SELECTION:
        picked = [
            r
            for r in rows
            if _kind(r) in swept
            and r["metric"] == metric
            and r.get("protocol") == protocol
            and is_base(r)
            and _multiple(r) == 1
            and number(r.get("learning_rate")) is not None
        ]
        for kind, rs in group_by(picked, _kind).items():
            swept.discard(kind)
            scores = []
            for rate in sorted(rates[kind]):
                values = [
                    float(r["value"])
                    for r in rs
                    if number(r.get("learning_rate")) == rate and number(r["value"]) is not None
                ]
                if values:
                    scores.append((rate, *mean_ci(values, confidence=CONFIDENCE)))
            finite = [s for s in scores if math.isfinite(s[1])]
            sign = 1.0 if better == "lower" else -1.0
            best = min(finite, key=lambda s: (sign * s[1], s[0]))[0] if finite else min(rates[kind])
            splits = sorted({str(r.get("split")) for r in rs if r.get("split")})
            choices.append(
                RateChoice(
                    kind=kind,
                    label=rs[0]["encoding"],
                    metric=metric,
                    protocol=protocol,
                    better=better,
                    split=", ".join(splits) or None,
                    scores=tuple(scores),
                    best=best,
                )
            )
    order = {e: i for i, e in enumerate(encoding_order(rows))}
    return sorted(choices, key=lambda c: (repr(c.setting), order.get(c.label, len(order))))


def rows_at_best_rates(
    rows: Sequence[Mapping[str, Any]], choices: Sequence[RateChoice]
) -> list[Mapping[str, Any]]:
    """``rows`` without the runs of a rate that is not its model's best (`select_rates`);
    rows of models with one rate, or without a recorded rate, are all kept. With choices,
    the rows are in the encodings' order of all ``rows`` (`tables.encoding_order`), so the
    tables list the encodings as the full study does."""
    if not choices:
        return list(rows)
    best = {c.kind: c.best for c in choices}
    kept = [
        r
        for r in rows
        if _kind(r) not in best
        or number(r.get("learning_rate")) is None
        or number(r.get("learning_rate")) == best[_kind(r)]
    ]
    order = {e: i for i, e in enumerate(encoding_order(rows))}
    return sorted(kept, key=lambda r: order[r["encoding"]])


def best_rate_note(choices: Sequence[RateChoice], setting: tuple[Any, ...]) -> str:
    """The caption sentence of a study table of ``setting``: which rate each encoding has."""
    chosen = [c for c in choices if c.setting == setting]
    if not chosen:
        return ""
    listed = ", ".join(f"{c.label} {_fmt_rate(c.best)}" for c in chosen)
    split = chosen[0].split or "evaluation"
    return (
        f"Each encoding at its best peak learning rate, chosen on the {split} split at 1× "
        f"(table learning_rate; optimistic by the selection): {listed}."
    )


def common_rate_of(choices: Sequence[RateChoice], common_rate: float | None) -> float | None:
    """``common_rate`` when every choice has it; else the middle rate of the grid (the lower
    of the two middle ones) when all choices share one grid; else None."""
    grids = {tuple(s[0] for s in c.scores) for c in choices}
    if common_rate is not None and all(common_rate in g for g in grids):
        return float(common_rate)
    if len(grids) == 1:
        (grid,) = grids
        return grid[(len(grid) - 1) // 2] if grid else None
    return None


LR_CSV_FIELDS = (
    "study",
    "task",
    "train_length",
    "model_size",
    "encoding",
    "learning_rate",
    "mean",
    "ci_half_width",
    "n",
    "best",
)


def learning_rate_table(
    choices: Sequence[RateChoice], rows: Sequence[Mapping[str, Any]], common_rate: float | None
) -> Table:
    """Every rate of every encoding at 1x (``choices``), the best bold, and the ranking note."""
    rates = sorted({s[0] for c in choices for s in c.scores})
    varying = _varying(c.setting for c in choices)
    where = [Column("setting", "l")] if varying else []
    columns = (*where, Column("encoding", "l"), *(Column(f"lr {_fmt_rate(r)}") for r in rates))
    body, records = [], []
    for c in choices:
        scores = {s[0]: s for s in c.scores}
        cells = [Cell(_describe_setting(c.setting, varying))] if varying else []
        cells.append(Cell(c.label))
        for rate in rates:
            s = scores.get(rate)
            best = "best" if rate == c.best else None
            cells.append(Cell() if s is None else Cell(s[1], s[2], mark=best))
            numbers = (None, None, 0) if s is None else s[1:]
            records.append((*c.setting, c.label, rate, *numbers, rate == c.best))
        body.append((*cells, Cell(_fmt_rate(c.best))))
    metric = "bits per byte" if choices[0].metric == "bits_per_byte" else "exact match"
    return Table(
        name="learning_rate",
        title=f"{metric.capitalize()} at 1× by learning rate",
        caption=_rate_caption(choices, len(rates), metric),
        columns=(*columns, Column("best")),
        rows=tuple(body),
        csv_fields=LR_CSV_FIELDS,
        csv_rows=tuple(records),
        note=ranking_note(rows, choices, common_rate),
    )


def _rate_caption(choices: Sequence[RateChoice], rates: int, metric: str) -> str:
    what = (
        "non-overlapping windows of L bytes"
        if choices[0].protocol == "nonoverlapping"
        else "task length L"
    )
    ns = sorted({s[3] for c in choices for s in c.scores})
    stat = (
        "one seed (no interval)"
        if ns == [1]
        else f"mean over seeds ± {CONFIDENCE:.0%} Student-t CI (n = {'–'.join(map(str, ns))})"
    )
    split = choices[0].split or "evaluation"
    return (
        f"{metric.capitalize()} at 1× ({what}; {split} split) by peak learning rate, {stat}; "
        f"{choices[0].better} is better. Bold: each encoding's best rate, the runs its rows in "
        "the study tables come from. Selection bias: the rate is chosen on the same "
        f"{split} data the study tables report, so the chosen cells are optimistic (the best "
        f"of {rates} rates); an unbiased figure evaluates the chosen cells on the test "
        "split (a copy of the study rerun with --config.eval.split=test --restart_changed "
        "--only=<the chosen cells> keeps their training). "
        f"{MISSING_MD}: no finished run (e.g. a diverged loss: see the cell's error.txt)."
    )


def _ranking(means: Mapping[str, float], better: str) -> list[str]:
    sign = 1.0 if better == "lower" else -1.0
    return sorted(
        means, key=lambda e: (sign * means[e] if math.isfinite(means[e]) else math.inf, e)
    )


def ranking_note(
    rows: Sequence[Mapping[str, Any]], choices: Sequence[RateChoice], common_rate: float | None
) -> str:
    """One line: does the ranking of the encodings (mean over seeds, at each protocol and
    length) at each encoding's best rate differ from the ranking with all at one common rate
    (``common_rate``, or the grid's middle rate: `common_rate_of`)?"""
    common = common_rate_of(choices, common_rate)
    if common is None:
        return "No ranking comparison: the encodings do not share a grid of learning rates."
    best = {c.kind: c.best for c in choices}
    metric, better = choices[0].metric, choices[0].better
    varying = _varying(c.setting for c in choices)
    at: dict[str, dict[tuple[Any, ...], dict[str, list[float]]]] = {"best": {}, "common": {}}
    for r in rows:
        kind = _kind(r)
        rate, value = number(r.get("learning_rate")), number(r.get("value"))
        if kind not in best or r["metric"] != metric or value is None or r.get("na") is not None:
            continue
        column = (table_group(r), r.get("protocol"), _multiple(r) or r["eval_length"])
        for which, wanted in (("best", best[kind]), ("common", common)):
            if rate == wanted:
                at[which].setdefault(column, {}).setdefault(r["encoding"], []).append(value)
    same: dict[str, list[str]] = {}  # "setting protocol" -> the multiples ranked the same
    differ = []
    for column in sorted(at["best"], key=lambda k: (repr(k[0]), str(k[1]), k[2])):
        setting, protocol, multiple = column
        means = {}
        for which in ("best", "common"):
            values = at[which].get(column, {})
            means[which] = {e: math.fsum(v) / len(v) for e, v in values.items()}
        shared = set(means["best"]) & set(means["common"])
        if len(shared) < 2:
            continue
        where = _describe_setting(setting, varying)
        name = f"{where + ' ' if where else ''}{protocol}"
        a = _ranking({e: means["best"][e] for e in shared}, better)
        b = _ranking({e: means["common"][e] for e in shared}, better)
        if a == b:
            same.setdefault(name, []).append(f"{multiple:g}×")
        else:
            sign = " < " if better == "lower" else " > "
            differ.append(
                f"{name} {multiple:g}× (best rates: {sign.join(a)}; "
                f"{_fmt_rate(common)}: {sign.join(b)})"
            )
    head = (
        f"Ranking of the encodings (mean {metric.replace('_', ' ')} over seeds) at each "
        f"encoding's best rate vs all at the common rate {_fmt_rate(common)}: "
    )
    if not same and not differ:
        return head + "not comparable (fewer than two encodings measured at both)."
    parts = []
    if same:
        parts.append("the same at " + "; ".join(f"{k} {', '.join(v)}" for k, v in same.items()))
    if differ:
        parts.append("differs at " + "; ".join(differ))
    return head + "; ".join(parts) + "."


# ----------------------------------------------------------------------------- model size


def _format_params(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


@dataclasses.dataclass(frozen=True)
class Gap:
    """The gap of one encoding and size at ``multiple`` x L: mean, half width, n seeds, the
    encoding's parameters; or ``na`` (why it cannot be measured)."""

    mean: float | None
    half_width: float | None
    n: int
    params: float | None
    na: str | None = None


def extrapolation_gaps(
    rows: Sequence[Mapping[str, Any]],
) -> dict[tuple[Any, ...], dict[tuple[Any, ...], Gap]]:
    """``{(study, task, train_length): {(protocol, multiple, encoding, model_size): Gap}}``
    from the bits-per-byte rows of studies with two or more model sizes; each run's gap is
    its value at ``multiple`` x L minus its value at 1 x L (same run, label and protocol)."""
    by_run: dict[tuple[Any, ...], dict[float, Mapping[str, Any]]] = {}
    for r in rows:
        if r["metric"] != "bits_per_byte" or r.get("protocol") not in GAP_PROTOCOLS:
            continue
        key = (*table_group(r)[:3], r.get("protocol"), r["encoding"], r.get("model_size"))
        key += (r.get("run"), r.get("seed"))
        by_run.setdefault(key, {})[_multiple(r)] = r
    sizes: dict[tuple[Any, ...], set[Any]] = {}
    for key in by_run:
        sizes.setdefault(key[:3], set()).add(key[5])
    out: dict[tuple[Any, ...], dict[tuple[Any, ...], Gap]] = {}
    collected: dict[tuple[Any, ...], dict[tuple[Any, ...], list]] = {}
    for key, at in by_run.items():
        group, protocol, encoding, size = key[:3], key[3], key[4], key[5]
        if len(sizes[group] - {None}) < 2 or 1 not in at:
            continue
        for m in GAP_MULTIPLES:
            if m not in at:
                continue
            base, far = at[1], at[m]
            params = number(far.get("num_params"))
            entry = collected.setdefault(group, {}).setdefault(
                (protocol, m, encoding, size), [[], [], params]
            )
            if base.get("na") is not None or far.get("na") is not None:
                entry[1].append(str(far.get("na") or base.get("na")))
            elif number(base["value"]) is not None and number(far["value"]) is not None:
                entry[0].append(float(far["value"]) - float(base["value"]))
    for group, cells in collected.items():
        for cell, (gaps, reasons, params) in cells.items():
            if gaps:
                mean, half, n = mean_ci(gaps, confidence=CONFIDENCE)
                out.setdefault(group, {})[cell] = Gap(mean, half, n, params)
            elif reasons:
                out.setdefault(group, {})[cell] = Gap(None, None, 0, params, na=reasons[0])
    return out


def _size_order(cells: Mapping[tuple[Any, ...], Gap]) -> list[tuple[Any, float | None]]:
    """The model sizes of a group with their smallest parameter count, smallest first."""
    params: dict[Any, list[float]] = {}
    for (_, _, _, size), gap in cells.items():
        params.setdefault(size, [])
        if gap.params is not None:
            params[size].append(gap.params)
    listed = [(size, min(p) if p else None) for size, p in params.items()]
    return sorted(listed, key=lambda s: (s[1] is None, s[1] or 0.0, str(s[0])))


GAP_CSV_FIELDS = (
    "study",
    "task",
    "train_length",
    "protocol",
    "multiple",
    "encoding",
    "model_size",
    "num_params",
    "mean",
    "ci_half_width",
    "n",
    "note",
)


def gap_tables(rows: Sequence[Mapping[str, Any]]) -> list[Table]:
    """The extrapolation-gap table of each study with two or more model sizes."""
    groups = extrapolation_gaps(rows)
    varying = _varying((*g, None) for g in groups)
    tables = []
    for index, (group, cells) in enumerate(groups.items()):
        sizes = _size_order(cells)
        labels = [f"{s} ({_format_params(p)})" if p else str(s) for s, p in sizes]
        body, records = _gap_rows(group, cells, sizes, encoding_order(rows))
        where = _describe_setting((*group, None), varying)
        tables.append(
            Table(
                name="extrapolation_gap" + ("" if len(groups) == 1 else f"-{index + 1}"),
                title="Extrapolation gap vs model size" + (f" — {where}" if where else ""),
                caption=_gap_caption(cells),
                columns=(
                    *(Column(h, "l") for h in ("protocol", "gap", "encoding")),
                    *map(Column, labels),
                ),
                rows=body,
                csv_fields=GAP_CSV_FIELDS,
                csv_rows=records,
            )
        )
    return tables


def _gap_rows(group, cells, sizes, order) -> tuple[tuple, tuple]:
    """The display rows (protocol, multiple, encoding, a gap per size) and the CSV records."""
    body, records = [], []
    keys = {(p, m, e) for p, m, e, _ in cells}
    for protocol in GAP_PROTOCOLS:
        for m in GAP_MULTIPLES:
            for encoding in [e for e in order if (protocol, m, e) in keys]:
                line = [Cell(protocol), Cell(f"{m}× − 1×"), Cell(encoding)]
                for size, _ in sizes:
                    gap = cells.get((protocol, m, encoding, size))
                    if gap is None:
                        line.append(Cell())
                        continue
                    na = gap.na is not None
                    line.append(Cell(NOT_APPLICABLE) if na else Cell(gap.mean, gap.half_width))
                    note = f"{NOT_APPLICABLE}: {gap.na}" if gap.na else ""
                    numbers = (gap.params, gap.mean, gap.half_width, gap.n, note)
                    records.append((*group, protocol, m, encoding, size, *numbers))
                body.append(tuple(line))
    return tuple(body), tuple(records)


def _gap_caption(cells: Mapping[tuple[Any, ...], Gap]) -> str:
    ns = sorted({g.n for g in cells.values() if g.na is None}) or [0]
    stat = (
        "one seed per cell (no interval)"
        if ns == [1]
        else f"mean ± {CONFIDENCE:.0%} Student-t CI across seeds (n = "
        f"{'–'.join(map(str, ns))}; with 2 seeds the interval is wide: t = 12.7)"
    )
    reasons = sorted({g.na for g in cells.values() if g.na})
    return (
        "Extrapolation gap: bits per byte at m × L minus at 1 × L (lower is better), per "
        "encoding (rows) and model size (columns, with its parameters; a learned table adds "
        "L × d_model). Non-overlapping: windows of m·L bytes, positions beyond training; "
        "context: the same target bytes with c = m·L bytes of context (negative: the extra "
        f"context helped). Each run's gap is taken within the run, then {stat}."
        + (f" {NOT_APPLICABLE}: {'; '.join(reasons)}." if reasons else "")
        + f" {MISSING_MD}: not measured."
    )


def gap_panels(
    rows: Sequence[Mapping[str, Any]],
) -> list[tuple[tuple[Any, ...], dict[str, dict[str, list[tuple[float, float, float | None]]]]]]:
    """Per study with several sizes: ``{panel title: {encoding: [(parameters, mean gap,
    half width)]}}`` (one panel per protocol and multiple, points by parameters), for
    `plots.plot_vs_params`."""
    order = encoding_order(rows)
    out = []
    for group, cells in extrapolation_gaps(rows).items():
        panels: dict[str, dict[str, list[tuple[float, float, float | None]]]] = {}
        for protocol in GAP_PROTOCOLS:
            for m in GAP_MULTIPLES:
                series = {}
                for encoding in order:
                    points = [
                        (g.params, g.mean, g.half_width)
                        for (p, mm, e, _), g in cells.items()
                        if (p, mm, e) == (protocol, m, encoding)
                        and g.na is None  # then it has a mean
                        and g.params is not None
                    ]
                    if points:
                        series[encoding] = sorted(points)
                if series:
                    panels[f"{protocol}: {m}× L − 1× L"] = series
        if panels:
            out.append((group, panels))
    return out
