"""Recorded benchmark runs (`train_speed.py --record`) and the targets' status across
machines (`benchmarks/target_status.py`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks import target_status, train_speed
from flaxformer_lite.train import cpu_matmul

DOCS_RUNS = Path(__file__).resolve().parents[1] / "docs" / "benchmark_runs.jsonl"
F32, BF16, QUICK = (name for _, _, _, name in train_speed.TARGETS)
# the third machine: its boot id, and the two boot times it was read with (sessions 4-11, 12)
THIRD = "c7b07674-20a1-43dd-a979-3a370c3f56c7"
BOOTED, BOOTED_LATER = "2026-12-01 08:50:50 UTC", "2026-12-01 08:51:09 UTC"
OTHER = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # a made-up second boot id


class _Fake(train_speed.Contestant):
    def __init__(self, label: str, compile_s: float):
        self.label, self.compile_s = label, compile_s


def _args(**over) -> argparse.Namespace:
    base = dict(
        rounds=3,
        seconds=3.0,
        impl="xla",
        positional="sinusoidal",
        dtypes=["float32", "bfloat16"],
        quick_positional=["sinusoidal"],
        no_quick=False,
        default_malloc=False,
        torch_python=None,
        cpu_matmul="auto",
        record=None,
    )
    return argparse.Namespace(**(base | over))


def test_recorded_run_round_trips_with_its_own_medians(tmp_path):
    times = {  # seconds per step of each round
        "JAX float32": [0.60, 0.55, 0.70],
        "PyTorch float32": [0.65, 0.70, 0.63],  # median ratio 1.083: missed
        "JAX bfloat16": [0.40, 0.41, 0.39],
        "PyTorch bfloat16 (autocast)": [0.42, 0.43, 0.44],
        "JAX float32 sinusoidal": [0.040, 0.037, 0.039],
        "PyTorch float32 sinusoidal": [0.041, 0.040, 0.036],
    }
    ref = [_Fake(k, 2.5) for k in list(times)[:4]]
    quick = [_Fake(k, 1.5) for k in list(times)[4:]]
    row = train_speed.run_record(
        _args(), "2.13.0+cpu", ref, quick, times, [200.0, 190.0, 210.0], [400.0], (0.5,), (1.5,)
    )
    path = tmp_path / "sub" / "runs.jsonl"
    train_speed.append_record(path, row)
    train_speed.append_record(path, row)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == json.loads(json.dumps(row))

    got = {t["name"]: t for t in json.loads(lines[0])["targets"]}
    for mine, other, goal, name in train_speed.TARGETS:
        mine = mine.format(impl="")
        expected = np.median(times[other]) / np.median(times[mine])
        assert got[name]["ratio"] == pytest.approx(expected)
        assert got[name]["met"] == (expected >= goal)
        paired = np.asarray(times[other]) / np.asarray(times[mine])
        assert got[name]["rounds_min"] == pytest.approx(paired.min())
        assert got[name]["rounds_max"] == pytest.approx(paired.max())
    assert [got[n]["met"] for n in (F32, BF16, QUICK)] == [False, True, True]
    assert row["ceiling_gflops"]["float32"] == {"median": 200.0, "min": 190.0, "max": 210.0}
    assert row["ms_per_step"]["JAX float32"] == pytest.approx([600.0, 550.0, 700.0])
    assert row["machine"]["booted_utc"] == train_speed._booted()
    assert row["machine"]["boot_id"] == train_speed._boot_id()
    if jax.default_backend() == "cpu":  # what the JAX steps' products were (train.cpu_matmul)
        bf16 = "xla" if cpu_matmul.onednn_takes_bf16_products() else "onednn"
        assert row["settings"]["cpu_matmul"] == (
            f"train.cpu_matmul='auto' (float32: onednn, bfloat16: {bf16})"
        )

    runs = target_status.read_runs([path])
    assert len(runs) == 6 and {r.target for r in runs} == {F32, BF16, QUICK}
    assert all(r.booted == row["machine"]["booted_utc"] for r in runs)
    machine = row["machine"]["boot_id"]
    if machine == "unknown":  # not Linux: the boot time names the machine
        machine = row["machine"]["booted_utc"]
    assert all(r.machine == machine for r in runs)


def _row(
    booted: str,
    finished: str,
    ratios: dict[str, float],
    jax: str = "0.12.0.1",
    boot_id: str | None = None,
) -> str:
    goals = {F32: 1.1, BF16: 1.0, QUICK: 1.0}
    machine = {"booted_utc": booted} | ({} if boot_id is None else {"boot_id": boot_id})
    return json.dumps(
        {
            "benchmark": "train_speed",
            "finished_utc": finished,
            "machine": machine,
            "software": {"jax": jax},
            "commit": "abc1234",
            "targets": [{"name": n, "goal": goals[n], "ratio": r} for n, r in ratios.items()],
        }
    )


def _status(tmp_path, rows: list[str]) -> dict[tuple[str, str], target_status.Status]:
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(rows) + "\n\n")  # blank lines are skipped
    found = target_status.statuses(target_status.read_runs([path]))
    return {(s.target, s.jax): s for s in found}


def test_a_target_is_met_only_on_two_machines_each_meeting_it(tmp_path):
    a, b, c = (f"2026-12-0{i} 0{i}:00:00 UTC" for i in (1, 2, 3))
    rows = [
        # machine a: f32 ratios 1.20, 1.00, 1.15 (median 1.15 meets 1.1 though one run missed)
        _row(a, "2026-12-01T10:02:00Z", {F32: 1.00, QUICK: 1.2}),
        _row(a, "2026-12-01T10:01:00Z", {F32: 1.20, QUICK: 1.2}),  # earlier, later in the file
        _row(a, "2026-12-01T10:03:00Z", {F32: 1.15, QUICK: 0.9}),
        _row(b, "2026-12-02T10:00:00Z", {F32: 1.12, QUICK: 1.1}),
        # another jax version is its own set-up: one machine only
        _row(b, "2026-12-02T11:00:00Z", {F32: 1.3}, jax="0.10.2"),
        # the quick target on a third machine that misses it: missed
        _row(c, "2026-12-03T10:00:00Z", {QUICK: 0.95}),
        # a run whose machine is unknown is listed, counts as no machine
        _row("unknown", "2026-12-04T10:00:00Z", {BF16: 1.5}),
    ]
    got = _status(tmp_path, rows)
    f32 = got[(F32, "0.12.0.1")]
    assert f32.verdict == "met"
    first = f32.machines[0]
    assert first.machine == a and first.booted == (a,)
    assert first.ratios == (1.20, 1.00, 1.15)  # in finishing order
    assert first.median == pytest.approx(1.15) and first.met_count == 2
    assert got[(F32, "0.10.2")].verdict == "one machine only"
    quick = got[(QUICK, "0.12.0.1")]
    assert [m.meets for m in quick.machines] == [True, True, False]
    assert quick.verdict == "missed"
    assert got[(BF16, "0.12.0.1")].verdict == "no machine"
    table = target_status.render(list(got.values()))
    assert "| 1.15x | 1.20x, 1.00x, 1.15x |" in table
    assert "unknown (counts as no machine)" in table
    assert f"| {QUICK} | 0.12.0.1 | 3 | missed |" in table

    # only a's runs: one machine
    only_a = _status(tmp_path, rows[:3])
    assert only_a[(F32, "0.12.0.1")].verdict == "one machine only"
    # b's median below the goal turns "met" into "missed"
    low_b = [*rows[:3], _row(b, "2026-12-02T10:00:00Z", {F32: 1.09})]
    assert _status(tmp_path, low_b)[(F32, "0.12.0.1")].verdict == "missed"
    # a ratio just under the goal is not printed as the goal: 0.996x, not 1.00x
    near = _status(tmp_path, [_row(a, "2026-12-01T10:00:00Z", {BF16: 0.9962})])
    assert "| 0 | 0.996x | 0.996x |" in target_status.render(list(near.values()))


@pytest.mark.parametrize(
    "ratio, goal, text",
    [
        (1.075, 1.1, "1.07x"),  # two decimals where they already say "missed"
        (1.004, 1.0, "1.00x"),  # and where they say "met"
        (1.0, 1.0, "1.00x"),
        (0.9962, 1.0, "0.996x"),  # "1.00x" would read as met
        (1.0997, 1.1, "1.0997x"),  # "1.10x" and "1.100x" would too
        (0.99999999, 1.0, "0.99999999x"),  # past six decimals: every digit
    ],
)
def test_a_printed_ratio_falls_on_its_verdicts_side_of_the_goal(ratio, goal, text):
    assert target_status.ratio_text(ratio, goal) == text
    assert (float(text[:-1]) >= goal) == (ratio >= goal)


def test_machines_are_told_apart_by_boot_id_not_boot_time(tmp_path):
    """The boot time can move without a reboot (the third machine's read 08:50:50, then
    08:51:09): one boot id is one machine whatever its boot times; two boot ids are two
    machines even with one boot time; a row recorded before boot ids joins the boot id
    recorded with its boot time."""
    t1, t2, x, y = BOOTED, BOOTED_LATER, THIRD, OTHER
    rows = [
        _row(t1, "2026-12-01T10:00:00Z", {F32: 1.2}),  # no boot id: joins x (same boot time)
        _row(t1, "2026-12-01T11:00:00Z", {F32: 1.3}, boot_id=x),
        _row(t2, "2026-12-01T23:00:00Z", {F32: 1.25}, boot_id=x),  # x again, time moved
    ]
    got = _status(tmp_path, rows)[(F32, "0.12.0.1")]
    assert got.verdict == "one machine only"
    (only,) = got.machines
    assert only.machine == x and only.booted == (t1, t2) and only.ratios == (1.2, 1.3, 1.25)
    assert only.name == f"{t1} / {t2} (boot id c7b07674)"
    # the old way (boot times) would have made these two machines and the target "met"
    assert len({json.loads(r)["machine"]["booted_utc"] for r in rows}) == 2

    # another boot id is another machine, even at the same boot time
    two = _status(tmp_path, [*rows[1:], _row(t2, "2026-12-02T09:00:00Z", {F32: 1.15}, boot_id=y)])
    assert two[(F32, "0.12.0.1")].verdict == "met"
    assert [m.machine for m in two[(F32, "0.12.0.1")].machines] == [x, y]

    # rows without boot ids keep their boot times as machines; "unknown" ids fall back to them
    old = [
        _row(t1, "2026-12-01T10:00:00Z", {F32: 1.2}),
        _row(t2, "2026-12-01T11:00:00Z", {F32: 1.2}, boot_id="unknown"),
    ]
    machines = _status(tmp_path, old)[(F32, "0.12.0.1")].machines
    assert [(m.machine, m.name) for m in machines] == [
        (t1, f"{t1} (no boot id recorded)"),
        (t2, f"{t2} (no boot id recorded)"),
    ]
    none = _status(
        tmp_path, [_row("unknown", "2026-12-01T10:00:00Z", {F32: 1.2}, "0.12.0.1", "unknown")]
    )
    assert none[(F32, "0.12.0.1")].verdict == "no machine"

    # a boot time recorded with two boot ids cannot place a row without one
    path = tmp_path / "runs.jsonl"
    path.write_text(
        "\n".join([*rows[1:], _row(t1, "2026-12-02T09:00:00Z", {F32: 1.1}, boot_id=y), rows[0]])
        + "\n"
    )
    with pytest.raises(
        target_status.RowError, match=r"runs\.jsonl:4: no boot id, and its boot time"
    ):
        target_status.read_runs([path])


def test_here_says_whether_this_machine_already_has_runs(tmp_path, monkeypatch, capsys):
    t1, t2, x, y = BOOTED, BOOTED_LATER, THIRD, OTHER
    path = tmp_path / "runs.jsonl"
    path.write_text(
        "\n".join(
            [
                _row(t1, "2026-12-01T10:00:00Z", {F32: 1.2, QUICK: 1.1}, "0.10.2", boot_id=x),
                _row(t1, "2026-12-01T11:00:00Z", {F32: 1.3}, boot_id=x),
                _row("2026-11-30 02:22:46 UTC", "2026-11-30T05:00:00Z", {F32: 1.0}),
            ]
        )
        + "\n"
    )
    runs = target_status.read_runs([path])
    # the same boot id with a moved boot time: the same machine, two runs (not three targets)
    said = target_status.here(runs, t2, x)
    assert said.startswith(f"This machine (booted {t2}, boot id {x}) already has 2 recorded runs")
    assert "(jax 0.10.2, 0.12.0.1; the last finished 2026-12-01T11:00:00+00:00)" in said
    # no boot id readable, but a recorded boot time that has one: that machine
    assert "already has 2 recorded runs" in target_status.here(runs, t1, "unknown")
    # a machine recorded before boot ids, by its boot time
    assert "already has 1 recorded runs" in target_status.here(
        runs, "2026-11-30 02:22:46 UTC", "unknown"
    )
    assert target_status.here(runs, t2, y).endswith(
        "has no recorded run: its runs count as another machine."
    )
    assert "cannot be told apart" in target_status.here(runs, "unknown", "unknown")

    monkeypatch.setattr(target_status.machine, "booted", lambda: t2)
    monkeypatch.setattr(target_status.machine, "boot_id", lambda: x)
    # --here counts every row, whatever --after selects (the table has one run of x here)
    assert target_status.main([str(path), "--here", "--after", "2026-12-01T10:30:00Z"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 1 | 1.30x | 1.30x |" in out and "already has 2 recorded runs" in out
    monkeypatch.setattr(target_status.machine, "boot_id", lambda: y)
    assert target_status.main([str(path), "--here", "--jax", "0.10.2"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("has no recorded run: its runs count as another machine.")
    assert target_status.main([str(path)]) == 0
    assert "This machine" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "runs.jsonl:2: not a JSON object"),
        ("[1, 2]", "runs.jsonl:2: not a JSON object"),
        (
            _row("b", "2026-12-01T10:00:00Z", {F32: 1.2}).replace('"booted_utc": "b"', '"x": 1'),
            "runs.jsonl:2: field 'machine.booted_utc' is missing",
        ),
        (
            _row("b", "2026-12-01T10:00:00Z", {F32: 1.2}).replace(
                '"booted_utc"', '"boot_id": 7, "booted_utc"'
            ),
            "runs.jsonl:2: field 'machine.boot_id' is 7; expected str",
        ),
        (
            _row("b", "2026-12-01T10:00:00Z", {F32: 1.2}).replace("1.2}", '"1.2"}'),
            "runs.jsonl:2: targets[0]: field 'ratio' is '1.2'; expected int or float",
        ),
        (
            _row("b", "2026-12-01T10:00:00Z", {F32: 0.0}),
            "runs.jsonl:2: targets[0].ratio is 0.0; expected > 0",
        ),
        (
            _row("b", "2026-12-01 10:00", {F32: 1.2}),
            "runs.jsonl:2: field 'finished_utc' is '2026-12-01 10:00'; expected an ISO 8601",
        ),
    ],
)
def test_unreadable_rows_are_named_by_file_line_and_field(tmp_path, capsys, line, message):
    path = tmp_path / "runs.jsonl"
    path.write_text(_row("a", "2026-12-01T09:00:00Z", {F32: 1.2}) + "\n" + line + "\n")
    with pytest.raises(target_status.RowError, match="^.*" + message.replace("[", r"\[")):
        target_status.read_runs([path])
    assert target_status.main([str(path)]) == 2
    assert message in capsys.readouterr().err


def test_filters_and_conflicting_goals(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    rows = [
        _row("a", "2026-12-01T09:00:00Z", {F32: 1.0}),
        _row("b", "2026-12-01T11:00:00+00:00", {F32: 1.2}),
        _row("c", "2026-12-01T12:00:00Z", {F32: 1.3}, jax="0.10.2"),
    ]
    path.write_text("\n".join(rows) + "\n")
    assert target_status.main([str(path), "--after", "2026-12-01T10:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "| b (no boot id recorded) |" in out and "| a (" not in out
    assert target_status.main([str(path), "--jax", "0.10.2"]) == 0
    out = capsys.readouterr().out
    assert f"| {F32} | 0.10.2 | 1 | one machine only |" in out and "0.12.0.1" not in out
    assert target_status.main([str(path), "--after", "yesterday"]) == 2
    assert "--after is 'yesterday'; expected an ISO 8601 time" in capsys.readouterr().err
    assert target_status.main([str(path), "--jax", "9.9"]) == 2
    assert "no train_speed runs match" in capsys.readouterr().err
    path.write_text(rows[0] + "\n" + rows[1].replace('"goal": 1.1', '"goal": 1.2') + "\n")
    assert target_status.main([str(path)]) == 2
    assert "different goals in the rows: [1.1, 1.2]" in capsys.readouterr().err


def test_the_docs_runs_give_the_documented_status():
    """docs/benchmark_runs.jsonl (every run since `8a8333d`) gives the status that
    docs/benchmarks.md and the README state."""
    found = target_status.statuses(target_status.read_runs([DOCS_RUNS]))
    verdict = {(s.target, s.jax): s.verdict for s in found}
    assert verdict[(F32, "0.12.0.1")] == "missed"
    assert verdict[(F32, "0.10.2")] == "missed"
    assert verdict[(BF16, "0.12.0.1")] == "met"
    assert verdict[(BF16, "0.10.2")] == "missed"
    assert verdict[(QUICK, "0.12.0.1")] == "met"
    assert verdict[(QUICK, "0.10.2")] == "met"
    machines = {(m.machine, m.booted[0]) for s in found for m in s.machines}
    assert machines == {
        ("2026-12-01 02:22:46 UTC", "2026-12-01 02:22:46 UTC"),  # recorded without a boot id
        (THIRD, BOOTED),
    }
    # the third machine's boot time moved in the twelfth session: still one machine
    (f32,) = (s for s in found if (s.target, s.jax) == (F32, "0.12.0.1"))
    assert [(m.machine, m.booted) for m in f32.machines][1] == (THIRD, (BOOTED, BOOTED_LATER))
    # its rows from before boot ids were recorded carry the id, each saying it was added
    rows = [json.loads(line) for line in DOCS_RUNS.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["machine"]["booted_utc"] == BOOTED:
            assert row["machine"]["boot_id"] == THIRD
            assert row["machine"]["boot_id_source"].startswith("added 2026-12-01")


def test_the_record_file_does_not_make_the_checkout_look_changed(tmp_path):
    """Runs that append to a tracked record file still name their commit clean; any other
    tracked change marks it."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git not installed")
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "PATH": os.environ["PATH"]}

    def run(*args):
        subprocess.run([git, *args], cwd=tmp_path, env=env, check=True, capture_output=True)

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    record = str(tmp_path / "docs" / "runs.jsonl")
    clean = train_speed._git_commit(record, repo=tmp_path)
    assert len(clean) >= 7 and " " not in clean
    with open(record, "a") as f:
        f.write("{}\n")
    assert train_speed._git_commit(record, repo=tmp_path) == clean
    assert train_speed._git_commit(repo=tmp_path) == clean + " (+ uncommitted changes)"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert train_speed._git_commit(record, repo=tmp_path) == clean + " (+ uncommitted changes)"
    assert train_speed._git_commit(repo=tmp_path / "missing") == "unknown"


def test_a_record_path_that_is_a_folder_is_refused_before_the_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train_speed.main(["--record", str(tmp_path)])
    assert e.value.code == 2
    assert f"--record {str(tmp_path)!r} is a folder" in capsys.readouterr().err
