"""Sweeps across machines: ``--shard=I/N`` splits a study's cells, ``make_report.py`` merges
the shards' workdirs into the unsharded study's tables and names missing cells."""

from __future__ import annotations

import json
import subprocess
import sys

from test_integration_kill_resume import ROOT, STUDY_ARGS, clean, run_study, tables  # noqa: F401


def make_report(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "scripts/make_report.py", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_two_shards_merged_equal_the_unsharded_study(clean, tmp_path):  # noqa: F811
    dirs = [tmp_path / f"study-{i}" for i in range(2)]
    for i, workdir in enumerate(dirs):
        proc = run_study(workdir, extra=(f"--shard={i}/2",))
        assert proc.returncode == 0, proc.stderr[-3000:]
        manifest = json.loads((workdir / "study.json").read_text())
        assert manifest["shard"] == f"{i}/2"
        assert manifest["selected"] == ["rope-seed0", "alibi-seed0"]
    ran = [sorted(p.name for p in (d / "runs").iterdir()) for d in dirs]
    assert ran == [["rope-seed0"], ["alibi-seed0"]]  # equal costs: cell k -> shard k mod 2

    merged = tmp_path / "merged"
    proc = make_report(*dirs, f"--out={merged}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "missing" not in proc.stderr.lower()
    assert tables(merged) == tables(clean)
    assert "Missing cells" not in (merged / "REPORT.md").read_text()

    # a shard that did not run (or has not finished): its cells are named
    partial = tmp_path / "partial"
    proc = make_report(dirs[0], f"--out={partial}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "warning: 1 cell(s) of study extrapolation_lm (preset tiny) have no results: alibi-seed0"
        in proc.stderr
    )
    report = (partial / "REPORT.md").read_text()
    assert "## Missing cells" in report and "alibi-seed0" in report.split("## Missing cells")[1]


def test_make_report_counts_a_seed_once_and_reads_one_cell_s_workdir(clean, tmp_path):  # noqa: F811
    """The same seed merged twice counts once (n=1, not "n=2" with ±0.000); a cell's workdir
    (``runs/<cell>/``) is accepted as a run dir."""
    twice = tmp_path / "twice"
    proc = make_report(clean, clean, f"--out={twice}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert tables(twice) == tables(clean)
    assert "n=2" not in (twice / "REPORT.md").read_text()

    cell = tmp_path / "cell"
    proc = make_report(clean / "runs" / "rope-seed0", f"--out={cell}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "missing" not in proc.stderr.lower()
    table = (cell / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    assert "| rope |" in table and "| alibi |" not in table
    expected = (clean / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    rope = [line for line in expected.splitlines() if line.startswith("| rope |")]
    assert rope and all(line in table for line in rope)
