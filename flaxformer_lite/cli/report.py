"""Write the tables, plots and REPORT.md of one or more study directories, from their rows alone.

    flaxformer-lite report runs/quick
    flaxformer-lite report runs/cpu runs/tpu --out=reports/merged
    flaxformer-lite report runs/study-0 runs/study-1 --out=runs/study   # study --shard=I/2
    flaxformer-lite report runs/quick/runs/rope-seed0 --out=reports/rope  # one cell
    flaxformer-lite report runs/tiny                  # one `flaxformer-lite train` workdir

(``python scripts/make_report.py`` and ``python -m flaxformer_lite report`` are the same
command.) Rows of several run dirs (their ``results.jsonl``, and the per-block sums beside them
in ``blocks.jsonl``) are merged: exact duplicates are dropped, distinct measurements kept. A
corrupted line is reported with its file and line number and skipped. The report goes into
``--out`` (default: the first RUN_DIR); the command prints the path of REPORT.md and the
Markdown bits-per-byte table(s). ``--reference`` / ``--all_pairs`` choose the comparisons of
``tables/paired_differences.{md,tex,csv}``.

A block record is used only beside the rows of the run that wrote it (the same study, preset,
run, seed and run identity, ``config_hash``): another study's ``blocks.jsonl`` placed beside
the rows is named on stderr and ignored. A file that cannot be read (a truncated or corrupt
``.gz``) is one line naming it, exit status 2.

A RUN_DIR is a study directory (``results.jsonl``), a results file, one study cell's workdir
(``STUDY/runs/<cell>/``: its ``rows.jsonl``) or one ``train`` workdir (its ``eval.json`` and
``config.json``: rows are made from them). The study dirs' ``study.json`` say which cells the
study selected: the cells without any results row -- e.g. the shards of a ``study
--shard=I/N`` not given, not run or not finished -- are named on stderr and in a "Missing
cells" section of REPORT.md. Each (run, seed) counts once: the same rows given twice are
merged, two different rows of one measurement are an error.

Rows that share a table must agree in what changes numbers (`results.comparable`): the
run's config fields but the encoding, its options, the seed and what the study sweeps; the
corpus content hash; the versions of Python, the library, jax, jaxlib, flax, optax and
numpy. Rows that differ are refused with one line per field, naming a run and file for
each value, e.g.

    error: train.num_steps: 20 (rope-seed0, s0/results.jsonl) vs 60 (alibi-seed0, s1/results.jsonl)

and exit status 2; ``--allow-mixed=FIELD,...`` (``--allow_mixed``; a prefix such as
``versions`` allows every field under it) merges them on purpose, and the captions and
REPORT.md say what was mixed. Versions that differ only in a patch release (``0.4.30`` vs
``0.4.31``) are a warning, not a refusal: patch releases are bug fixes not meant to change
numbers; a minor or major release refuses.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

from absl import app, flags

from flaxformer_lite import report
from flaxformer_lite.base.checks import is_number
from flaxformer_lite.base.io import write_error
from flaxformer_lite.cli import common
from flaxformer_lite.results import comparable, store
from flaxformer_lite.results.rows import blocks_for_cell, rows_for_cell
from flaxformer_lite.study.sweeps import CELL_NAME
from flaxformer_lite.train.run_config import RunConfig

_OUT = flags.DEFINE_string("out", None, "report directory (default: the first RUN_DIR)")
_TITLE = flags.DEFINE_string("title", None, "the report's heading (default: studies and presets)")
_REFERENCE = flags.DEFINE_string(
    "reference",
    "alibi",
    "paired differences: each encoding against this one; several, comma-separated "
    "(fox,fox+gpt_oss+sinks): each table against the first it holds",
)
_ALL_PAIRS = flags.DEFINE_bool("all_pairs", False, "paired differences: every pair of encodings")
_PLOTS = flags.DEFINE_bool("plots", True, "draw plots/ (--noplots: tables and REPORT.md only)")
_ALLOW_MIXED = flags.DEFINE_list(
    "allow_mixed",
    [],
    "fields (e.g. train.num_steps, corpus_sha256, versions.jax; a prefix: versions) in which "
    "rows sharing a table may differ on purpose (also spelt --allow-mixed)",
)


def main(argv: list[str]) -> None:
    run_dirs = argv[1:]
    if not run_dirs:
        raise app.UsageError(f"usage: {argv[0]} RUN_DIR [RUN_DIR ...] [--out=DIR]")
    for run_dir in run_dirs:
        problem = _not_a_run_dir(run_dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    made = tempfile.TemporaryDirectory(prefix="flaxformer-lite-report-")
    try:
        sources = [_rows_source(d, made.name) for d in run_dirs]
        # a train workdir's rows are made in the scratch dir: name its eval.json instead
        names = {
            str(store.results_file(s)): os.path.join(d, "eval.json")
            for s, d in zip(sources, run_dirs, strict=True)
            if s.startswith(made.name)
        }
        _report(argv, sources, names)
    finally:
        made.cleanup()


def _report(argv: list[str], run_dirs: list[str], names: dict[str, str]) -> None:
    try:
        rows, problems, origins = store.load_rows_with_origins(run_dirs)
        blocks, foreign = store.paired_blocks(run_dirs, rows)  # only the rows' own blocks
    except (FileNotFoundError, store.DuplicateRowsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # unreadable: a truncated or corrupt .gz, a directory, ...
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    for note in (*problems, *foreign):
        print(f"warning: {note}", file=sys.stderr)
    if not rows:
        print(
            f"error: no results rows in {', '.join(run_dirs)} "
            "(has the study finished a cell? see results.jsonl)",
            file=sys.stderr,
        )
        sys.exit(1)
    # Rows in the studies' cell order (the sweep's), whatever order the RUN_DIRs came in: the
    # merged shards of a study give the unsharded study's tables, rows in the same order.
    selected = _selected_cells(argv[1:])
    order = {cell: i for i, cell in enumerate(c for cells in selected.values() for c in cells)}
    files = {id(r): names.get(file, file) for r, (file, _) in zip(rows, origins, strict=True)}
    rows = sorted(rows, key=lambda r: order.get(r.get("run"), len(order)))
    files = [files[id(r)] for r in rows]
    verdict = _check_comparable(rows, files)
    failed = _failed_cells(argv[1:], rows)
    missing = _missing_cells(selected, rows, failed)
    for line in missing:
        print(f"warning: {line}", file=sys.stderr)
    for name, error in failed.items():
        print(f"warning: cell {name} failed: {error}", file=sys.stderr)
    out = _OUT.value or argv[1]
    try:
        path = report.write_report(
            rows,
            out,
            problems=problems,
            title=_TITLE.value,
            blocks=blocks,
            reference=_REFERENCE.value,
            all_pairs=_ALL_PAIRS.value,
            missing=missing,
            common_rate=study_rate(argv[1:]),
            allow_mixed=_ALLOW_MIXED.value,
            origins=files,
            failed=failed,
            plots=_PLOTS.value,
        )
    except OSError as e:  # a read-only or full --out, a file where a directory should be
        error = write_error(e, e.filename or out)
        print(f"error: {error}; the report goes into --out={out}", file=sys.stderr)
        sys.exit(1)
    print(f"report: {path}")
    tables = report.with_notes(report.build_tables(rows, blocks), verdict)
    shown = [t for t in tables if t.metric == "bits_per_byte"] or tables[:1]
    for table in shown:
        print()
        print(report.render_markdown(table), end="")


def _check_comparable(rows: list[dict], files: list[str]) -> comparable.Verdict:
    """Refuse (exit 2, one line per field) rows that must not share a table; warn about
    patch releases and --allow-mixed names that nothing needed."""
    verdict = comparable.check(rows, files, _ALLOW_MIXED.value)
    for d in verdict.patch:
        print(
            f"warning: {d.line()} (a patch release only: the rows share a table, and its "
            "caption says so)",
            file=sys.stderr,
        )
    for d in verdict.mixed:
        print(f"note: mixed on purpose (--allow-mixed): {d.line()}", file=sys.stderr)
    for name in verdict.unused:
        print(f"warning: --allow-mixed={name}: no rows differ in it", file=sys.stderr)
    if verdict.refused:
        for line in comparable.refusal_lines(verdict):
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    return verdict


def _rows_source(path: str, scratch: str | None = None) -> str:
    """What to read rows from: a study cell's ``rows.jsonl`` when ``path`` is a cell's workdir
    (``STUDY/runs/<cell>/``: no ``results.jsonl``); for a ``train`` workdir (``eval.json``, no
    rows), the rows made from it under ``scratch``; else ``path``."""
    if not os.path.isdir(path) or store.results_file(path).exists():
        return path
    cell_rows = os.path.join(path, "rows.jsonl")
    if os.path.isfile(cell_rows):
        return cell_rows
    if scratch is not None and os.path.isfile(os.path.join(path, "eval.json")):
        return _rows_of_train_workdir(path, scratch)
    return path


def _rows_of_train_workdir(path: str, scratch: str) -> str:
    """Write the rows and block sums of the finished run in ``path`` (its ``eval.json``, as
    a study cell's would be) under ``scratch``; return the rows file."""
    name = os.path.basename(os.path.normpath(os.path.abspath(path)))
    try:
        with open(os.path.join(path, "eval.json")) as f:
            summary = json.load(f)
        run = RunConfig.from_recorded(summary["config"])
        command = f"flaxformer-lite train --workdir={path} (from its eval.json)"
        made = rows_for_cell(run, name, summary, command)
        block_records = blocks_for_cell(run, name, summary)
    except (ValueError, KeyError, TypeError) as e:
        print(f"error: {path}/eval.json is not a finished run's result ({e})", file=sys.stderr)
        sys.exit(2)
    out = os.path.join(scratch, f"{len(os.listdir(scratch))}-{name}")
    os.makedirs(out)
    for file, records in (("rows.jsonl", made), ("blocks.jsonl", block_records)):
        with open(os.path.join(out, file), "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
    return os.path.join(out, "rows.jsonl")


def _missing_cells(selected: dict[tuple, list[str]], rows: list[dict], failed=()) -> list[str]:
    """One line per study of ``selected`` (`_selected_cells`: the ``study.json`` of the
    RUN_DIRs) naming its selected cells that have no results row, e.g. the cells of a shard
    not merged (``failed`` ones are stated apart)."""
    have = {(r.get("study"), r.get("preset") or "", r.get("run")) for r in rows}
    lines = []
    for (name, preset), cells in selected.items():
        absent = [c for c in cells if (name, preset or "", c) not in have and c not in failed]
        if absent:
            lines.append(
                f"{len(absent)} cell(s) of study {name} (preset {preset}) have no results: "
                f"{', '.join(absent)}"
            )
    return lines


def _failed_cells(run_dirs: list[str], rows: list[dict]) -> dict[str, str]:
    """The selected cells without results rows whose ``runs/<cell>/error.txt`` says why:
    cell -> its error line."""
    have = {r.get("run") for r in rows}
    failed = {}
    for run_dir in run_dirs:
        for cells in _selected_cells([run_dir]).values():
            for cell in cells:
                if cell in have or cell in failed or not CELL_NAME.fullmatch(cell):
                    continue
                line = store.error_line(os.path.join(run_dir, "runs", cell, "error.txt"))
                if line:
                    failed[cell] = line
    return failed


def _study_record(run_dir: str) -> dict:
    """The parsed ``study.json`` of ``run_dir`` (OSError / ValueError when there is none or it
    is not JSON; the callers read what they need of it)."""
    with open(os.path.join(run_dir, "study.json"), encoding="utf-8") as f:
        return json.load(f)


def study_rate(run_dirs: list[str]) -> float | None:
    """The peak rate the studies' configs share (``optim.learning_rate`` in each ``study.json``):
    the common rate a rate sweep's ranking is compared at, as the study runner's report does;
    None when a RUN_DIR has no such record or the records differ (then the grid's middle)."""
    rates = set()
    for run_dir in run_dirs:
        try:
            rates.add(_study_record(run_dir)["config"]["optim"]["learning_rate"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    if len(rates) != 1:
        return None
    (rate,) = rates
    return float(rate) if is_number(rate) else None


def _selected_cells(run_dirs: list[str]) -> dict[tuple, list[str]]:
    """(study, preset) -> the cells its ``study.json`` files selected, in sweep order."""
    expected: dict[tuple, list[str]] = {}
    for run_dir in run_dirs:
        try:
            manifest = _study_record(run_dir)
            study = manifest["study"]
            cells = manifest.get("selected") or study["cells"]
            key = (study["name"], study.get("preset", ""))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a study dir (or an unreadable record): nothing expected
        names = expected.setdefault(key, [])
        names += [c for c in cells if isinstance(c, str) and c not in names]
    return expected


def _not_a_run_dir(path: str) -> str | None:
    """Why ``path`` cannot be read as a run dir or results file (None: try it)."""
    if not os.path.exists(path):
        return f"{path}: no such run dir or results file"
    file = store.results_file(_rows_source(path))
    if file.is_dir():
        return f"{file}: is a directory, not a results file (JSON lines of rows)"
    return None


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite report") -> None:
    """Parse ``argv`` (default ``sys.argv``) and write the report (`common.run_command`)."""
    argv = list(sys.argv if argv is None else argv)
    # --allow-mixed, as the docs spell it, is absl's --allow_mixed
    argv = [re.sub(r"^--(no)?allow-mixed(?==|$)", r"--\1allow_mixed", a) for a in argv]
    common.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
