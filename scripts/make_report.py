"""Write the tables, plots and REPORT.md of one or more study directories, from their rows alone.

    python scripts/make_report.py runs/quick
    python scripts/make_report.py runs/cpu runs/tpu --out=reports/merged

Rows of several run dirs (their ``results.jsonl``, and the per-block sums beside them in
``blocks.jsonl``) are merged: exact duplicates are dropped, distinct measurements kept. A
corrupted line is reported with its file and line number and skipped. The report goes into
``--out`` (default: the first RUN_DIR); the script prints the path of REPORT.md and the
Markdown bits-per-byte table(s). ``--reference`` / ``--all_pairs`` choose the comparisons of
``tables/paired_differences.{md,tex,csv}``.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from flaxformer_lite.base.io import write_error
from flaxformer_lite.experiments import report, results

_OUT = flags.DEFINE_string("out", None, "report directory (default: the first RUN_DIR)")
_TITLE = flags.DEFINE_string("title", None, "the report's heading (default: studies and presets)")
_REFERENCE = flags.DEFINE_string(
    "reference", "alibi", "paired differences: each encoding against this one"
)
_ALL_PAIRS = flags.DEFINE_bool("all_pairs", False, "paired differences: every pair of encodings")


def main(argv: list[str]) -> None:
    run_dirs = argv[1:]
    if not run_dirs:
        raise app.UsageError("usage: make_report.py RUN_DIR [RUN_DIR ...] [--out=DIR]")
    for run_dir in run_dirs:
        problem = _not_a_run_dir(run_dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    try:
        rows, problems = results.load_rows(run_dirs, return_problems=True, warn=False)
        blocks = results.load_blocks(run_dirs)
    except (FileNotFoundError, results.DuplicateRowsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # unreadable
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not rows:
        print(
            f"error: no results rows in {', '.join(run_dirs)} "
            "(has the study finished a cell? see results.jsonl)",
            file=sys.stderr,
        )
        sys.exit(1)
    out = _OUT.value or run_dirs[0]
    try:
        path = report.write_report(
            rows,
            out,
            problems=problems,
            title=_TITLE.value,
            blocks=blocks,
            reference=_REFERENCE.value,
            all_pairs=_ALL_PAIRS.value,
        )
    except OSError as e:  # a read-only or full --out, a file where a directory should be
        error = write_error(e, e.filename or out)
        print(f"error: {error}; the report goes into --out={out}", file=sys.stderr)
        sys.exit(1)
    print(f"report: {path}")
    tables = report.build_tables(rows, blocks)
    shown = [t for t in tables if t.metric == "bits_per_byte"] or tables[:1]
    for table in shown:
        print()
        print(report.render_markdown(table), end="")


def _not_a_run_dir(path: str) -> str | None:
    """Why ``path`` cannot be read as a run dir or results file (None: try it)."""
    if not os.path.exists(path):
        return f"{path}: no such run dir or results file"
    file = results.results_file(path)
    if file.is_dir():
        return f"{file}: is a directory, not a results file (JSON lines of rows)"
    return None


if __name__ == "__main__":
    app.run(main)
