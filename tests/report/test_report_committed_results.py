"""The committed results: every table under docs/results/<study>/ is rebuilt from the rows
committed beside it (``results.jsonl.gz``, ``blocks.jsonl.gz``) byte for byte, and every table
the README and docs/ quote from them is the committed table, so a doc table cannot drift from
its data. The CSV files keep every float at full precision, and the last digits of a bootstrap
half-width depend on the BLAS kernel of the machine (the order of its sums): their floats are
compared to 1e-9 relative, every other field and every other file byte for byte.

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
