"""Writing a report: ``write_report(rows, out_dir)`` checks that the rows may share tables
(`comparable`), builds every section's tables, writes them to ``tables/*.{md,tex,csv}``, the
figures to ``plots/`` and ``REPORT.md``; ``write_study_report`` does it for a study directory.

Rows of several learning rates per encoding (the ``lr`` preset) are tabulated at each
encoding's best rate, with ``tables/learning_rate.*`` showing every rate; rows of several model
sizes (``scaling``) get a table per size and ``tables/extrapolation_gap.*`` with its plot;
every report with run times has the cost per encoding (`cost`; in ``REPORT.md`` only:
wall-clock times, unlike the files in ``tables/``).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.report import cost, paired, sweep_report
from flaxformer_lite.report.document import render_report
from flaxformer_lite.report.figures import make_plots
from flaxformer_lite.report.paths import portable
from flaxformer_lite.report.study_tables import StudyResults, build_tables
from flaxformer_lite.report.table import render_csv, render_latex, render_markdown
from flaxformer_lite.results import comparable, store


def write_report(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    problems: Sequence[Any] = (),
    title: str | None = None,
    blocks: Sequence[Mapping[str, Any]] = (),
    reference: str | Sequence[str] = paired.DEFAULT_REFERENCE,
    all_pairs: bool = False,
    missing: Sequence[str] = (),
    common_rate: float | None = None,
    allow_mixed: Sequence[str] = (),
    origins: Sequence[str] | None = None,
    failed: Mapping[str, str] | None = None,
    plots: bool = True,
) -> Path:
    """Write ``tables/*.{md,tex,csv}``, ``plots/*.{png,pdf}`` and ``REPORT.md`` into ``out_dir``
    (see the module docstring for the sections) and return the path of ``REPORT.md``.

    Args:
      rows: results rows (`store.load_rows`).
      out_dir: the report directory (created if needed).
      problems: skipped results lines (`store.Problem` or strings), stated in the report.
      title: the report's heading (default: the studies and presets of the rows).
      blocks: the per-block records beside the rows (`store.load_blocks`): bootstrap
        intervals, significance marks and ``tables/paired_differences.{md,tex,csv}``.
      reference, all_pairs: the paired-differences tables' reference encoding (several: each
        table against the first it holds, `paired.reference_names`), or all pairs.
      missing: lines naming cells without results (merged shards), stated in the report.
      common_rate: the learning rate the ranking at each encoding's best rate is compared
        with (default: the grid's middle rate; the runner passes ``optim.learning_rate``).
      allow_mixed: fields (`comparable`) in which rows sharing a table may differ on purpose;
        the captions and REPORT.md say what was mixed.
      origins: each row's file, named when rows are refused (default: ``row N``).
      failed: cell -> its error line (a study's failed cells), stated in the report.
      plots: also draw ``plots/`` (False: tables and REPORT.md only, e.g. to check tables).

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
    # no path of this machine in REPORT.md: relative to out_dir, or named (`paths.portable`)
    stated = dict(
        problems=[portable(str(p), out_dir) for p in problems],
        title=title,
        missing=portable(list(missing), out_dir),
        failed=portable(dict(failed or {}), out_dir),
    )
    if not rows:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "REPORT.md", render_report([], [], [], **stated))
        return out_dir / "REPORT.md"
    verdict = comparable.check(rows, origins, allow_mixed)
    if verdict.refused:
        raise comparable.MixedRowsError(verdict.refused)
    pairing = dict(reference=reference, all_pairs=all_pairs)
    return _write_files(rows, out_dir, verdict, blocks, pairing, common_rate, stated, plots)


def _write_files(rows, out_dir: Path, verdict, blocks, pairing, common_rate, stated, plots):
    """Every section's tables, the figures and REPORT.md of rows that may share tables."""
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    choices = sweep_report.select_rates(rows)
    main_rows = sweep_report.rows_at_best_rates(rows, choices)  # rows itself without a grid
    tables = with_notes(_study_tables(main_rows, blocks, choices), verdict)
    derived = [sweep_report.learning_rate_table(choices, rows, common_rate)] if choices else []
    derived += sweep_report.gap_tables(main_rows) + cost.cost_tables(rows)
    for table in [*(d for d in derived if d.files), *tables]:
        _write_table(out_dir, table.name, table)
    pairs = paired.build_paired_tables(tables, **pairing)
    if pairs:
        renderers = (paired.render_markdown, paired.render_latex, paired.render_csv)
        _write_table(out_dir, "paired_differences", pairs, renderers)
    figures = make_plots(main_rows, tables, out_dir) if plots else []
    mixed = verdict.report_lines()
    shown = portable(list(rows), out_dir)
    text = render_report(
        shown, tables, figures, pairs=pairs, derived=derived, mixed=mixed, **stated
    )
    atomic_write_text(out_dir / "REPORT.md", text)
    return out_dir / "REPORT.md"


def _study_tables(rows, blocks, choices) -> list[StudyResults]:
    """The study tables (`build_tables`), each caption saying which learning rate each
    encoding has when the rows swept several."""
    return [
        dataclasses.replace(t, note=sweep_report.best_rate_note(choices, t.group))
        for t in build_tables(rows, blocks)
    ]


def _write_table(
    out_dir: Path, name: str, table: Any, renderers=(render_markdown, render_latex, render_csv)
) -> None:
    """``tables/<name>.{md,tex,csv}`` of a `table.Table` or a section's results (or, with
    their ``renderers``, the paired comparisons), each written atomically
    (`base.io.atomic_write_text`: a reader never sees half a table)."""
    for suffix, render in zip((".md", ".tex", ".csv"), renderers, strict=True):
        atomic_write_text(out_dir / "tables" / f"{name}{suffix}", render(table))


def with_notes(tables: Sequence[StudyResults], verdict: comparable.Verdict) -> list[StudyResults]:
    """``tables`` with what their rows differ in (mixed on purpose, patch releases) ending
    their captions (`comparable.Verdict.notes`)."""
    out = []
    for t in tables:
        if note := verdict.notes(t.group):
            t = dataclasses.replace(t, note=f"{t.note} {note}".strip())
        out.append(t)
    return out


def write_study_report(
    workdir: str | Path,
    *,
    reference: str | Sequence[str] = paired.DEFAULT_REFERENCE,
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
    rows, problems, origins = store.load_rows_with_origins([workdir])
    for problem in problems:
        warnings.warn(str(problem), store.ResultsWarning, stacklevel=2)
    if not rows and not (failed or missing):
        return None
    if not rows and title is None:
        title = _study_title(Path(workdir))
    blocks, foreign = store.paired_blocks([workdir], rows)
    for note in foreign:
        warnings.warn(note, store.ResultsWarning, stacklevel=2)
    files = [
        str(store.cell_rows_file(Path(workdir), r) or f)
        for r, (f, _) in zip(rows, origins, strict=True)
    ]
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


def study_reporter(config: Any) -> Callable[..., Path | None]:
    """The study runner's ``report`` for a study ``config``: `write_study_report` with the
    comparisons the config asks for (``eval.paired_reference``, ``eval.paired_all``) and its
    common learning rate (``optim.learning_rate``: a rate sweep's ranking is compared at it)."""
    evals = config.get("eval", {}) if hasattr(config, "get") else {}
    optim = config.get("optim", {}) if hasattr(config, "get") else {}

    def report(workdir: Path, *, failed: Mapping[str, str], missing: Sequence[str]) -> Path | None:
        return write_study_report(
            workdir,
            reference=evals.get("paired_reference", "alibi"),
            all_pairs=bool(evals.get("paired_all", False)),
            common_rate=optim.get("learning_rate"),
            failed=failed,
            missing=missing,
        )

    return report


def _study_title(workdir: Path) -> str:
    """``Results: <study> (<preset>)`` from the study's ``study.json`` (as rows would say)."""
    try:
        study = json.loads((workdir / "study.json").read_text(encoding="utf-8"))["study"]
        name, preset = str(study["name"]), str(study.get("preset") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return f"Results: {workdir.name}"
    return f"Results: {name} ({preset})" if preset else f"Results: {name}"
