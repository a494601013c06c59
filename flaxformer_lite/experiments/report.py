"""Tables (Markdown, LaTeX booktabs, CSV), plots and ``REPORT.md`` from results rows alone.

``write_report(rows, out_dir)`` is the entry point (``scripts/make_report.py`` and the sweep
runner call it). The pieces are public for notebooks and tests:

* `build_tables` groups rows into `Table` s: one per metric x protocol (x task, x train
  length or study when several are present). Rows = encodings, in the order they first appear
  with every ``base+variant`` label (RoPE scaling, randomized positions) right after its base;
  columns = evaluation lengths ("2× (128)"), or window-offset buckets at the longest length for
  ``bucket_loss``; cells = mean ± 95% Student-t CI across seeds (`stats.mean_ci`).
* `render_markdown`, `render_latex`, `render_csv` turn a table into text.

Output is deterministic: the same rows give byte-identical tables and ``REPORT.md``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flaxformer_lite.experiments import plots
from flaxformer_lite.experiments.stats import mean_ci

CONFIDENCE = 0.95
MISSING_MD = "—"
MISSING_TEX = "---"


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """How a metric is named and shown: title, unit, which direction is better, decimals."""

    title: str
    unit: str = ""
    better: str | None = None  # "lower", "higher" or None (no best marked)
    digits: int = 3


METRICS: dict[str, MetricInfo] = {
    "bits_per_byte": MetricInfo("Bits per byte", "bits/byte", "lower"),
    "exact_match": MetricInfo("Exact match", "fraction of examples", "higher"),
    "accuracy": MetricInfo("Accuracy", "fraction of target tokens", "higher"),
    "bucket_loss": MetricInfo("Loss by window-offset bucket", "nats/token", "lower"),
    "loss": MetricInfo("Loss", "nats/token", "lower"),
    "perplexity": MetricInfo("Perplexity", "", "lower", digits=2),
}
# Tables of these metrics are embedded in REPORT.md; the others are linked.
MAIN_METRICS = ("bits_per_byte", "exact_match", "accuracy", "bucket_loss")
_METRIC_ORDER = {m: i for i, m in enumerate(METRICS)}


def metric_info(metric: str) -> MetricInfo:
    """`MetricInfo` of ``metric`` (an unknown metric is shown by name, with no best marked)."""
    return METRICS.get(metric, MetricInfo(metric))


# ----------------------------------------------------------------------------- tables


@dataclasses.dataclass(frozen=True)
class Column:
    """A table column: an evaluation length, or a window-offset bucket at one length."""

    key: Any
    eval_length: int
    train_length: int | None
    bucket: str | None = None

    @property
    def multiple(self) -> float | None:
        """Evaluation length as a multiple of the training length."""
        return self.eval_length / self.train_length if self.train_length else None

    def label(self) -> str:
        """Plain-text header: ``"2× (128)"``, a bucket ``"[64,128)"``, or ``"128"``."""
        if self.bucket is not None:
            return self.bucket
        if self.multiple is None:
            return str(self.eval_length)
        return f"{self.multiple:g}× ({self.eval_length})"

    def latex_label(self) -> str:
        """LaTeX header: ``"$2\\times$ (128)"``, ``"{[}64,128)"``, or ``"128"``."""
        if self.bucket is not None:
            return latex_escape(self.bucket)
        if self.multiple is None:
            return str(self.eval_length)
        return f"${self.multiple:g}\\times$ ({self.eval_length})"


@dataclasses.dataclass(frozen=True)
class Cell:
    """Aggregate of one (encoding, column): mean, CI half width (None if n = 1), n, seeds."""

    mean: float
    half_width: float | None
    n: int
    seeds: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    """One results table: ``cells[(encoding, column.key)]`` (absent = not measured)."""

    name: str
    metric: str
    study: str | None
    protocol: str | None
    task: str | None
    train_length: int | None
    eval_length: int | None  # bucket tables: the evaluation length the buckets come from
    encodings: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: Mapping[tuple[str, Any], Cell]
    strides: tuple[int, ...] = ()

    @property
    def info(self) -> MetricInfo:
        return metric_info(self.metric)

    def title(self) -> str:
        """Short heading, e.g. ``"Bits per byte — nonoverlapping"``."""
        parts = [self.info.title]
        if self.metric == "bucket_loss" and self.eval_length:
            parts[0] += f" at length {self.eval_length}"
        where = [p for p in (self.task, None if self.task else self.protocol) if p]
        if where:
            parts.append(", ".join(where))
        return " — ".join(parts)

    def caption(self) -> str:
        """Plain-text caption: what is shown, the setting, the statistic and n."""
        info = self.info
        unit = f" ({info.unit})" if info.unit else ""
        better = f", {info.better} is better" if info.better else ""
        text = [f"{info.title}{unit}{better}."]
        setting = []
        if self.study:
            setting.append(f"study {self.study}")
        if self.task:
            setting.append(f"task {self.task}")
        if self.protocol and self.protocol != "task":
            protocol = f"protocol {self.protocol}"
            if self.protocol == "sliding" and self.strides:
                protocol += " (strides " + ", ".join(map(str, self.strides)) + ")"
            setting.append(protocol)
        if self.train_length:
            setting.append(f"train length L = {self.train_length}")
        if self.metric == "bucket_loss" and self.eval_length:
            length = f"evaluation length {self.eval_length}"
            if self.train_length:
                length += f" ({self.eval_length / self.train_length:g}× L)"
            setting.append(f"{length}; columns are window offsets [lo, hi)")
        elif self.train_length:
            setting.append("columns: evaluation length as a multiple of L (tokens)")
        if setting:
            text.append(_sentence("; ".join(setting)))
        text.append(self.n_note())
        if self.best_marked():
            text.append("Bold: best per column.")
        if any(self.cell(e, c) is None for e in self.encodings for c in self.columns):
            text.append(f"{MISSING_MD}: not measured.")
        return " ".join(text)

    def n_note(self) -> str:
        """The statistic and the number of samples, e.g. ``n=1: no interval``."""
        ns = sorted({c.n for c in self.cells.values()})
        if ns == [1]:
            return "One seed per cell (n=1: no interval)."
        n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]} per cell; see CSV"
        note = f"Mean ± {CONFIDENCE:.0%} CI across seeds (Student t, n={n})."
        if ns[0] == 1:
            note += " Cells marked (n=1) have no interval."
        repeated = any(
            len(set(seeds)) < len(seeds)
            for seeds in ([s for s in c.seeds if s is not None] for c in self.cells.values())
        )
        if repeated:
            note += " Some cells hold several measurements of one seed (merged runs)."
        return note

    def cell(self, encoding: str, column: Column) -> Cell | None:
        return self.cells.get((encoding, column.key))

    def best_marked(self) -> bool:
        return any(self.best(c) for c in self.columns)

    def best(self, column: Column) -> set[str]:
        """Encodings with the best mean of ``column`` as displayed (ties all best).

        Empty when the metric has no direction or fewer than two encodings have a finite mean.
        """
        better = self.info.better
        shown = {}
        for e in self.encodings:
            c = self.cell(e, column)
            if c is not None and math.isfinite(c.mean):
                shown[e] = float(format_number(c.mean, self.info.digits))
        if better is None or len(shown) < 2:
            return set()
        target = min(shown.values()) if better == "lower" else max(shown.values())
        return {e for e, v in shown.items() if v == target}

    def mixed_n(self) -> bool:
        return len({c.n for c in self.cells.values()}) > 1


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def format_number(x: float, digits: int) -> str:
    """Fixed ``digits`` decimals; scientific beyond 1e5; ``nan``/``inf`` spelled out."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) >= 1e5:
        return f"{x:.{digits}e}"
    return f"{x:.{digits}f}"


def encoding_order(labels: Iterable[str]) -> list[str]:
    """Distinct labels in order of first appearance, each ``base+variant`` right after ``base``.

    ``["sinusoidal", "rope", "alibi", "rope+pi", "rope+yarn"]`` ->
    ``["sinusoidal", "rope", "rope+pi", "rope+yarn", "alibi"]``. A variant whose base is absent
    keeps its own position.
    """
    order = list(dict.fromkeys(labels))
    present = set(order)

    def base(label: str) -> str | None:
        head = label.split("+", 1)[0]
        return head if "+" in label and head in present else None

    out = []
    for label in order:
        if base(label) is None:
            out.append(label)
            out += [v for v in order if base(v) == label]
    return out


def _bucket_lo(bucket: str) -> tuple[float, str]:
    m = re.match(r"\s*[\[(]\s*(-?\d+)", bucket)
    return (float(m.group(1)) if m else math.inf, bucket)


def _group_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("study"), row.get("protocol"), row.get("task"), row.get("train_length"))


def table_names(keys: Iterable[tuple[str, tuple[Any, ...]]]) -> dict[tuple[str, Any], str]:
    """File stems for ``(metric, (study, protocol, task, train_length))`` keys.

    ``metric[_protocol][_task]`` (protocol ``task`` is implied by a task name), prefixed by the
    study and suffixed by ``_L<train length>`` only where that is needed to tell keys apart,
    so a single-study report has stable names like ``bits_per_byte_nonoverlapping``.
    """
    keys = list(dict.fromkeys(keys))
    families: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for metric, (study, protocol, task, train_length) in keys:
        families.setdefault((metric, protocol, task), []).append((study, train_length))
    names = {}
    for metric, key in keys:
        study, protocol, task, train_length = key
        members = families[(metric, protocol, task)]
        parts = [str(study)] if study and len({m[0] for m in members}) > 1 else []
        parts.append(metric)
        if protocol and protocol != "task":
            parts.append(str(protocol))
        if task:
            parts.append(str(task))
        if train_length and len({m[1] for m in members}) > 1:
            parts.append(f"L{train_length}")
        names[(metric, key)] = re.sub(r"[^A-Za-z0-9_.+-]+", "-", "_".join(parts))
    return names


def _aggregate(groups: Mapping[tuple[str, Any], list[Mapping[str, Any]]]) -> dict:
    cells = {}
    for key, rs in groups.items():
        mean, half, n = mean_ci([r["value"] for r in rs], confidence=CONFIDENCE)
        cells[key] = Cell(mean, half, n, tuple(r.get("seed") for r in rs))
    return cells


def build_tables(rows: Sequence[Mapping[str, Any]]) -> list[Table]:
    """Group scalar rows into tables (see the module docstring); ``loss_by_position`` is plotted,
    not tabulated. Tables are ordered by study, then metric (bits/byte, exact match, accuracy,
    buckets, loss, perplexity, others by name), then first appearance."""
    scalar = [r for r in rows if r["metric"] != "loss_by_position"]
    order = encoding_order(r["encoding"] for r in rows)
    studies = list(dict.fromkeys(r.get("study") for r in rows))

    grouped: dict[tuple[str, tuple[Any, ...]], list[Mapping[str, Any]]] = {}
    for r in scalar:
        grouped.setdefault((r["metric"], _group_key(r)), []).append(r)

    names = table_names(grouped)
    tables = []
    for index, ((metric, key), rs) in enumerate(grouped.items()):
        train_length = key[3]
        eval_length = None
        if metric == "bucket_loss":
            eval_length = max(r["eval_length"] for r in rs)
            rs = [r for r in rs if r["eval_length"] == eval_length]
            buckets = sorted({r["bucket"] for r in rs}, key=_bucket_lo)
            columns = tuple(Column(b, eval_length, train_length, bucket=b) for b in buckets)
            by_cell = _by(rs, lambda r: (r["encoding"], r["bucket"]))
        else:
            lengths = sorted({r["eval_length"] for r in rs})
            columns = tuple(Column(n, n, train_length) for n in lengths)
            by_cell = _by(rs, lambda r: (r["encoding"], r["eval_length"]))
        present = {r["encoding"] for r in rs}
        strides = sorted({r["stride"] for r in rs if isinstance(r.get("stride"), int)})
        table = Table(
            name=names[(metric, key)],
            metric=metric,
            study=key[0],
            protocol=key[1],
            task=key[2],
            train_length=train_length,
            eval_length=eval_length,
            encodings=tuple(e for e in order if e in present),
            columns=columns,
            cells=_aggregate(by_cell),
            strides=tuple(strides),
        )
        sort_key = (
            studies.index(key[0]),
            _METRIC_ORDER.get(metric, len(_METRIC_ORDER)),
            "" if metric in _METRIC_ORDER else metric,
            index,
        )
        tables.append((sort_key, table))
    tables.sort(key=lambda t: t[0])
    return _unique_names([t for _, t in tables])


def _by(rows: Iterable[Mapping[str, Any]], key) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _unique_names(tables: list[Table]) -> list[Table]:
    """Suffix ``-2``, ``-3`` ... to names that collide after sanitizing."""
    seen: dict[str, int] = {}
    out = []
    for t in tables:
        count = seen.get(t.name, 0) + 1
        seen[t.name] = count
        out.append(t if count == 1 else dataclasses.replace(t, name=f"{t.name}-{count}"))
    return out


# ----------------------------------------------------------------------------- rendering


def _cell_text(table: Table, cell: Cell | None, *, pm: str, missing: str, n1: str) -> str:
    if cell is None:
        return missing
    digits = table.info.digits
    text = format_number(cell.mean, digits)
    if cell.half_width is not None:
        text += f" {pm} {format_number(cell.half_width, digits)}"
    elif table.mixed_n():
        text += f" {n1}"
    return text


def render_markdown(table: Table) -> str:
    """GitHub-flavoured Markdown: caption paragraph, then the table (best per column bold)."""
    best = {c.key: table.best(c) for c in table.columns}
    lines = [f"**{table.title()}.** {table.caption()}", ""]
    lines.append("| encoding | " + " | ".join(c.label() for c in table.columns) + " |")
    lines.append("|:--|" + "--:|" * len(table.columns))
    for e in table.encodings:
        cells = []
        for c in table.columns:
            text = _cell_text(table, table.cell(e, c), pm="±", missing=MISSING_MD, n1="(n=1)")
            cells.append(f"**{text}**" if e in best[c.key] else text)
        lines.append(f"| {_md_escape(e)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "[": "{[}",
    "]": "{]}",
    "±": r"$\pm$",
    "×": r"$\times$",
    "–": "--",
    "—": "---",
    "−": "$-$",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX special characters (``_`` -> ``\\_``, ``%`` -> ``\\%``, ``±`` -> ``$\\pm$``)."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def render_latex(table: Table) -> str:
    """A booktabs ``table`` float (``\\toprule``/``\\midrule``/``\\bottomrule``) to ``\\input``.

    Needs ``\\usepackage{booktabs}``; the label is ``tab:<table name>``.
    """
    best = {c.key: table.best(c) for c in table.columns}
    lines = [
        f"% {table.name}: generated by flaxformer_lite.experiments.report from results rows.",
        "% Requires \\usepackage{booktabs}.",
        "\\begin{table}[htbp]",
        "\\centering",
        f"\\caption{{{latex_escape(table.caption())}}}",
        f"\\label{{tab:{table.name}}}",
        "\\begin{tabular}{l" + "r" * len(table.columns) + "}",
        "\\toprule",
        "Encoding & " + " & ".join(c.latex_label() for c in table.columns) + " \\\\",
        "\\midrule",
    ]
    for e in table.encodings:
        cells = []
        for c in table.columns:
            cell = table.cell(e, c)
            text = _cell_text(table, cell, pm="$\\pm$", missing=MISSING_TEX, n1="($n{=}1$)")
            cells.append(f"\\textbf{{{text}}}" if e in best[c.key] else text)
        lines.append(f"{latex_escape(e)} & " + " & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "table",
    "study",
    "metric",
    "protocol",
    "task",
    "train_length",
    "encoding",
    "eval_length",
    "eval_multiple",
    "bucket",
    "mean",
    "ci_half_width",
    "n",
)


def _csv_number(x: float | None) -> str:
    return "" if x is None else repr(float(x))


def render_csv(table: Table) -> str:
    """One line per encoding x column: ``mean``, ``ci_half_width`` (empty for n=1), ``n``.

    Full-precision numbers, no ± strings; a cell that was not measured has ``n = 0`` and empty
    ``mean``/``ci_half_width``.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for e in table.encodings:
        for c in table.columns:
            cell = table.cell(e, c)
            multiple = c.multiple
            writer.writerow(
                [
                    table.name,
                    table.study or "",
                    table.metric,
                    table.protocol or "",
                    table.task or "",
                    table.train_length or "",
                    e,
                    c.eval_length,
                    "" if multiple is None else f"{multiple:g}",
                    c.bucket or "",
                    _csv_number(None if cell is None else cell.mean),
                    _csv_number(None if cell is None else cell.half_width),
                    0 if cell is None else cell.n,
                ]
            )
    return buf.getvalue()


# ----------------------------------------------------------------------------- plots


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
            if cell is not None:
                points.append((c.eval_length, cell.mean, cell.half_width))
        out[e] = points
    return out


def _band_note(tables: Sequence[Table]) -> str:
    if all(c.n == 1 for t in tables for c in t.cells.values()):
        return "One seed (n=1): no CI bands."
    return f"Bands: {CONFIDENCE:.0%} CI across seeds (Student t) where n > 1."


def _make_plots(
    rows: Sequence[Mapping[str, Any]], tables: Sequence[Table], out_dir: Path
) -> list[PlotInfo]:
    styles = plots.encoding_styles(encoding_order(r["encoding"] for r in rows))
    studies = {r.get("study") for r in rows}
    figures = []
    for t in tables:
        if t.metric != "bits_per_byte":
            continue
        stem = f"plots/{t.name}_vs_length"
        where = "".join(f" — {p}" for p in (t.study if len(studies) > 1 else None, t.protocol) if p)
        title = f"{t.info.title} vs evaluation length{where}"
        plots.plot_vs_length(
            _series(t),
            out_dir / stem,
            train_length=t.train_length,
            ylabel=f"{t.info.title.lower()} ({t.info.unit})",
            title=title,
            styles=styles,
        )
        caption = (
            f"{t.info.title} vs evaluation length (log2 axis) per encoding; dashed line: "
            f"training length. {_band_note([t])}"
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
    curves_rows = [r for r in rows if r["metric"] == "loss_by_position"]
    groups = _by(curves_rows, _group_key)
    many_studies = len({r.get("study") for r in rows}) > 1
    names = table_names(("loss_by_position", key) for key in groups)
    taken = {t.name for t in tables}
    figures = []
    for key, rs in groups.items():
        study, protocol, _, train_length = key
        longest = max(r["eval_length"] for r in rs)
        rs = [r for r in rs if r["eval_length"] == longest]
        by_encoding = _by(rs, lambda r: r["encoding"])
        order = [e for e in encoding_order(r["encoding"] for r in rows) if e in by_encoding]
        curves = {e: plots.mean_curve([r["value"] for r in by_encoding[e]]) for e in order}
        window = max(1, (train_length or longest) // 8)
        name = names[("loss_by_position", key)]
        if name in taken:
            name += "-curve"
        stem = f"plots/{name}"
        where = "".join(f" — {p}" for p in (study if many_studies else None, protocol) if p)
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
    return f"`{x}`"


def _listing(label: str, counted: Sequence[tuple[Any, int]], fmt) -> str:
    """``- label: a; b`` with row counts when the rows disagree."""
    if not counted:
        return f"- {label}: not recorded"
    many = len(counted) > 1
    return f"- {label}: " + "; ".join(fmt(v) + (f" ({n} rows)" if many else "") for v, n in counted)


def _describe_packages(packages: Any) -> str:
    if isinstance(packages, dict):
        return _join(f"{k} {v}" for k, v in packages.items())
    return str(packages)


def _provenance_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    commands = [c for c, _ in _counted(rows, "command")]
    if commands:
        lines += ["Command(s) that produced the rows:", "", "```", *map(str, commands), "```", ""]
    lines += [
        _listing("Git commit(s)", _counted(rows, "git_commit"), _code),
        _listing("Packages", _counted(rows, "packages"), _describe_packages),
        _listing("Python", _counted(rows, "python"), str),
        _listing(
            "Backend / device",
            _counted(rows, ("backend", "device_kind", "device_count")),
            lambda v: "{} / {} × {}".format(*("?" if x is None else x for x in v)),
        ),
        _listing("Corpus", _counted(rows, "data"), _describe_data),
    ]
    full = [data for data, _ in _counted(rows, "data") if isinstance(data, dict)]
    if full:
        lines += ["", "<details><summary>Corpus provenance (as recorded in the rows)</summary>", ""]
        lines += ["```json", *(json.dumps(d, indent=1, sort_keys=True) for d in full), "```"]
        lines += ["", "</details>"]
    return lines


def _describe_data(data: Any) -> str:
    """Name, content hash, size and file count of a corpus provenance dict."""
    if not isinstance(data, dict):
        return str(data)
    parts = [str(data["name"])] if "name" in data else []
    if "sha256" in data:
        parts.append(f"sha256 {_code(data['sha256'])}")
    size = data.get("num_bytes", data.get("bytes"))
    if size is not None:
        parts.append(f"{size} bytes")
    if data.get("num_files") is not None:
        parts.append(f"{data['num_files']} files")
    return ", ".join(parts) or _code(json.dumps(data, sort_keys=True))


def _setup_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    train = math.fsum(r["train_seconds"] for r in runs)
    evaluation = math.fsum(r["eval_seconds"] for r in runs)
    studies = [
        f"{s} ({p})" if p else str(s)
        for s, p in dict.fromkeys((r.get("study"), r.get("preset")) for r in rows)
    ]
    encodings = encoding_order(r["encoding"] for r in rows)
    seeds = sorted((s for s in _distinct(rows, "seed") if s is not None), key=_number_first)
    protocols = [p for p in _distinct(rows, "protocol") if p]
    tasks = [t for t in _distinct(rows, "task") if t]
    train_lengths = sorted(n for n in _distinct(rows, "train_length") if n)
    eval_lengths = sorted(n for n in _distinct(rows, "eval_length") if n)
    stamps = sorted(t for t in _distinct(rows, "timestamp") if isinstance(t, str))
    lines = [
        "| | |",
        "|:--|:--|",
        f"| Study (preset) | {_join(studies)} |",
        f"| Encodings ({len(encodings)}) | {_join(encodings)} |",
        f"| Seeds | {_join(seeds) or MISSING_MD} |",
        f"| Train length L | {_join(train_lengths) or MISSING_MD} |",
        f"| Evaluation lengths | {_join(eval_lengths)} |",
        f"| Protocols | {_join(protocols) or MISSING_MD} |",
    ]
    if tasks:
        lines.append(f"| Tasks | {_join(tasks)} |")
    lines += [
        f"| Runs / rows | {len(runs)} / {len(rows)} |",
        f"| Wall time (sum over runs) | {_fmt_seconds(train + evaluation)} = "
        f"{_fmt_seconds(train)} training + {_fmt_seconds(evaluation)} evaluation |",
    ]
    if stamps:
        span = stamps[0] if len(stamps) == 1 else f"{stamps[0]} … {stamps[-1]}"
        lines.append(f"| Runs finished | {span} |")
    return lines


def _runs_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    many_studies = len({r["study"] for r in runs}) > 1
    head = ["study"] if many_studies else []
    head += ["run", "seed", "encodings", "config hash", "commit", "backend"]
    head += ["train s", "eval s"]
    lines = ["| " + " | ".join(head) + " |", "|" + ":--|" * (len(head) - 2) + "--:|--:|"]
    for r in runs:
        cells = [str(r["study"])] if many_studies else []
        cells += [
            str(r["run"]),
            str(r["seed"]),
            _join(r["encodings"]),
            _code(r["config_hash"]),
            _code(r["git_commit"]),
            str(r["backend"]),
            f"{r['train_seconds']:.1f}",
            f"{r['eval_seconds']:.1f}",
        ]
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
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
) -> str:
    """The text of ``REPORT.md`` (links are relative to the report's directory)."""
    lines = [
        f"# {title or _default_title(rows)}",
        "",
        f"Generated from {len(rows)} results rows alone by `flaxformer_lite.experiments.report` "
        "(regenerate with `python scripts/make_report.py RUN_DIR [RUN_DIR ...]`). Tables are "
        "also in `tables/` as LaTeX (booktabs) and CSV; figures in `plots/` as PNG and PDF.",
        "",
        "## Setup",
        "",
        *_setup_lines(rows),
        "",
    ]
    if problems:
        lines += [
            "## Problems",
            "",
            f"{len(problems)} results line(s) were skipped; they are not in any table:",
            "",
            *["- `" + str(p).replace("`", "'") + "`" for p in problems],
            "",
        ]
    lines += ["## Results", ""]
    main = [t for t in tables if t.metric in MAIN_METRICS]
    other = [t for t in tables if t.metric not in MAIN_METRICS]
    for t in main:
        lines += [
            f"### {t.title()}",
            "",
            render_markdown(t).rstrip("\n"),
            "",
            f"[LaTeX](tables/{t.name}.tex) · [CSV](tables/{t.name}.csv) · "
            f"[Markdown](tables/{t.name}.md)",
            "",
        ]
    if other:
        lines += [
            "Other tables: "
            + _join(f"[{t.title()}](tables/{t.name}.md)" for t in other)
            + " (each also as `.tex` and `.csv`).",
            "",
        ]
    if figures:
        lines += ["## Plots", ""]
        for f in figures:
            lines += [
                f"### {f.title}",
                "",
                f"![{f.title}]({f.stem}.png)",
                "",
                f"{f.caption} ([PDF]({f.stem}.pdf))",
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
) -> Path:
    """Write ``tables/*.{md,tex,csv}``, ``plots/*.{png,pdf}`` and ``REPORT.md`` into ``out_dir``.

    Args:
      rows: results rows (`results.load_rows`).
      out_dir: the report directory (created if needed).
      problems: skipped results lines (`results.Problem` or strings), stated in the report.
      title: the report's heading (default: the studies and presets of the rows).

    Returns:
      The path of ``REPORT.md``. The same rows give byte-identical tables and ``REPORT.md``.

    Raises:
      ValueError: no rows.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("write_report needs at least one results row; got none")
    out_dir = Path(out_dir)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    tables = build_tables(rows)
    for t in tables:
        for suffix, text in (
            (".md", render_markdown(t)),
            (".tex", render_latex(t)),
            (".csv", render_csv(t)),
        ):
            _write_text(out_dir / "tables" / f"{t.name}{suffix}", text)
    figures = _make_plots(rows, tables, out_dir)
    report = out_dir / "REPORT.md"
    _write_text(report, render_report(rows, tables, figures, problems=list(problems), title=title))
    return report


def _write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a table."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
