"""Plots and ``REPORT.md`` from results rows alone; the tables come from `tables`.

``write_report(rows, out_dir)`` is the entry point (``scripts/make_report.py`` and the sweep
runner call it). It writes ``tables/*.md|.tex|.csv``, ``plots/*.png|.pdf`` and ``REPORT.md``,
which embeds the tables and plots and states the commands, commits, versions, devices,
corpus and wall time found in the rows. Output is deterministic: the same rows give
byte-identical tables and ``REPORT.md``. Rows that must not share a table (another config,
corpus or release of a package: `comparable`) are refused before anything is written, unless
merged on purpose (``allow_mixed``); the captions and REPORT.md then say what was mixed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flaxformer_lite.experiments import comparable, results
from flaxformer_lite.experiments.report import paired, plots, sweep_report
from flaxformer_lite.experiments.sweeps import learning_rate_tag
from flaxformer_lite.experiments.report.study import (
    CONFIDENCE,
    CSV_FIELDS,
    MAIN_METRICS,
    MISSING_MD,
    Table,
    build_tables,
    encoding_order,
    group_by,
    group_key,
    latex_escape,
    md_code,
    md_escape,
    md_fence,
    md_text,
    render_csv,
    render_latex,
    render_markdown,
    table_names,
)

# The table API is re-exported here so ``report`` is the one module notebooks need.
__all__ = [
    "CSV_FIELDS",
    "build_tables",
    "encoding_order",
    "latex_escape",
    "render_csv",
    "render_latex",
    "render_markdown",
    "render_report",
    "table_names",
    "with_notes",
    "write_report",
    "write_study_report",
]


@dataclasses.dataclass(frozen=True)
class PlotInfo:
    """A saved figure: file stem relative to the report dir, heading and caption."""

    stem: str
    title: str
    caption: str


def _series(table: Table) -> dict[str, list[plots.Point]]:
    out = {}
    for e in table.encodings:
        points = []
        for c in table.columns:
            cell = table.cell(e, c)
            if cell is not None and cell.na is None:
                points.append((c.eval_length, cell.mean, cell.half_width))
        out[e] = points
    return out


def _band_note(tables: Sequence[Table]) -> str:
    if all(t.method == "bootstrap" for t in tables):
        return (
            f"Bands: the {CONFIDENCE:.0%} interval from the seeds' spread and a bootstrap of "
            "the evaluation data's blocks."
        )
    if all(c.n == 1 for t in tables for c in t.cells.values()):
        return "One seed (n=1): no CI bands."
    return f"Bands: {CONFIDENCE:.0%} CI across seeds (Student t) where n > 1."


def _make_plots(
    rows: Sequence[Mapping[str, Any]], tables: Sequence[Table], out_dir: Path
) -> list[PlotInfo]:
    styles = plots.encoding_styles(encoding_order(rows))
    studies = {r.get("study") for r in rows}
    figures = []
    for t in tables:
        if t.metric != "bits_per_byte":
            continue
        stem = f"plots/{t.name}_vs_length"
        where = "".join(f" — {p}" for p in (t.study if len(studies) > 1 else None, t.protocol) if p)
        where += f", model {t.model_size}" if t.model_size else ""
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
        )
        same = " The same target bytes at every context length." if context else ""
        caption = (
            f"{t.info.title} vs {axis} (log2 axis) per encoding; dashed line: training length."
            f"{same} {_band_note([t])}"
        )
        figures.append(PlotInfo(stem, title, caption))

    figures += _position_plots(rows, out_dir, styles, tables)

    task_tables = [t for t in tables if t.metric == "exact_match" and t.task]
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
        plots.plot_task_panels(panels, out_dir / stem, title=title, styles=styles)
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
    tables: Sequence[Table],
) -> list[PlotInfo]:
    # The context protocol's curves are per target of its short scored block (context c + k),
    # not per window offset: its table and plot against c say what they would.
    curves_rows = [
        r for r in rows if r["metric"] == "loss_by_position" and r.get("protocol") != "context"
    ]
    groups = group_by(curves_rows, group_key)
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
        curves = {e: plots.mean_curve([r["value"] for r in by_encoding[e]]) for e in order}
        window = max(1, (train_length or longest) // 8)
        name = names[("loss_by_position", key)]
        if name in taken:
            name += "-curve"
        stem = f"plots/{name}"
        where = "".join(f" — {p}" for p in (study if many_studies else None, protocol) if p)
        where += f", model {size}" if size else ""
        title = f"Loss by position at length {longest}{where}"
        plots.plot_loss_by_position(
            curves,
            out_dir / stem,
            train_length=train_length,
            window=window,
            title=f"{title} (moving average over {window} positions)",
            styles=styles,
        )
        seeds = sorted({len(v) for v in by_encoding.values()})
        n = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
        smoothing = f"L/8 = {window}" if train_length else f"{window}"
        caption = (
            f"Mean loss at each position of the length-{longest} evaluation windows, averaged "
            f"over seeds (n={n}) and smoothed with a centred moving average over "
            f"{smoothing} positions; dashed line: training length L"
            + (f" = {train_length}" if train_length else "")
            + ". Positions right of it see more context than any training window."
        )
        figures.append(PlotInfo(stem, title, caption))
    return figures


def _gap_plots(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[PlotInfo]:
    """The extrapolation gap against parameters of each study with several model sizes."""
    styles = plots.encoding_styles(encoding_order(rows))
    groups = sweep_report.gap_panels(rows)
    figures = []
    for index, (group, panels) in enumerate(groups):
        stem = "plots/extrapolation_gap_vs_params" + (f"-{index + 1}" if len(groups) > 1 else "")
        where = " — " + ", ".join(str(x) for x in group if x) if len(groups) > 1 else ""
        title = f"Extrapolation gap vs parameters{where}"
        plots.plot_vs_params(
            panels, out_dir / stem, ylabel="gap (bits/byte)", title=title, styles=styles
        )
        seeds = sorted({r.get("seed") for r in rows if r.get("seed") is not None}, key=str)
        band = (
            f"bands: {CONFIDENCE:.0%} Student-t CI across seeds (n = {len(seeds)})"
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


# ----------------------------------------------------------------------------- REPORT.md


def _distinct(rows: Iterable[Mapping[str, Any]], key: str) -> list[Any]:
    return list(dict.fromkeys(_freeze(r.get(key)) for r in rows))


def _freeze(x: Any) -> Any:
    if isinstance(x, dict | list):
        return json.dumps(x, sort_keys=True)
    return x


def _counted(rows: Sequence[Mapping[str, Any]], keys: str | Sequence[str]) -> list:
    """Distinct values of ``keys`` (a field or a tuple of fields) with their row counts, in
    order of first appearance (dicts compare by content); rows where all are missing are
    skipped."""
    fields = (keys,) if isinstance(keys, str) else tuple(keys)
    counts: dict[Any, list[Any]] = {}
    for r in rows:
        values = tuple(r.get(k) for k in fields)
        if all(v is None for v in values):
            continue
        entry = counts.setdefault(tuple(map(_freeze, values)), [values, 0])
        entry[1] += 1
    return [(v[0] if isinstance(keys, str) else v, n) for v, n in counts.values()]


def _run_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    fields = ("study", "preset", "run", "seed", "config_hash", "git_commit", "backend", "command")
    return tuple(_freeze(row.get(k)) for k in fields)


def _runs(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per run (train/eval seconds are per run, repeated in each of its rows)."""
    runs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        run = runs.setdefault(
            _run_key(r),
            {k: r.get(k) for k in ("run", "seed", "config_hash", "git_commit", "backend")}
            | {"encodings": [], "train_seconds": 0.0, "eval_seconds": 0.0, "study": r.get("study")},
        )
        if r["encoding"] not in run["encodings"]:
            run["encodings"].append(r["encoding"])
        for k in ("train_seconds", "eval_seconds"):
            v = r.get(k)
            if isinstance(v, int | float) and math.isfinite(v):
                run[k] = max(run[k], float(v))
    return list(runs.values())


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _number_first(x: Any) -> tuple[int, Any]:
    """Sort key: numbers in numeric order, then anything else by its text."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return (0, x)
    return (1, str(x))


def _fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s:.1f} s ({s / 60:.1f} min)"


def _join(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _code(x: Any) -> str:
    return md_code(x)


def _listing(label: str, counted: Sequence[tuple[Any, int]], fmt) -> str:
    """``- label: a; b`` with row counts when the rows disagree (``fmt`` returns Markdown:
    `md_escape` d or `md_code`)."""
    if not counted:
        return f"- {label}: not recorded"
    many = len(counted) > 1
    return f"- {label}: " + "; ".join(fmt(v) + (f" ({n} rows)" if many else "") for v, n in counted)


def _describe_packages(packages: Any) -> str:
    if isinstance(packages, dict):
        return md_escape(_join(f"{k} {v}" for k, v in packages.items()))
    return md_escape(packages)


def _provenance_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    commands = [c for c, _ in _counted(rows, "command")]
    if commands:
        lines += ["Command(s) that produced the rows:", "", *md_fence(commands), ""]
    lines += [
        _listing("Git commit(s)", _counted(rows, "git_commit"), _code),
        _listing("Packages", _counted(rows, "packages"), _describe_packages),
        _listing("Python", _counted(rows, "python"), md_escape),
        _listing(
            "Backend / device",
            _counted(rows, ("backend", "device_kind", "device_count")),
            lambda v: md_escape("{} / {} × {}".format(*("?" if x is None else x for x in v))),
        ),
        _listing("Corpus", _counted(rows, "data"), _describe_data),
    ]
    full = [data for data, _ in _counted(rows, "data") if isinstance(data, dict)]
    if full:
        lines += ["", "<details><summary>Corpus provenance (as recorded in the rows)</summary>", ""]
        fenced = md_fence(json.dumps(d, indent=1, sort_keys=True) for d in full)
        lines += [fenced[0] + "json", *fenced[1:]]
        lines += ["", "</details>"]
    return lines


def _describe_data(data: Any) -> str:
    """Name, content hash, size and file count of a corpus provenance dict."""
    if not isinstance(data, dict):
        return md_escape(data)
    parts = [md_escape(data["name"])] if "name" in data else []
    if "sha256" in data:
        parts.append(f"sha256 {_code(data['sha256'])}")
    size = data.get("num_bytes", data.get("bytes"))
    if size is not None:
        parts.append(md_escape(f"{size} bytes"))
    if data.get("num_files") is not None:
        parts.append(md_escape(f"{data['num_files']} files"))
    return ", ".join(parts) or _code(json.dumps(data, sort_keys=True))


def _setup_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    train = math.fsum(r["train_seconds"] for r in runs)
    evaluation = math.fsum(r["eval_seconds"] for r in runs)
    studies = [
        f"{s} ({p})" if p else str(s)
        for s, p in dict.fromkeys((r.get("study"), r.get("preset")) for r in rows)
    ]
    encodings = encoding_order(rows)
    seeds = sorted((s for s in _distinct(rows, "seed") if s is not None), key=_number_first)
    protocols = [p for p in _distinct(rows, "protocol") if p]
    tasks = [t for t in _distinct(rows, "task") if t]
    train_lengths = sorted(n for n in _distinct(rows, "train_length") if n)
    eval_lengths = sorted(n for n in _distinct(rows, "eval_length") if n)
    stamps = sorted(t for t in _distinct(rows, "timestamp") if isinstance(t, str))
    cell = md_escape  # every value comes from the rows
    lines = [
        "| | |",
        "|:--|:--|",
        f"| Study (preset) | {cell(_join(studies))} |",
        f"| Encodings ({len(encodings)}) | {cell(_join(encodings))} |",
        f"| Seeds | {cell(_join(seeds)) or MISSING_MD} |",
        f"| Train length L | {cell(_join(train_lengths)) or MISSING_MD} |",
        f"| Evaluation lengths | {cell(_join(eval_lengths))} |",
        f"| Protocols | {cell(_join(protocols)) or MISSING_MD} |",
    ]
    if tasks:
        lines.append(f"| Tasks | {cell(_join(tasks))} |")
    rates = sorted({r["learning_rate"] for r in rows if _is_number(r.get("learning_rate"))})
    if rates:
        tags = _join(learning_rate_tag(x) for x in rates)
        lines.append(f"| Peak learning rate{'s' if len(rates) > 1 else ''} | {cell(tags)} |")
    params: dict[Any, list[float]] = {}
    for r in rows:
        if _is_number(r.get("num_params")):
            params.setdefault(r.get("model_size"), []).append(r["num_params"])
    if params:  # a model size: the smallest and largest count of its encodings
        sizes = sorted(params.items(), key=lambda kv: min(kv[1]))
        counts = [
            ("" if size is None else f"{size}: ")
            + "–".join(dict.fromkeys(f"{n:,.0f}" for n in (min(ns), max(ns))))
            for size, ns in sizes
        ]
        lines.append(f"| Parameters | {cell('; '.join(counts))} |")
    lines += [
        f"| Runs / rows | {len(runs)} / {len(rows)} |",
        f"| Wall time (sum over runs) | {_fmt_seconds(train + evaluation)} = "
        f"{_fmt_seconds(train)} training + {_fmt_seconds(evaluation)} evaluation |",
    ]
    if stamps:
        span = stamps[0] if len(stamps) == 1 else f"{stamps[0]} … {stamps[-1]}"
        lines.append(f"| Runs finished | {cell(span)} |")
    return lines


def _runs_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    many_studies = len({r["study"] for r in runs}) > 1
    head = ["study"] if many_studies else []
    head += ["run", "seed", "encodings", "config hash", "commit", "backend"]
    head += ["train s", "eval s"]
    lines = ["| " + " | ".join(head) + " |", "|" + ":--|" * (len(head) - 2) + "--:|--:|"]
    for r in runs:  # every value comes from the rows: escaped, code spans fenced
        cells = [md_escape(r["study"])] if many_studies else []
        cells += [
            md_escape(r["run"]),
            md_escape(r["seed"]),
            md_escape(_join(r["encodings"])),
            md_code(r["config_hash"], cell=True),
            md_code(r["git_commit"], cell=True),
            md_escape(r["backend"]),
            f"{r['train_seconds']:.1f}",
            f"{r['eval_seconds']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _default_title(rows: Sequence[Mapping[str, Any]]) -> str:
    studies = list(dict.fromkeys((r.get("study"), r.get("preset")) for r in rows))
    names = _join(f"{s} ({p})" if p else str(s) for s, p in studies)
    return f"Results: {names}"


def render_report(
    rows: Sequence[Mapping[str, Any]],
    tables: Sequence[Table],
    figures: Sequence[PlotInfo],
    *,
    problems: Sequence[Any] = (),
    title: str | None = None,
    pairs: Sequence[Any] = (),
    missing: Sequence[str] = (),
    derived: Sequence[sweep_report.TextTable] = (),
    mixed: Sequence[str] = (),
    failed: Mapping[str, str] | None = None,
) -> str:
    """The text of ``REPORT.md`` (links are relative to the report's directory);
    ``missing``: lines naming a study's cells without results (merged shards), stated;
    ``derived``: the learning-rate, extrapolation-gap and cost tables (`sweep_report`);
    ``mixed``: what rows sharing a table differ in (`comparable.Verdict.report_lines`);
    ``failed``: cell -> its error line (a study's failed cells), stated. Without rows (every
    cell failed) the report is just these statements."""
    lines = [f"# {md_text(title or _default_title(rows))}", ""]
    if rows:
        lines += [
            f"Generated from {len(rows)} results rows alone by "
            "`flaxformer_lite.experiments.report` (regenerate with `python "
            "scripts/make_report.py RUN_DIR [RUN_DIR ...]`). Tables are also in `tables/` as "
            "LaTeX (booktabs) and CSV; figures in `plots/` as PNG and PDF.",
            "",
            "## Setup",
            "",
            *_setup_lines(rows),
            "",
        ]
    else:
        lines += ["No results rows: no cell has finished, so there are no tables or plots.", ""]
    if failed:
        lines += [
            "## Failed cells",
            "",
            f"{len(failed)} cell(s) failed; they are not in any table (the traceback is in "
            "`runs/<cell>/error.txt`; rerun the study to retry them):",
            "",
            *[
                f"- {md_code(name)}: {md_code(error.replace('`', chr(39)))}"
                for name, error in failed.items()
            ],
            "",
        ]
    if problems:
        lines += [
            "## Problems",
            "",
            f"{len(problems)} results line(s) were skipped; they are not in any table:",
            "",
            *["- " + md_code(str(p).replace("`", "'")) for p in problems],
            "",
        ]
    if missing:
        lines += [
            "## Missing cells",
            "",
            "Cells of the merged studies without results rows (a shard not run or not "
            "finished); they are not in any table:",
            "",
            *["- " + md_text(m) for m in missing],
            "",
        ]
    if mixed:
        lines += [
            "## Mixed rows",
            "",
            "Rows that share a table differ in these fields (the tables' captions say so too):",
            "",
            *["- " + md_code(m.replace("`", "'")) for m in mixed],
            "",
        ]
    if not rows:
        return "\n".join(lines)
    lines += ["## Results", ""]
    main = [t for t in tables if t.metric in MAIN_METRICS]
    other = [t for t in tables if t.metric not in MAIN_METRICS]
    for t in main:
        lines += [
            f"### {md_text(t.title())}",
            "",
            render_markdown(t).rstrip("\n"),
            "",
            f"[LaTeX](tables/{t.name}.tex) · [CSV](tables/{t.name}.csv) · "
            f"[Markdown](tables/{t.name}.md)",
            "",
        ]
    if not pairs and any(t.metric in paired.PAIRED_METRICS for t in tables):
        lines += ["### Paired differences", "", paired.NONE_NOTE, ""]
    if pairs:
        lines += [
            "### Paired differences",
            "",
            paired.render_markdown(pairs).rstrip("\n"),
            "",
            "[LaTeX](tables/paired_differences.tex) · [CSV](tables/paired_differences.csv) · "
            "[Markdown](tables/paired_differences.md)",
            "",
        ]
    for t in derived:
        lines += [f"### {md_text(t.title)}", "", sweep_report.render_markdown(t).rstrip("\n"), ""]
        if t.files:
            lines += [
                f"[LaTeX](tables/{t.name}.tex) · [CSV](tables/{t.name}.csv) · "
                f"[Markdown](tables/{t.name}.md)",
                "",
            ]
    if other:
        lines += [
            "Other tables: "
            + _join(f"[{md_text(t.title())}](tables/{t.name}.md)" for t in other)
            + " (each also as `.tex` and `.csv`).",
            "",
        ]
    if figures:
        lines += ["## Plots", ""]
        for f in figures:
            lines += [
                f"### {md_text(f.title)}",
                "",
                f"![{md_text(f.title)}]({f.stem}.png)",
                "",
                f"{md_text(f.caption)} ([PDF]({f.stem}.pdf))",
                "",
            ]
    lines += ["## Provenance", "", *_provenance_lines(rows), "", "### Runs", "", *_runs_table(rows)]
    return "\n".join(lines) + "\n"


def write_report(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    problems: Sequence[Any] = (),
    title: str | None = None,
    blocks: Sequence[Mapping[str, Any]] = (),
    reference: str = paired.DEFAULT_REFERENCE,
    all_pairs: bool = False,
    missing: Sequence[str] = (),
    common_rate: float | None = None,
    allow_mixed: Sequence[str] = (),
    origins: Sequence[str] | None = None,
    failed: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tables/*.{md,tex,csv}``, ``plots/*.{png,pdf}`` and ``REPORT.md`` into ``out_dir``.

    Rows of several learning rates per encoding (the ``lr`` preset) are tabulated at each
    encoding's best rate, with ``tables/learning_rate.*`` showing every rate; rows of several
    model sizes (``scaling``) get a table per size and ``tables/extrapolation_gap.*`` with
    its plot; every report with run times has the cost per encoding (`sweep_report`; in
    ``REPORT.md`` only: wall-clock times, unlike the files in ``tables/``).

    Args:
      rows: results rows (`results.load_rows`).
      out_dir: the report directory (created if needed).
      problems: skipped results lines (`results.Problem` or strings), stated in the report.
      title: the report's heading (default: the studies and presets of the rows).
      blocks: the per-block records beside the rows (`results.load_blocks`): bootstrap
        intervals, significance marks and ``tables/paired_differences.{md,tex,csv}``.
      reference, all_pairs: the paired-differences table's reference encoding, or all pairs.
      missing: lines naming cells without results (``make_report.py``), stated in the report.
      common_rate: the learning rate the ranking at each encoding's best rate is compared
        with (default: the middle rate of the grid; the runner passes the study's
        ``optim.learning_rate``).
      allow_mixed: fields (`comparable`) in which rows sharing a table may differ on purpose;
        the captions and REPORT.md say what was mixed.
      origins: each row's file, named when rows are refused (default: ``row N``).
      failed: cell -> its error line (a study's failed cells), stated in the report.

    Returns:
      The path of ``REPORT.md``. The same rows give byte-identical tables and ``REPORT.md``.

    Raises:
      ValueError: no rows, and nothing failed or missing to state (with either, a REPORT.md
        of just those is written: a study whose every cell failed still says so).
      comparable.MixedRowsError: rows that share a table differ in a field that changes
        numbers (not in ``allow_mixed``); nothing is written.
    """
    rows = list(rows)
    if not rows and not (failed or missing):
        raise ValueError("write_report needs at least one results row; got none")
    out_dir = Path(out_dir)
    if not rows:
        out_dir.mkdir(parents=True, exist_ok=True)
        text = render_report(
            [], [], [], problems=list(problems), title=title, missing=list(missing), failed=failed
        )
        _write_text(out_dir / "REPORT.md", text)
        return out_dir / "REPORT.md"
    verdict = comparable.check(rows, origins, allow_mixed)
    if verdict.refused:
        raise comparable.MixedRowsError(verdict.refused)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    choices = sweep_report.select_rates(rows)
    main_rows = sweep_report.rows_at_best_rates(rows, choices)  # rows itself without a grid
    tables = build_tables(main_rows, blocks)
    if choices:
        tables = [
            dataclasses.replace(
                t,
                note=sweep_report.best_rate_note(
                    choices, (t.study, t.task, t.train_length, t.model_size)
                ),
            )
            for t in tables
        ]
    tables = with_notes(tables, verdict)
    derived = [sweep_report.learning_rate_table(choices, rows, common_rate)] if choices else []
    derived += sweep_report.gap_tables(main_rows) + sweep_report.cost_tables(rows)
    for d in (d for d in derived if d.files):
        for suffix, render in (
            (".md", sweep_report.render_markdown),
            (".tex", sweep_report.render_latex),
            (".csv", sweep_report.render_csv),
        ):
            _write_text(out_dir / "tables" / f"{d.name}{suffix}", render(d))
    for t in tables:
        for suffix, text in (
            (".md", render_markdown(t)),
            (".tex", render_latex(t)),
            (".csv", render_csv(t)),
        ):
            _write_text(out_dir / "tables" / f"{t.name}{suffix}", text)
    pairs = paired.build_paired_tables(tables, reference=reference, all_pairs=all_pairs)
    if pairs:
        for suffix, render in (
            (".md", paired.render_markdown),
            (".tex", paired.render_latex),
            (".csv", paired.render_csv),
        ):
            _write_text(out_dir / "tables" / f"paired_differences{suffix}", render(pairs))
    figures = _make_plots(main_rows, tables, out_dir) + _gap_plots(main_rows, out_dir)
    report = out_dir / "REPORT.md"
    text = render_report(
        rows,
        tables,
        figures,
        problems=list(problems),
        title=title,
        pairs=pairs,
        missing=list(missing),
        derived=derived,
        mixed=verdict.report_lines(),
        failed=failed,
    )
    _write_text(report, text)
    return report


def with_notes(tables: Sequence[Table], verdict: comparable.Verdict) -> list[Table]:
    """``tables`` with what their rows differ in (mixed on purpose, patch releases) ending
    their captions (`comparable.Verdict.notes`)."""
    out = []
    for t in tables:
        note = verdict.notes((t.study, t.task, t.train_length, t.model_size))
        if note:
            t = dataclasses.replace(t, note=f"{t.note} {note}".strip())
        out.append(t)
    return out


def _write_text(path: Path, text: str) -> None:
    """Write UTF-8 via a temporary file and rename (`plots.write_bytes_atomically`), so a
    reader never sees half a table; a failure leaves no temporary file and names the table."""
    plots.write_bytes_atomically(path, text.encode("utf-8"))


def write_study_report(
    workdir: str | Path,
    *,
    reference: str = paired.DEFAULT_REFERENCE,
    all_pairs: bool = False,
    common_rate: float | None = None,
    failed: Mapping[str, str] | None = None,
    missing: Sequence[str] = (),
    title: str | None = None,
) -> Path | None:
    """The report of a study directory from its ``results.jsonl`` and ``blocks.jsonl``
    (skipped lines are stated in it), with its ``failed`` cells (cell -> error line) and
    ``missing`` lines stated; written even when every cell failed, None only when no cell has
    finished and nothing failed or is missing. Rows that must not share a table raise
    `comparable.MixedRowsError` naming each cell's ``rows.jsonl``."""
    rows, problems, origins = results.load_rows_with_origins([workdir])
    for problem in problems:
        warnings.warn(str(problem), results.ResultsWarning, stacklevel=2)
    if not rows and not (failed or missing):
        return None
    if not rows and title is None:
        title = _study_title(Path(workdir))
    blocks = results.load_blocks([workdir])
    files = [_cell_rows_file(Path(workdir), r, f) for r, (f, _) in zip(rows, origins, strict=True)]
    return write_report(
        rows,
        workdir,
        problems=problems,
        blocks=blocks,
        reference=reference,
        all_pairs=all_pairs,
        common_rate=common_rate,
        origins=files,
        failed=failed,
        missing=missing,
        title=title,
    )


def _study_title(workdir: Path) -> str:
    """``Results: <study> (<preset>)`` from the study's ``study.json`` (as rows would say)."""
    try:
        study = json.loads((workdir / "study.json").read_text(encoding="utf-8"))["study"]
        name, preset = str(study["name"]), str(study.get("preset") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return f"Results: {workdir.name}"
    return f"Results: {name} ({preset})" if preset else f"Results: {name}"


def error_line(path: str | Path, limit: int = 400) -> str | None:
    """The last line of a failed cell's ``error.txt`` (the exception and its message), or
    None when there is none (the cell did not fail, or the file cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    last = next((line for line in reversed(text.splitlines()) if line.strip()), None)
    return None if last is None else one_line(last, limit)


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs as one space), clipped to ``limit``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell_rows_file(workdir: Path, row: Mapping[str, Any], file: str) -> str:
    """Where a study's row comes from: its cell's ``runs/<cell>/rows.jsonl`` (what
    ``results.jsonl`` is rebuilt from) when that exists, else ``file``."""
    run = row.get("run")
    cell = workdir / "runs" / run / "rows.jsonl" if isinstance(run, str) else None
    return str(cell) if cell is not None and cell.is_file() else file
