"""The report's figures, from the study tables and rows: each saved as PNG and PDF under
``plots/`` (`plots`), with the heading and caption REPORT.md shows (`PlotInfo`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flaxformer_lite.report import plots, sweep_report
from flaxformer_lite.report.study_tables import (
    CONFIDENCE,
    INTERVAL_NAMES,
    StudyResults,
    encoding_order,
    group_by,
    group_key,
    table_names,
)


@dataclasses.dataclass(frozen=True)
class PlotInfo:
    """A saved figure: file stem relative to the report dir, heading and caption."""

    stem: str
    title: str
    caption: str


def _series(table: StudyResults) -> dict[str, list[plots.Point]]:
    """Each encoding's measured cells as points ``(eval_length, mean, half_width)``."""
    out = {}
    for e in table.encodings:
        cells = [(c.eval_length, table.cell(e, c)) for c in table.columns]
        out[e] = [(n, x.mean, x.half_width) for n, x in cells if x is not None and x.na is None]
    return out


def _band_label(tables: Sequence[StudyResults]) -> str:
    """The legend entry of the shaded bands: the tables' interval, in a few words."""
    if all(t.method == "bootstrap" for t in tables):
        return f"{CONFIDENCE:.0%} interval (seeds + eval data)"
    return f"{CONFIDENCE:.0%} interval over seeds"


def _band_note(tables: Sequence[StudyResults]) -> str:
    if all(c.n == 1 for t in tables for c in t.cells.values()) and not all(
        t.method == "bootstrap" for t in tables
    ):
        return "One seed (n=1): no bands."
    names = {t.interval_name for t in tables}
    name = names.pop() if len(names) == 1 else INTERVAL_NAMES["t"]
    return f"Shaded: the {CONFIDENCE:.0%} interval ({name}; see Protocols and intervals)."


def make_plots(
    rows: Sequence[Mapping[str, Any]], tables: Sequence[StudyResults], out_dir: Path
) -> list[PlotInfo]:
    """Every figure of the report, saved under ``out_dir/plots``: bits per byte against length
    per table, loss by position, exact match per task and the gap against parameters."""
    styles = plots.encoding_styles(encoding_order(rows))
    figures = _length_plots(rows, tables, out_dir, styles)
    figures += _position_plots(rows, out_dir, styles, tables)
    figures += _task_plots(tables, out_dir, styles)
    return figures + _gap_plots(rows, out_dir, styles)


def _length_plots(rows, tables, out_dir: Path, styles) -> list[PlotInfo]:
    studies = {r.get("study") for r in rows}
    figures = []
    for t in tables:
        if t.metric != "bits_per_byte":
            continue
        stem = f"plots/{t.name}_vs_length"
        where = _where(t.study if len(studies) > 1 else None, t.protocol, t.model_size)
        context = t.protocol == "context"
        axis = "context length" if context else "evaluation length"
        title = f"{t.info.title} vs {axis}{where}"
        plots.plot_vs_length(
            _series(t),
            out_dir / stem,
            train_length=t.train_length,
            ylabel=f"{t.info.title.lower()} ({t.info.unit})",
            title=title,
            styles=styles,
            xlabel="context length c (bytes before each block of scored targets)"
            if context
            else "evaluation length (tokens)",
            band_label=_band_label([t]),
        )
        caption = (
            f"{t.info.title} vs {axis} (log2 axis) per encoding; dashed line: training length. "
            f"{_band_note([t])}"
        )
        figures.append(PlotInfo(stem, title, caption))
    return figures


def _where(study: Any, protocol: Any, size: Any) -> str:
    """A title's ending: `` — study — protocol, model size`` (the parts given)."""
    where = "".join(f" — {p}" for p in (study, protocol) if p)
    return where + (f", model {size}" if size else "")


def _task_plots(tables, out_dir: Path, styles) -> list[PlotInfo]:
    task_tables = [t for t in tables if t.metric == "exact_match" and t.task]
    figures = []
    for study in dict.fromkeys(t.study for t in task_tables):
        chosen = [t for t in task_tables if t.study == study]
        prefix = f"{study}_" if len({t.study for t in task_tables}) > 1 and study else ""
        stem = f"plots/{prefix}exact_match_tasks"
        panels = {}
        for t in chosen:
            label = t.task if t.train_length is None else f"{t.task} (L = {t.train_length})"
            if label in panels:
                label = f"{label} [{t.name}]"
            panels[label] = (_series(t), t.train_length)
        title = "Exact match vs evaluation length" + (f" — {study}" if prefix else "")
        plots.plot_task_panels(
            panels, out_dir / stem, title=title, styles=styles, band_label=_band_label(chosen)
        )
        caption = (
            "Exact-match accuracy vs evaluation length, one panel per task (log2 axis); dashed "
            f"line: training length. {_band_note(chosen)}"
        )
        figures.append(PlotInfo(stem, title, caption))
    return figures


def _position_plots(
    rows: Sequence[Mapping[str, Any]],
    out_dir: Path,
    styles: Mapping[str, Any],
    tables: Sequence[StudyResults],
) -> list[PlotInfo]:
    # The context protocol's curves are per target of its short scored block (context c + k),
    # not per window offset: its table and plot against c say what they would.
    curves_rows = [
        r for r in rows if r["metric"] == "loss_by_position" and r.get("protocol") != "context"
    ]
    groups = group_by(curves_rows, group_key)
    totals = _cell_totals(rows)
    many_studies = len({r.get("study") for r in rows}) > 1
    names = table_names(("loss_by_position", key) for key in groups)
    taken = {t.name for t in tables}
    figures = []
    for key, rs in groups.items():
        study, protocol, _, train_length, size = key
        longest = max(r["eval_length"] for r in rs)
        rs = [r for r in rs if r["eval_length"] == longest]
        by_encoding = group_by(rs, lambda r: r["encoding"])
        order = [e for e in encoding_order(rows) if e in by_encoding]
        # in the tables' unit when every curve's cell has its bits per byte and loss rows
        in_bits = all(_bits_per_byte_factor(r, totals) is not None for r in rs)
        curves = {
            e: plots.mean_curve(
                [
                    _scaled(r["value"], _bits_per_byte_factor(r, totals) if in_bits else 1.0)
                    for r in by_encoding[e]
                ]
            )
            for e in order
        }
        window = max(1, (train_length or longest) // 8)
        name = names[("loss_by_position", key)]
        if name in taken:
            name += "-curve"
        stem = f"plots/{name}"
        where = _where(study if many_studies else None, protocol, size)
        title = f"Loss by position at length {longest}{where}"
        plots.plot_loss_by_position(
            curves,
            out_dir / stem,
            train_length=train_length,
            window=window,
            title=f"{title} (moving average over {window} positions)",
            ylabel="bits per byte" if in_bits else "loss (nats/token)",
            styles=styles,
        )
        seeds = sorted({len(v) for v in by_encoding.values()})
        n = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
        smoothing = f"L/8 = {window}" if train_length else f"{window}"
        unit = "Bits per byte" if in_bits else "Loss (nats/token)"
        caption = (
            f"{unit} at each position of the length-{longest} windows, mean over seeds "
            f"(n={n}), centred moving average over {smoothing} positions; dashed line: L"
            + (f" = {train_length}" if train_length else "")
            + ". Positions right of it see more context than any training window."
        )
        figures.append(PlotInfo(stem, title, caption))
    return figures


def _cell_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    fields = ("run", "seed", "config_hash", "encoding", "eval_length", "protocol", "stride")
    return tuple(str(row.get(k)) for k in fields)


def _cell_totals(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, ...], dict[str, float]]:
    """``{cell: {"loss": nats/token, "bits_per_byte": ...}}`` of every evaluation cell."""
    out: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in rows:
        if r.get("metric") in ("loss", "bits_per_byte") and isinstance(r.get("value"), float):
            out.setdefault(_cell_key(r), {})[r["metric"]] = r["value"]
    return out


def _bits_per_byte_factor(row: Mapping[str, Any], totals: Mapping) -> float | None:
    """The cell's bits per byte over its loss in nats per token: 1 / ln 2 for a byte model,
    times tokens per byte for a tokenizer's; what turns the per-position loss into the
    tables' unit. None when the cell has no such pair of rows."""
    cell = totals.get(_cell_key(row), {})
    loss, bits = cell.get("loss"), cell.get("bits_per_byte")
    if loss is None or bits is None or not (loss > 0 and math.isfinite(bits / loss)):
        return None
    return bits / loss


def _scaled(curve: Sequence[float | None], factor: float) -> list[float | None]:
    return [None if v is None else v * factor for v in curve]


def _gap_plots(rows: Sequence[Mapping[str, Any]], out_dir: Path, styles) -> list[PlotInfo]:
    """The extrapolation gap against parameters of each study with several model sizes."""
    groups = sweep_report.gap_panels(rows)
    figures = []
    for index, (group, panels) in enumerate(groups):
        stem = "plots/extrapolation_gap_vs_params" + (f"-{index + 1}" if len(groups) > 1 else "")
        where = " — " + ", ".join(str(x) for x in group if x) if len(groups) > 1 else ""
        title = f"Extrapolation gap vs parameters{where}"
        plots.plot_vs_params(
            panels,
            out_dir / stem,
            ylabel="gap (bits/byte)",
            title=title,
            styles=styles,
            band_label=f"{CONFIDENCE:.0%} interval over seeds",
        )
        seeds = sorted({r.get("seed") for r in rows if r.get("seed") is not None}, key=str)
        band = (
            f"shaded: the {CONFIDENCE:.0%} interval over seeds ({INTERVAL_NAMES['t']}, "
            f"n = {len(seeds)})"
            if len(seeds) > 1
            else "one seed: no bands"
        )
        caption = (
            "Bits per byte at m × L minus at 1 × L per encoding against its parameters (log "
            "axis), one panel per protocol and m; each run's gap is taken within the run, then "
            f"averaged over seeds; {band}. Dotted line: no gap."
        )
        figures.append(PlotInfo(stem, title, caption))
    return figures
