"""The study tables: rows grouped into one `StudyResults` per metric and group, mean ± 95% CI
per cell and its marks; each makes its `table.Table` (`StudyResults.table`).

* `build_tables` groups rows into `StudyResults`: one per metric x protocol (x task, x train
  length, study or model size -- the rows' ``model_size`` -- when several are present).
  Rows = encodings, in the order they first appear with each model's variants (RoPE
  scaling, randomized positions) right after it
  (`encoding_order`, from the rows' ``positional`` and ``variant`` fields);
  columns = evaluation lengths ("2× (128)"), or window-offset buckets at the longest length for
  ``bucket_loss``; cells = mean ± 95% Student-t CI across seeds (`stats.mean_ci`).
* `StudyResults.table`: the encodings as rows, the columns' cells with their marks, and the CSV
  (one record per encoding x column).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flaxformer_lite.report.table import (
    MISSING_MD,
    NOT_APPLICABLE,
    ONE_SEED,
    Cell,
    Column,
    Table,
    latex_escape,
    sentence,
)
from flaxformer_lite.results import significance
from flaxformer_lite.results.significance import KEY_NGRAM
from flaxformer_lite.results.stats import mean_ci

CONFIDENCE = 0.95
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
    "ci_low",
    "ci_high",
    "interval",
    "mark",
    "n",
    "note",
)


# The name of a table's intervals, in its caption and in its CSV's ``interval`` field: Student t
# over seeds, or Student t (Welch-Satterthwaite df) over seeds plus a bootstrap of the evaluation
# files, each with its blocks, or of the blocks themselves where no file is recorded
# (`significance.interval`); REPORT.md's "Protocols and intervals" defines them.
INTERVAL_NAMES = {
    "t": "t_seeds",
    "bootstrap": "t_seeds_bootstrap_blocks",
    "files": "t_seeds_bootstrap_files",
}


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """How a metric is named and shown: title, unit, which direction is better, decimals."""

    title: str
    unit: str = ""
    better: str | None = None  # "lower", "higher" or None (no best marked)
    digits: int = 3
    about: str = ""  # a sentence defining the metric, after the caption's first


METRICS: dict[str, MetricInfo] = {
    "bits_per_byte": MetricInfo("Bits per byte", "bits/byte", "lower"),
    "key_bits_per_byte": MetricInfo(
        "Bits per key byte",
        "bits/byte of the key targets",
        "lower",
        about=(
            f"Key targets: those whose {KEY_NGRAM} tokens ending at the target occurred "
            "earlier only more than L tokens before their block, within the longest context "
            "(a copy from beyond L predicts them; LongPPL's key tokens, arXiv 2410.23771, "
            "with an exact copy model as the reference)."
        ),
    ),
    "exact_match": MetricInfo("Exact match", "fraction of examples", "higher"),
    "accuracy": MetricInfo("Accuracy", "fraction of target tokens", "higher"),
    "bucket_loss": MetricInfo("Loss by window-offset bucket", "nats/token", "lower"),
    "loss": MetricInfo("Loss", "nats/token", "lower"),
    "perplexity": MetricInfo("Perplexity", "", "lower", digits=2),
}
# Tables of these metrics are embedded in REPORT.md; the others are linked.
MAIN_METRICS = ("bits_per_byte", "key_bits_per_byte", "exact_match", "accuracy", "bucket_loss")
_METRIC_ORDER = {m: i for i, m in enumerate(METRICS)}


def metric_info(metric: str) -> MetricInfo:
    """`MetricInfo` of ``metric`` (an unknown metric is shown by name, with no best marked)."""
    return METRICS.get(metric, MetricInfo(metric))


# ----------------------------------------------------------------------------- tables


@dataclasses.dataclass(frozen=True)
class EvalColumn:
    """A table column: an evaluation length, or a window-offset bucket at one length."""

    key: Any
    eval_length: int
    train_length: int | None
    bucket: str | None = None

    @property
    def multiple(self) -> float | None:
        """Evaluation length as a multiple of the training length."""
        return self.eval_length / self.train_length if self.train_length else None

    def label(self, latex: bool = False) -> str:
        """The header: ``"2× (128)"``, a bucket ``"[64,128)"``, or ``"128"``; in LaTeX
        (``latex``): ``"$2\\times$ (128)"``, ``"{[}64,128)"``, or ``"128"``."""
        if self.bucket is not None:
            return latex_escape(self.bucket) if latex else self.bucket
        if self.multiple is None:
            return str(self.eval_length)
        times = f"${self.multiple:g}\\times$" if latex else f"{self.multiple:g}×"
        return f"{times} ({self.eval_length})"


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """Aggregate of one (encoding, column): mean, CI half width (None: no interval), n seeds;
    ``low``/``high`` the interval's ends; or, when the model cannot be evaluated there,
    ``na`` (the reason) and no numbers. ``grid``: the per-block data (None without)."""

    mean: float
    half_width: float | None
    n: int
    seeds: tuple[Any, ...] = ()
    na: str | None = None
    low: float | None = None
    high: float | None = None
    grid: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class StudyResults:
    """One results table: ``cells[(encoding, column.key)]`` (absent = not measured)."""

    name: str
    metric: str
    study: str | None
    protocol: str | None
    task: str | None
    train_length: int | None
    eval_length: int | None  # bucket tables: the evaluation length the buckets come from
    encodings: tuple[str, ...]
    columns: tuple[EvalColumn, ...]
    cells: Mapping[tuple[str, Any], Aggregate]
    strides: tuple[int, ...] = ()
    # column key -> ("best", {encoding}) | ("tie", {encodings}) from paired tests
    marks: Mapping[Any, tuple[str, frozenset[str]]] = dataclasses.field(default_factory=dict)
    method: str = "t"  # "bootstrap" (seeds x blocks) or "t" (Student t over seeds)
    blocks: tuple[int, int, str] | None = None  # (number, size, unit) of the data blocks
    # (number, "files" or "blocks"): what the data part of the intervals resamples
    units: tuple[int, str] | None = None
    effective_units: float | None = None  # Kish's effective number of those units
    context_block: int | None = None  # the context protocol's scored block S
    model_size: str | None = None  # the rows' model_size (a study sweeping model sizes)
    note: str = ""  # a sentence ending the caption (e.g. which learning rates the rows have)

    @property
    def info(self) -> MetricInfo:
        return metric_info(self.metric)

    @property
    def group(self) -> tuple[Any, ...]:
        """``(study, task, train_length, model_size)``: its rows' `comparable.table_group`."""
        return (self.study, self.task, self.train_length, self.model_size)

    def title(self) -> str:
        """Short heading, e.g. ``"Bits per byte — nonoverlapping"``."""
        parts = [self.info.title]
        if self.metric == "bucket_loss" and self.eval_length:
            parts[0] += f" at length {self.eval_length}"
        where = [p for p in (self.task, None if self.task else self.protocol) if p]
        if self.model_size:
            where.append(f"model {self.model_size}")
        if where:
            parts.append(", ".join(where))
        return " — ".join(parts)

    def caption(self) -> str:
        """Plain-text caption: what is shown, the setting, the statistic and n. The protocols
        and the intervals are defined once, in the report's "Protocols and intervals"
        section (`protocols_section`), so a caption names them and stays short."""
        info = self.info
        unit = f" ({info.unit})" if info.unit else ""
        better = f", {info.better} is better" if info.better else ""
        text = [f"{info.title}{unit}{better}.", *([info.about] if info.about else [])]
        named = (("study", self.study), ("task", self.task), ("model size", self.model_size))
        setting = [f"{name} {value}" for name, value in named if value]
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
        elif self.protocol == "context" and self.train_length:
            s_text = f"{self.context_block}" if self.context_block else "S"
            setting.append(f"columns: context c in multiples of L (S = {s_text})")
        elif self.train_length:
            unit = "task length" if self.task else "tokens"
            setting.append(f"columns: evaluation length in multiples of L ({unit})")
        if setting:
            text.append(sentence("; ".join(setting)))
        text.append(self.n_note())
        text.append(self.marks_note())
        if any(self.cell(e, c) is None for e in self.encodings for c in self.columns):
            text.append(f"{MISSING_MD}: not measured.")
        reasons = sorted({c.na for c in self.cells.values() if c.na})
        if reasons:
            text.append(f"{NOT_APPLICABLE}: {'; '.join(reasons)}.")
        if self.note:
            text.append(self.note)
        return " ".join(text)

    @property
    def interval_name(self) -> str:
        """`INTERVAL_NAMES` of this table's intervals."""
        if self.method == "bootstrap" and self.units and self.units[1] == "files":
            return INTERVAL_NAMES["files"]
        return INTERVAL_NAMES[self.method]

    def n_note(self) -> str:
        """The statistic and the number of samples, e.g. ``n=1: no interval``."""
        ns = sorted({c.n for c in self.cells.values() if c.na is None}) or [0]
        n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]} per cell; see CSV"
        if self.method == "bootstrap" and self.blocks:
            count, size, unit = self.blocks
            units, unit_name = self.units or (count, "blocks")
            data = f"{units} files" if unit_name == "files" else f"{count} blocks of {size} {unit}"
            if unit_name == "files" and self.protocol == "context":  # a region spans files
                data = (
                    f"{count} target regions, grouped by their first target's file: {units} files"
                )
            if unit_name == "files" and self.effective_units is not None:
                # unequal files weigh like fewer equal ones (the coverage: docs/design.md §7)
                data += f", Kish effective number {self.effective_units:.1f}"
            name = self.interval_name
            return (
                f"Mean ± {CONFIDENCE:.0%} interval over seeds and evaluation {unit_name} "
                f"({name}; seeds: {n}; {data})."
            )
        if ns == [1]:
            return "One seed per cell (n=1: no interval)."
        note = (
            f"Mean ± {CONFIDENCE:.0%} interval over seeds ({INTERVAL_NAMES['t']}: Student t, "
            f"n={n})."
        )
        if ns[0] == 1:
            note += " Cells marked (n=1) have no interval."
        repeated = any(
            len(set(seeds)) < len(seeds)
            for seeds in ([s for s in c.seeds if s is not None] for c in self.cells.values())
        )
        if repeated:
            note += " Some cells hold several measurements of one seed (merged runs)."
        return note

    def cell(self, encoding: str, column: EvalColumn) -> Aggregate | None:
        return self.cells.get((encoding, column.key))

    def marks_note(self) -> str:
        """What bold and italic mean in this table (or why nothing is marked)."""
        if self.info.better is None or len(self.encodings) < 2:
            return ""
        if self.marks:
            return "Bold: significantly best; italic: tied for best (paired tests)."
        if self.method == "bootstrap":
            return "Nothing is marked: the paired tests support no column's best."
        return "Nothing is marked: no per-block data to test differences with."

    def mark(self, encoding: str, column: EvalColumn) -> str | None:
        """``"best"``, ``"tie"`` or None for one cell."""
        kind, members = self.marks.get(column.key, (None, frozenset()))
        return kind if encoding in members else None

    def mixed_n(self) -> bool:
        return len({c.n for c in self.cells.values() if c.na is None}) > 1

    def table(self) -> Table:
        """The `table.Table`: one row per encoding, a significant best bold, a tie italic; the
        LaTeX caption without the title."""
        columns = [Column("encoding", "l", tex="Encoding")]
        columns += [Column(c.label(), tex=c.label(latex=True)) for c in self.columns]
        rows = tuple(
            (Cell(e), *(self._display(e, c) for c in self.columns)) for e in self.encodings
        )
        return Table(
            name=self.name,
            title=self.title(),
            caption=self.caption(),
            columns=tuple(columns),
            rows=rows,
            csv_fields=CSV_FIELDS,
            csv_rows=tuple(self._record(e, c) for e in self.encodings for c in self.columns),
            latex_title=False,
        )

    def _display(self, encoding: str, column: EvalColumn) -> Cell:
        cell = self.cell(encoding, column)
        if cell is None:
            return Cell()
        if cell.na is not None:
            return Cell(NOT_APPLICABLE)
        one_seed = cell.half_width is None and self.mixed_n()
        return Cell(
            cell.mean,
            cell.half_width,
            note=ONE_SEED if one_seed else "",
            mark=self.mark(encoding, column),
            digits=self.info.digits,
        )

    def _record(self, encoding: str, column: EvalColumn) -> tuple[Any, ...]:
        """A CSV line: full-precision numbers; not measured: ``n = 0`` and no numbers; not
        applicable: ``n = 0``, no numbers and ``note`` = ``n/a: <reason>``."""
        cell = self.cell(encoding, column)
        multiple = column.multiple
        return (
            self.name,
            self.study or "",
            self.metric,
            self.protocol or "",
            self.task or "",
            self.train_length or "",
            encoding,
            column.eval_length,
            "" if multiple is None else f"{multiple:g}",
            column.bucket or "",
            number(None if cell is None or cell.na else cell.mean),
            number(None if cell is None else cell.half_width),
            number(None if cell is None else cell.low),
            number(None if cell is None else cell.high),
            "" if cell is None or cell.half_width is None else self.interval_name,
            self.mark(encoding, column) or "",
            0 if cell is None else cell.n,
            "" if cell is None or cell.na is None else f"{NOT_APPLICABLE}: {cell.na}",
        )


def encoding_order(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Display labels (``row["encoding"]``) in order of first appearance, each model's
    variants right after it.

    Rows are grouped by the trained encoding (``row["positional"]``; a hand-made row without
    it is its label's model): the trained model as it is (``variant`` ``"base"``, not
    randomized) comes first, then its evaluation-time variants and randomized-position
    training, in order of first appearance; a group sits where its base first appears (or its
    first label, when the base is absent). Labels are never parsed.
    """
    group: dict[str, Any] = {}
    base: dict[Any, str] = {}
    for r in rows:
        label = r["encoding"]
        if label in group:
            continue
        group[label] = key = r.get("positional") or label
        if is_base(r) and not r.get("randomized_positions"):
            base.setdefault(key, label)
    members = group_by(group, lambda label: group[label])
    out = []
    for label, key in group.items():
        anchor = base.get(key, members[key][0])
        if label == anchor:
            out += [anchor] + [m for m in members[key] if m != anchor]
    return out


def is_base(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` scores the trained model as it is (no evaluation-time variant)."""
    return row.get("variant", "base") == "base"


def number(x: Any) -> float | None:
    """A row's field as a float when it is a number (not a bool), else None."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    return None


def _bucket_lo(bucket: str) -> tuple[float, str]:
    m = re.match(r"\s*[\[(]\s*(-?\d+)", bucket)
    return (float(m.group(1)) if m else math.inf, bucket)


def group_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """``(study, protocol, task, train_length, model_size)``: the rows of one table."""
    return (
        row.get("study"),
        row.get("protocol"),
        row.get("task"),
        row.get("train_length"),
        row.get("model_size"),
    )


def table_names(keys: Iterable[tuple[str, tuple[Any, ...]]]) -> dict[tuple[str, Any], str]:
    """File stems for ``(metric, (study, protocol, task, train_length, model_size))`` keys.

    ``metric[_protocol][_task]`` (protocol ``task`` is implied by a task name), prefixed by the
    study and suffixed by ``_L<train length>`` and ``_<model size>`` only where that is needed
    to tell keys apart, so a single-study report has stable names like
    ``bits_per_byte_nonoverlapping``.
    """
    keys = list(dict.fromkeys(keys))
    families: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for metric, (study, protocol, task, train_length, size) in keys:
        families.setdefault((metric, protocol, task), []).append((study, train_length, size))
    names = {}
    for metric, key in keys:
        study, protocol, task, train_length, size = key
        members = families[(metric, protocol, task)]
        parts = [str(study)] if study and len({m[0] for m in members}) > 1 else []
        parts.append(metric)
        if protocol and protocol != "task":
            parts.append(str(protocol))
        if task:
            parts.append(str(task))
        if train_length and len({m[1] for m in members}) > 1:
            parts.append(f"L{train_length}")
        if size and len({m[2] for m in members}) > 1:
            parts.append(str(size))
        names[(metric, key)] = re.sub(r"[^A-Za-z0-9_.+-]+", "-", "_".join(parts))
    return names


def _aggregate(
    groups: Mapping[tuple[str, Any], list[Mapping[str, Any]]],
    index: significance.BlockIndex,
    metric: str,
) -> dict:
    cells = {}
    for key, rs in groups.items():
        seeds = tuple(r.get("seed") for r in rs)
        measured = [r for r in rs if r.get("na") is None]
        if not measured:  # every seed says the model cannot be evaluated here
            cells[key] = Aggregate(math.nan, None, 0, seeds, na=str(rs[0]["na"]))
            continue
        mean, half, n = mean_ci([r["value"] for r in measured], confidence=CONFIDENCE)
        grid = index.grid(measured, metric)
        cells[key] = Aggregate(mean, half, n, tuple(r.get("seed") for r in measured), grid=grid)
    return cells


def _with_block_intervals(cells: dict) -> dict:
    """Every measured cell's interval from its seeds and blocks (`significance.interval`) in
    place of its Student-t one: only for a table whose measured cells all have block data, so
    one caption describes every cell."""
    out = dict(cells)
    for key, cell in cells.items():
        if cell.grid is not None:
            _, low, high = significance.interval(cell.grid, CONFIDENCE)
            out[key] = dataclasses.replace(cell, half_width=(high - low) / 2, low=low, high=high)
    return out


def _marks(table: StudyResults) -> dict[Any, tuple[str, frozenset[str]]]:
    marks = {}
    for column in table.columns:
        cells = {e: table.cell(e, column) for e in table.encodings}
        cells = {e: c for e, c in cells.items() if c is not None and c.na is None}
        grids = {e: c.grid for e, c in cells.items() if c.grid is not None}
        means = {e: c.mean for e, c in cells.items() if math.isfinite(c.mean)}
        mark = significance.column_marks(grids, means, table.info.better or "")
        if mark is not None:
            marks[column.key] = mark
    return marks


def build_tables(
    rows: Sequence[Mapping[str, Any]], blocks: Iterable[Mapping[str, Any]] = ()
) -> list[StudyResults]:
    """Group scalar rows into tables (see the module docstring); ``loss_by_position`` is plotted,
    not tabulated. Tables are ordered by study, then metric (bits/byte, exact match, accuracy,
    buckets, loss, perplexity, others by name), then first appearance.

    ``blocks``: the per-block records beside the rows (``blocks.jsonl``); with them, cells carry
    intervals from the seeds and a bootstrap of the blocks, and each column marks a significant
    best or a tie (`flaxformer_lite.results.significance`); without them, Student-t
    intervals over seeds and no marks."""
    index = significance.BlockIndex(blocks)
    order = encoding_order(rows)
    studies = list(dict.fromkeys(r.get("study") for r in rows))
    scalar = (r for r in rows if r["metric"] != "loss_by_position")
    grouped = group_by(scalar, lambda r: (r["metric"], group_key(r)))
    names = table_names(grouped)
    tables = [
        _results(names[(metric, key)], metric, key, rs, index, order)
        for (metric, key), rs in grouped.items()
    ]
    first = list(grouped)
    tables.sort(
        key=lambda t: (
            studies.index(t.study),
            _METRIC_ORDER.get(t.metric, len(_METRIC_ORDER)),
            "" if t.metric in _METRIC_ORDER else t.metric,
            first.index((t.metric, (t.study, t.protocol, t.task, t.train_length, t.model_size))),
        )
    )
    return _unique_names(tables)


def _results(name, metric, key, rs, index, order) -> StudyResults:
    """The `StudyResults` of one metric and group (``key``, `group_key`) from its rows."""
    study, protocol, task, train_length, size = key
    eval_length = None
    if metric == "bucket_loss":
        eval_length = max(r["eval_length"] for r in rs)
        rs = [r for r in rs if r["eval_length"] == eval_length]
        buckets = sorted({r["bucket"] for r in rs}, key=_bucket_lo)
        columns = tuple(EvalColumn(b, eval_length, train_length, bucket=b) for b in buckets)
    else:
        lengths = sorted({r["eval_length"] for r in rs})
        columns = tuple(EvalColumn(n, n, train_length) for n in lengths)
    field = "bucket" if metric == "bucket_loss" else "eval_length"  # a column's key
    cells = _aggregate(group_by(rs, lambda r: (r["encoding"], r[field])), index, metric)
    grids = [c.grid for c in cells.values() if c.grid is not None]
    measured = [c for c in cells.values() if c.na is None]
    bootstrap = bool(measured) and all(c.grid is not None for c in measured)
    context_blocks = {r.get("context_block") for r in rs} - {None}
    present = {r["encoding"] for r in rs}
    table = StudyResults(
        name=name,
        metric=metric,
        study=study,
        protocol=protocol,
        task=task,
        train_length=train_length,
        eval_length=eval_length,
        encodings=tuple(e for e in order if e in present),
        columns=columns,
        cells=_with_block_intervals(cells) if bootstrap else cells,
        strides=tuple(sorted({r["stride"] for r in rs if isinstance(r.get("stride"), int)})),
        method="bootstrap" if bootstrap else "t",
        blocks=(grids[0].values.shape[1], grids[0].block_size, grids[0].unit)
        if bootstrap
        else None,
        units=(grids[0].num_units, grids[0].unit_name) if bootstrap else None,
        effective_units=grids[0].effective_units if bootstrap else None,
        context_block=next(iter(context_blocks)) if len(context_blocks) == 1 else None,
        model_size=size,
    )
    return dataclasses.replace(table, marks=_marks(table)) if bootstrap else table


def group_by(rows: Iterable[Any], key) -> dict[Any, list[Any]]:
    """``{key(r): [r, ...]}`` in order of first appearance."""
    out: dict[Any, list[Any]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _unique_names(tables: list[StudyResults]) -> list[StudyResults]:
    """Suffix ``-2``, ``-3`` ... to names that collide after sanitizing."""
    seen: dict[str, int] = {}
    out = []
    for t in tables:
        count = seen.get(t.name, 0) + 1
        seen[t.name] = count
        out.append(t if count == 1 else dataclasses.replace(t, name=f"{t.name}-{count}"))
    return out
