"""The committed results: every table under docs/results/<study>/ is rebuilt from the rows
committed beside it (``results.jsonl.gz``, ``blocks.jsonl.gz``) byte for byte, and every table
the README and docs/ quote from them is the committed table, so a doc table cannot drift from
its data. The CSV files keep every float at full precision, and the last digits of a bootstrap
half-width depend on the BLAS kernel of the machine (the order of its sums): their floats are
compared to 1e-9 relative, every other field and every other file byte for byte.

Blocks belong to their rows: another study's ``blocks.jsonl.gz`` beside the committed rows is
ignored in one line (the tables are those without blocks), and a damaged ``.gz`` is one line
naming it.

A study's ``report.args``, when present, holds the report flags its tables were made with
(e.g. ``--all_pairs``). A quoted table sits between
``<!-- table: results/<study>/tables/<name>.md -->`` and ``<!-- end table -->`` (the path
relative to docs/) and holds that file's text exactly.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
STUDIES = sorted(p for p in RESULTS.glob("*") if (p / "results.jsonl.gz").is_file())
_SPEC = importlib.util.spec_from_file_location("quote_tables", ROOT / "scripts" / "quote_tables.py")
quote_tables = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(quote_tables)
QUOTE = quote_tables.QUOTE  # the pattern the script refreshes
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _same_csv(got: str, want: str) -> bool:
    """Whether two CSV texts have the same fields, floats equal to 1e-9 relative."""
    a, b = list(csv.reader(io.StringIO(got))), list(csv.reader(io.StringIO(want)))
    if [len(r) for r in a] != [len(r) for r in b]:
        return False
    for x, y in zip((v for r in a for v in r), (v for r in b for v in r), strict=True):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12):
                return False
        except ValueError:
            return False
    return True


def test_same_csv_tolerates_only_the_last_digits_of_floats():
    row = "table,value,p\nbits,{},0.5\n"
    assert _same_csv(row.format("0.09135685996635523"), row.format("0.09135685996635534"))
    assert not _same_csv(row.format("0.0913568"), row.format("0.0913578"))
    assert not _same_csv(row.format("0.5"), "table,value,p\nloss,0.5,0.5\n")
    assert not _same_csv(row.format("0.5"), row.format("0.5") + "bits,1.0,0.5\n")


def test_results_are_committed():
    assert STUDIES, f"no committed rows under {RESULTS}"
    for study in STUDIES:
        assert (study / "blocks.jsonl.gz").is_file(), f"{study.name}: rows without their blocks"
        assert list((study / "tables").glob("*.md")), f"{study.name}: no committed tables"


@pytest.mark.parametrize("study", STUDIES, ids=[p.name for p in STUDIES])
def test_committed_tables_rebuild_from_their_rows_byte_for_byte(study, tmp_path):
    work = tmp_path / study.name
    work.mkdir()
    for name in ("results.jsonl.gz", "blocks.jsonl.gz", "study.json"):
        if (study / name).is_file():
            shutil.copy(study / name, work / name)
    args = (study / "report.args").read_text().split() if (study / "report.args").is_file() else []
    cmd = [sys.executable, "-m", "flaxformer_lite", "report", str(work), "--noplots", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    committed = sorted(p.name for p in (study / "tables").iterdir())
    rebuilt = sorted(p.name for p in (work / "tables").iterdir())
    assert committed == rebuilt
    for name in committed:
        want = (study / "tables" / name).read_bytes()
        got = (work / "tables" / name).read_bytes()
        if name.endswith(".csv"):
            same = _same_csv(got.decode(), want.decode())
        else:
            same = got == want
        assert same, f"{study.name}/tables/{name} differs from its rows' rebuild"
    assert (work / "REPORT.md").read_bytes() == (study / "REPORT.md").read_bytes()


def test_every_quoted_table_is_its_committed_file():
    quoted = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in QUOTE.finditer(text):
            source = ROOT / "docs" / match["path"]
            where = f"{page.relative_to(ROOT)} quotes {match['path']}"
            assert source.is_file(), f"{where}: no such committed table"
            assert match["body"] == source.read_text(encoding="utf-8"), f"{where}: it differs"
            quoted += 1
        # a marker that the pattern did not pair (a typo, a missing end) is an error too
        assert text.count("<!-- table:") == len(QUOTE.findall(text)), f"{page}: unpaired marker"
    assert quoted > 0, "no page quotes a committed table"


def _report(work: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "flaxformer_lite", "report", str(work), "--noplots", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _quick_rows(work: Path) -> Path:
    work.mkdir()
    for name in ("results.jsonl.gz", "study.json"):
        shutil.copy(RESULTS / "quick" / name, work / name)
    return work


def test_blocks_of_another_study_beside_the_rows_are_ignored_in_one_line(tmp_path):
    """The cpu_best_lr study's blocks beside the quick study's rows (the same study, cell names
    and lengths) give no interval and no significance mark: the tables equal those of the rows
    alone, and one line names the file ignored."""
    mixed, bare = _quick_rows(tmp_path / "mixed"), _quick_rows(tmp_path / "bare")
    shutil.copy(RESULTS / "cpu_best_lr" / "blocks.jsonl.gz", mixed / "blocks.jsonl.gz")
    args = (RESULTS / "quick" / "report.args").read_text().split()
    with_foreign, alone = _report(mixed, *args), _report(bare, *args)
    assert with_foreign.returncode == 0, with_foreign.stderr[-3000:]
    assert alone.returncode == 0, alone.stderr[-3000:]
    ignored = [line for line in with_foreign.stderr.splitlines() if "ignored" in line]
    assert len(ignored) == 1 and ignored[0].startswith(
        f"warning: {mixed / 'blocks.jsonl.gz'}: ignored "
    ), with_foreign.stderr[-3000:]
    assert "preset 'cpu_best_lr'" in ignored[0] and "no results row here" in ignored[0]
    names = sorted(p.name for p in (bare / "tables").iterdir())
    assert names == sorted(p.name for p in (mixed / "tables").iterdir())
    for name in names:
        got, want = ((d / "tables" / name).read_text() for d in (mixed, bare))
        assert _same_csv(got, want) if name.endswith(".csv") else got == want, name
    # no significance table from another study's blocks (the quick study's own make one)
    assert "paired_differences.md" not in names
    assert (RESULTS / "quick" / "tables" / "paired_differences.md").is_file()


def test_a_damaged_gz_is_one_line_naming_the_file(tmp_path):
    truncated = _quick_rows(tmp_path / "truncated")
    data = (truncated / "results.jsonl.gz").read_bytes()
    (truncated / "results.jsonl.gz").write_bytes(data[: len(data) // 2])
    corrupt = _quick_rows(tmp_path / "corrupt")
    (corrupt / "blocks.jsonl.gz").write_bytes(b"not a gzip stream\n" * 4)
    for work, line in (
        (
            truncated,
            f"error: cannot read {truncated / 'results.jsonl.gz'}: it is cut short (the gzip "
            "stream ends before its end marker)",
        ),
        (
            corrupt,
            f"error: cannot read {corrupt / 'blocks.jsonl.gz'}: it is not a valid gzip file "
            "(Not a gzipped file (b'no'))",
        ),
    ):
        proc = _report(work)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines() == [line], proc.stderr[-3000:]
