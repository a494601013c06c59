"""The paired-differences table: each encoding against a reference, with a test for each cell.

For every (study, protocol, task, training length) group and every column, each encoding's
bits per byte (exact match for tasks) minus the reference encoding's, paired over the same
seeds and the same evaluation blocks (`significance.compare`): the difference, its 95 %
interval and a p-value (`stats.paired_difference`), Holm-corrected over the comparisons of
the table (one family per table). ``all_pairs=True`` compares every pair instead.

A second table per group compares each encoding with itself at L, on the same targets, seeds
and blocks: for the context protocol, "does this encoding use more context?" (c minus L,
negative: the extra context helped); for the window protocols, "does it hold up?" (L' minus
L). All are written as ``tables/paired_differences.{md,tex,csv}`` by the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from flaxformer_lite.report.study_tables import (
    INTERVAL_NAMES,
    EvalColumn,
    StudyResults,
    metric_info,
)
from flaxformer_lite.report.table import (
    GENERATED,
    Cell,
    Column,
    Table,
    latex_float,
)
from flaxformer_lite.report.table import render_csv as render_table_csv
from flaxformer_lite.report.table import render_markdown as render_table_markdown
from flaxformer_lite.results import significance, stats

DEFAULT_REFERENCE = "alibi"
# protocols whose columns score the same bytes at every length: each encoding vs itself at L
CHANGE_PROTOCOLS = ("nonoverlapping", "sliding", "context")
PAIRED_METRICS = ("bits_per_byte", "key_bits_per_byte", "exact_match")
P_FLOOR = 1e-4  # smaller p-values print as "p<1e-04"
CSV_FIELDS = (
    "study",
    "protocol",
    "task",
    "train_length",
    "metric",
    "encoding",
    "reference",
    "reference_length",
    "eval_length",
    "delta",
    "ci_low",
    "ci_high",
    "p",
    "p_holm",
    "significant",
    "seeds",
    "blocks",
    "files",
)


NONE_NOTE = (
    "None: a paired comparison needs per-block data (blocks.jsonl) with at least "
    f"{significance.MIN_BLOCKS} blocks per cell -- an evaluation capped to a few thousand "
    "targets has fewer -- and the reference encoding among the rows (or all pairs)."
)


@dataclasses.dataclass(frozen=True)
class Comparisons:
    """The comparisons of one group: ``pairs`` keyed by (encoding, reference, column key).

    ``reference_length``: None when each row compares two encodings at the same column; L,
    which every column is compared with, for a change-with-length table (``reference`` is
    then the row's own encoding and ``symbol`` names the column's length: ``c`` or ``L'``)."""

    title: str
    metric: str
    study: Any
    protocol: Any
    task: Any
    train_length: Any
    columns: tuple[EvalColumn, ...]
    pairs: tuple[significance.Pair, ...]
    reference_length: int | None = None
    symbol: str = "c"  # the compared length: context c, or evaluation length L'

    def rows(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((p.encoding, p.reference) for p in self.pairs))

    def row_label(self, encoding: str, reference: str) -> str:
        if self.reference_length is None:
            return f"{encoding} − {reference}"
        return f"{encoding} ({self.symbol}) − {encoding} ({self.reference_length})"

    def table(self) -> Table:
        """The `table.Table`: a row per compared pair, Δ [95% interval] and the Holm p per
        column; the CSV has one record per comparison."""
        if self.reference_length is None:
            head = Column("row − reference", "l", tex="Row $-$ reference")
        else:
            head = Column(
                f"encoding ({self.symbol}) − (L)", "l", tex=f"Encoding ({self.symbol}) $-$ (L)"
            )
        columns = (head, *(Column(c.label(), tex=c.label(latex=True)) for c in self.columns))
        rows = tuple(
            (Cell(self.row_label(a, b)), *(_cell(self.get(a, b, c)) for c in self.columns))
            for a, b in self.rows()
        )
        return Table(
            name="paired_differences",
            title=self.title,
            caption=caption(self),
            columns=columns,
            rows=rows,
            csv_fields=CSV_FIELDS,
            csv_rows=tuple(self._record(p) for p in self.pairs),
            label=False,
        )

    def _record(self, p: significance.Pair) -> tuple[Any, ...]:
        return (
            self.study or "",
            self.protocol or "",
            self.task or "",
            self.train_length or "",
            self.metric,
            p.encoding,
            p.reference,
            self.reference_length or "",
            p.eval_length,
            p.delta,
            p.low,
            p.high,
            p.p,
            p.p_holm,
            int(p.p_holm < significance.ALPHA),
            p.seeds,
            p.blocks,
            p.files,
        )

    def get(self, encoding: str, reference: str, column: EvalColumn) -> significance.Pair | None:
        for p in self.pairs:
            if (p.encoding, p.reference, p.eval_length) == (encoding, reference, column.key):
                return p
        return None


def build_paired_tables(
    tables: Sequence[StudyResults],
    *,
    reference: str | Sequence[str] = DEFAULT_REFERENCE,
    all_pairs: bool = False,
) -> list[Comparisons]:
    """One `Comparisons` per bits-per-byte / exact-match table (`tables.build_tables` with
    per-block data) -- a group without the reference encoding (and ``all_pairs=False``) is
    skipped -- and, for each table of a `CHANGE_PROTOCOLS` protocol with a column at L, its
    change-with-length table (each encoding at c or L' minus itself at L).

    ``reference``: one encoding, or several (a sequence, or names joined by commas): each
    table compares its rows with the first of them it holds, so a study whose tables are
    variants of one design (``fox``, ``fox+gpt_oss+sinks``, ``fox+ssmax``) names each table's
    own reference."""
    references = reference_names(reference)
    out = []
    for table in tables:
        if table.metric not in PAIRED_METRICS or table.method != "bootstrap":
            continue
        encodings = list(table.encodings)
        ref = next((r for r in references if r in encodings), None)
        if all_pairs:
            pairs = [(a, b) for i, a in enumerate(encodings) for b in encodings[i + 1 :]]
        elif ref is not None:
            pairs = [(e, ref) for e in encodings if e != ref]
        else:
            pairs = []
        what = table.info.title[:1].lower() + table.info.title[1:]
        title = table.title().replace(table.info.title, f"Paired differences in {what}")
        if pairs:
            found = [
                (a, b, column, table.cell(a, column), table.cell(b, column))
                for a, b in pairs
                for column in table.columns
            ]
            out.append(_paired_table(table, title, table.columns, found, None))
        base = next((c for c in table.columns if c.key == table.train_length), None)
        if table.protocol in CHANGE_PROTOCOLS and base is not None:
            columns = tuple(c for c in table.columns if c is not base)
            found = [
                (e, e, column, table.cell(e, column), table.cell(e, base))
                for e in encodings
                for column in columns
            ]
            symbol = "c" if table.protocol == "context" else "L'"
            name = "Context gain" if symbol == "c" else "Change with length"
            change = table.title().replace(table.info.title, f"{name} in {what} ({symbol} − L)")
            out.append(_paired_table(table, change, columns, found, base.eval_length, symbol))
    return [t for t in out if t.pairs]


def reference_names(reference: str | Sequence[str]) -> list[str]:
    """The reference encodings ``reference`` names, in order: ``"fox,fox+ssmax"`` and
    ``("fox", "fox+ssmax")`` give ``["fox", "fox+ssmax"]``."""
    parts = [reference] if isinstance(reference, str) else list(reference)
    names = [n.strip() for part in parts for n in str(part).split(",")]
    return list(dict.fromkeys(n for n in names if n))


def _paired_table(table, title, columns, found, reference_length, symbol="c") -> Comparisons:
    """The tested comparisons of ``found`` (a, b, column, cell a, cell b), Holm over all."""
    tested = []
    for a, b, column, ca, cb in found:
        if ca is None or cb is None or ca.grid is None or cb.grid is None:
            continue
        r = significance.compare(ca.grid, cb.grid)
        if r is not None:
            seeds = len([s for s in ca.grid.seeds if s in cb.grid.seeds])
            files = ca.grid.num_units if ca.grid.units is not None else 0
            tested.append((a, b, column, r, seeds, ca.grid.values.shape[1], files))
    adjusted = stats.holm([f[3]["p"] for f in tested])
    made = tuple(
        significance.Pair(a, b, col.key, r["delta"], r["low"], r["high"], r["p"], adj, s, nb, nf)
        for (a, b, col, r, s, nb, nf), adj in zip(tested, adjusted, strict=True)
    )
    return Comparisons(
        title,
        table.metric,
        table.study,
        table.protocol,
        table.task,
        table.train_length,
        tuple(columns),
        made,
        reference_length,
        symbol,
    )


def _cell(pair: significance.Pair | None) -> Cell:
    if pair is None:
        return Cell()
    if math.isnan(pair.p_holm):
        return Cell("n/a (non-finite values: not tested)")
    star = "*" if pair.p_holm < significance.ALPHA else ""
    note = f"p{_p_text(pair.p_holm)}{star}"
    return Cell(pair.delta, interval=(pair.low, pair.high), note=note, signed=True)


def _p_text(p: float) -> str:
    """``=0.0123`` or, below what a table needs to show, ``<1e-04`` (the CSV has the value)."""
    return f"<{P_FLOOR:.0e}" if p < P_FLOOR else f"={p:.3g}"


def caption(t: Comparisons) -> str:
    """At most ~50 words: what is subtracted, the units, and the interval and test (REPORT.md's
    "Protocols and intervals" defines them)."""
    n = sorted({p.seeds for p in t.pairs})
    blocks = sorted({p.blocks for p in t.pairs})
    files = sorted({p.files for p in t.pairs})
    by_files = bool(files and files[0])
    if by_files and t.protocol == "context":  # a region of targets spans files
        data = (
            f"{', '.join(map(str, blocks))} target regions ("
            f"{', '.join(map(str, files))} files by each region's first target)"
        )
    elif by_files:
        data = f"{', '.join(map(str, files))} evaluation files"
    else:
        data = f"{', '.join(map(str, blocks))} evaluation blocks"
    name = INTERVAL_NAMES["files" if by_files else "bootstrap"]
    info = metric_info(t.metric)
    what = info.unit or info.title.lower()
    better = "negative is better" if info.better == "lower" else "positive is better"
    if t.reference_length is None:
        head = f"Row minus reference, in {what} ({better})."
    elif t.symbol != "c":
        head = (
            f"Each encoding at L' minus itself at L = {t.reference_length}, in {what}, on the "
            "same bytes: positive means longer windows hurt."
        )
    else:
        head = (
            f"Each encoding at context c minus itself at c = {t.reference_length} (L), in "
            f"{what}, on the same bytes: negative means more context helped."
        )
    return (
        f"{head} Paired over {', '.join(map(str, n))} seed(s) and {data}: Δ, its 95% interval "
        f"({name}) and Welch's p, Holm-corrected over {len(t.pairs)} comparisons; "
        f"* p < {significance.ALPHA}."
    )


def render_markdown(tables: Sequence[Comparisons]) -> str:
    """``tables/paired_differences.md``: the tables one after another (or why there are none)."""
    return "\n".join(map(render_table_markdown, tables)) or f"Paired differences: {NONE_NOTE}\n"


def render_latex(tables: Sequence[Comparisons]) -> str:
    """``tables/paired_differences.tex``: one float per table."""
    lines = [f"% paired differences: {GENERATED}"]
    for t in tables:
        lines += [*latex_float(t), ""]
    return "\n".join(lines) + "\n"


def render_csv(tables: Sequence[Comparisons]) -> str:
    """``tables/paired_differences.csv``: every comparison of every table, full precision."""
    return render_table_csv(tables)
