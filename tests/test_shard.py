"""Sweeps across machines: ``--shard=I/N`` splits a study's cells, ``make_report.py`` merges
the shards' workdirs into the unsharded study's tables and names missing cells."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_kill_resume import ROOT, STUDY_ARGS, clean, run_study, tables  # noqa: F401

from experiments import extrapolation_lm
from flaxformer_lite.experiments import sweeps
from flaxformer_lite.train.run_config import ConfigError


@pytest.mark.parametrize("value, expected", [("0/1", (0, 1)), ("3/4", (3, 4)), ((1, 2), (1, 2))])
def test_parse_shard(value, expected):
    assert sweeps.parse_shard(value) == expected


@pytest.mark.parametrize("value", ["4/4", "-1/4", "0/0", "1", "a/b", "1/2/3", ""])
def test_a_bad_shard_is_refused_naming_the_flag(value):
    with pytest.raises(ConfigError, match=r"^--shard=.*: must be I/N with integers"):
        sweeps.parse_shard(value)


@pytest.mark.parametrize("preset, n", [("tiny", 2), ("tiny", 3), ("cpu", 4), ("all", 5)])
def test_shards_are_deterministic_disjoint_covering_and_balanced(preset, n):
    config = extrapolation_lm.get_config(preset)
    cells = sweeps.expand_sweep(config)
    shards = [sweeps.shard_cells(cells, (i, n), config) for i in range(n)]
    again = [sweeps.shard_cells(cells, (i, n), config) for i in range(n)]
    assert shards == again  # deterministic
    names = [c["name"] for shard in shards for c in shard]
    assert sorted(names) == sorted(c["name"] for c in cells)  # disjoint and covering
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # equal costs: balanced by count
    for shard in shards:  # each shard keeps sweep order
        order = [cells.index(c) for c in shard]
        assert order == sorted(order)


def test_shards_balance_unequal_costs():
    """Greedy longest-processing-time: no shard exceeds another by more than the largest cell."""
    config = extrapolation_lm.get_config("tiny")
    steps = [10, 80, 20, 40, 40, 70, 10, 30, 50, 60]
    cells = [
        {"name": f"c{k}", "overrides": {"train.num_steps": s, "seed": k}}
        for k, s in enumerate(steps)
    ]
    costs = {c["name"]: sweeps.cell_cost(config, c) for c in cells}
    assert costs["c1"] > costs["c5"] > costs["c0"]  # more steps, more cost
    loads = [
        sum(costs[c["name"]] for c in sweeps.shard_cells(cells, (i, 3), config)) for i in range(3)
    ]
    assert max(loads) - min(loads) <= max(costs.values())
    assert max(loads) <= sum(costs.values()) / 3 + max(costs.values()) * 0.5


def test_more_shards_than_cells_is_refused():
    cells = [{"name": "a", "overrides": {}}, {"name": "b", "overrides": {}}]
    with pytest.raises(ConfigError, match=r"^--shard='2/3': N must be at most .* \(2\)"):
        sweeps.shard_cells(cells, (2, 3))


def test_run_study_refuses_a_bad_shard_in_one_line(tmp_path):
    cmd = [sys.executable, "scripts/run_study.py", f"--workdir={tmp_path / 's'}", *STUDY_ARGS]
    proc = subprocess.run(
        [*cmd, "--shard=2/2"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --shard='2/2': must be I/N with integers N >= 1 and 0 <= I < N (0-based)"
    ]
    assert not (tmp_path / "s").exists()


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
    """Issue 18: the same seed merged twice read "n=2" with ±0.000; a cell's workdir
    (``runs/<cell>/``) was not accepted."""
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
