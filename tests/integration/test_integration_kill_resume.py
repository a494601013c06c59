"""Kill anywhere, lose nothing: a study SIGKILLed at exact points resumes to the same results.

A study (tiny preset, two encodings, 8 steps) runs through ``scripts/run_study.py`` in a
subprocess. `flaxformer_lite.base.faults` makes the process SIGKILL itself at an exact point
(``FLAXFORMER_LITE_FAULT=<point>:<n>``); each kill is followed by a rerun of the same command,
itself killed at the next point, until a last, uninterrupted rerun. The final results and
tables must equal those of a clean run, with no duplicated or torn row. The same clean run
backs the end-to-end checks of a corrupted checkpoint and a corrupted results line.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from subprocess_checks import STUDY_ARGS, env, last_line, restricted, temporary_files

from flaxformer_lite.base import faults
from flaxformer_lite.base.lock import WorkdirBusyError, WorkdirLock
from flaxformer_lite.results import store
from flaxformer_lite.train.checkpoint import Checkpointer
from flaxformer_lite.train.loop import build_model
from flaxformer_lite.train.optim import make_optimizer
from flaxformer_lite.train.run_config import RunConfig
from flaxformer_lite.train.step import init_train_state

ROOT = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL


def run_study(
    workdir: Path, fault: str | None = None, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLAXFORMER_LITE_FAULT"}
    env["JAX_PLATFORMS"] = "cpu"
    if fault:
        env["FLAXFORMER_LITE_FAULT"] = fault
    cmd = [sys.executable, "scripts/run_study.py", f"--workdir={workdir}", *STUDY_ARGS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def values(workdir: Path) -> dict:
    """``{(encoding, seed, protocol, length, metric, bucket): value}`` of a study's results;
    fails on a torn, invalid or duplicated line."""
    rows, problems = store.read_rows_file(workdir / "results.jsonl")
    assert problems == [], problems
    keys = [
        (r["encoding"], r["seed"], r["protocol"], r["eval_length"], r["metric"], r.get("bucket"))
        for r in rows
    ]
    assert len(keys) == len(set(keys)), "duplicate rows"
    return {k: r["value"] for k, r in zip(keys, rows, strict=True)}


def tables(workdir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((workdir / "tables").iterdir())}


@pytest.fixture(scope="session")
def clean(shared) -> Path:
    """One uninterrupted study, the reference for every test here (read-only)."""

    def produce(directory: Path) -> None:
        proc = run_study(directory / "study")
        assert proc.returncode == 0, proc.stderr[-3000:]
        (directory / "stderr.txt").write_text(proc.stderr)

    workdir = shared("kill_resume_clean", produce) / "study"
    assert {k[0] for k in values(workdir)} == {"alibi", "rope"}
    return workdir


def test_kill_at_every_point_then_rerun_gives_the_same_results(clean, tmp_path):
    study = tmp_path / "study"
    rope, alibi = study / "runs" / "rope-seed0", study / "runs" / "alibi-seed0"

    def killed_at(fault: str) -> None:
        proc = run_study(study, fault)
        assert proc.returncode == KILLED, (
            f"{fault}: not killed ({proc.returncode})\n" + (proc.stderr[-3000:])
        )

    def steps(cell: Path) -> list[str]:
        return sorted(p.name for p in (cell / "checkpoints").iterdir())

    # 1. Training, step 6 of rope (its checkpoint at step 4 is on disk).
    killed_at("train_step:6")
    assert steps(rope) == ["4"]

    # 2. Saving rope's final checkpoint: written, not yet committed by orbax's rename.
    killed_at("checkpoint_save:1")
    assert "4" in steps(rope) and "8" not in steps(rope)
    assert any("tmp" in name for name in steps(rope)), steps(rope)

    # 3. Evaluation, third batch (after the final checkpoint).
    killed_at("eval_batch:3")
    assert "8" in steps(rope) and not (rope / "eval.json").exists()

    # 4. Writing rope's rows (its eval.json is done).
    killed_at("write:rows.jsonl:1")
    assert (rope / "eval.json").exists() and not (rope / "rows.jsonl").exists()
    assert not (study / "results.jsonl").exists()

    # 5. Training alibi, step 3, before any checkpoint (rope's rows are merged by now).
    killed_at("train_step:3")
    assert {k[0] for k in values(study)} == {"rope"}
    assert not (alibi / "checkpoints").exists() or steps(alibi) == []

    # 6. Rewriting results.jsonl with both cells: the old file stays whole.
    killed_at("write:results.jsonl:1")
    assert (alibi / "rows.jsonl").exists()
    assert {k[0] for k in values(study)} == {"rope"}

    # 7. An uninterrupted rerun finishes the study.
    proc = run_study(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert values(study) == values(clean)
    assert tables(study) == tables(clean)

    # A further run finds everything finished and changes nothing, silently.
    before = (study / "results.jsonl").read_bytes()
    proc = run_study(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (study / "results.jsonl").read_bytes() == before
    assert proc.stderr == "", proc.stderr[-3000:]


def test_happy_path_prints_nothing_on_stderr(clean):
    """With --progress=false, a study that runs without trouble says nothing on stderr: no
    warning or log line of absl, orbax, jax or Python's warnings. A line
    here is either noise to silence at its source or something to explain in one line."""
    stderr = (clean.parent / "stderr.txt").read_text()
    assert stderr == "", stderr[-3000:]


def test_rows_and_blocks_of_both_protocols(clean):
    """Every row says what it scored (split, number of targets); every evaluated cell has its
    per-block sums in blocks.jsonl, matching its rows; the report has the context table."""
    rows, _ = store.read_rows_file(clean / "results.jsonl")
    scalar = [r for r in rows if r["metric"] == "bits_per_byte"]
    assert {r["split"] for r in scalar} == {"validation"}
    assert {(r["protocol"], r["num_scored_tokens"]) for r in scalar} == {
        ("nonoverlapping", 512),
        ("context", 64),
    }
    context = [r for r in scalar if r["protocol"] == "context"]
    assert sorted({r["eval_length"] for r in context}) == [16, 32]
    assert {r["context_block"] for r in context} == {8}
    blocks = store.load_blocks(clean)
    assert len(blocks) == len(scalar)  # one record per evaluated cell
    for r in scalar:
        (b,) = [
            b
            for b in blocks
            if (b["run"], b["protocol"], b["eval_length"])
            == (r["run"], r["protocol"], r["eval_length"])
        ]
        assert sum(b["blocks"]["count"]) == r["num_scored_tokens"]
        mean = sum(b["blocks"]["loss"]) / sum(b["blocks"]["count"])
        assert mean / math.log(2) == pytest.approx(r["value"], rel=1e-6)
    assert "bits_per_byte_context.md" in tables(clean)
    plotted = {p.name for p in (clean / "plots").glob("*.png")}
    assert "bits_per_byte_context_vs_length.png" in plotted
    assert "loss_by_position_context.png" not in plotted  # per target of S, not per offset
    assert "Bits per byte vs context length" in (clean / "REPORT.md").read_text()
    # 512 and 64 targets make one data block per cell: too few to pair, and the report says so
    assert "paired_differences.md" not in tables(clean)
    assert (
        "### Paired differences\n\nNone: a paired comparison needs"
        in (clean / "REPORT.md").read_text()
    )


def test_corrupted_newest_checkpoint_falls_back_with_a_warning(clean, tmp_path):
    """A study whose cell died after corrupting its newest checkpoint resumes from the one
    before, says so, and ends with the clean run's numbers."""
    study = tmp_path / "study"
    shutil.copytree(clean, study)
    cell = study / "runs" / "rope-seed0"
    for name in ("rows.jsonl", "eval.json"):
        (cell / name).unlink()
    (study / "results.jsonl").unlink()
    data = [p for p in (cell / "checkpoints" / "8" / "state").rglob("*") if p.is_file()]
    for p in data:  # truncate every file of the newest step's state
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])

    proc = run_study(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint step 8" in proc.stderr and "falling back" in proc.stderr
    assert values(study) == values(clean)

    # The recomputed step 8 replaced the corrupted one.
    run = RunConfig.from_config(json.loads((cell / "config.json").read_text()))
    _, state = init_train_state(build_model(run), make_optimizer(run.optim, 8))
    ckpt = Checkpointer(cell / "checkpoints", keep=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.restore_latest(state)[1] == 8
    ckpt.close()


def test_make_report_skips_a_corrupted_line_and_names_it(clean, tmp_path):
    study = tmp_path / "study"
    shutil.copytree(clean, study)
    lines = (study / "results.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"  # a torn line 3
    (study / "results.jsonl").write_text("".join(lines))
    shutil.rmtree(study / "tables")
    (study / "REPORT.md").unlink()

    proc = subprocess.run(
        [sys.executable, "scripts/make_report.py", str(study)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{study / 'results.jsonl'}:3: skipped: not valid JSON" in proc.stderr
    report = (study / "REPORT.md").read_text()
    assert "## Problems" in report and "results.jsonl:3: skipped" in report
    # Every other row made it into the tables: only the torn row's cell differs.
    rows, problems = store.read_rows_file(study / "results.jsonl")
    assert [p.line for p in problems] == [3]
    assert len(rows) == len(lines) - 1


ROPE = Path("runs") / "rope-seed0"


RERUN = "; rerun the same command to resume"


ROPE_ONLY = tuple("--only=rope" if a == "--only=alibi,rope" else a for a in STUDY_ARGS)
assert ROPE_ONLY != STUDY_ARGS


def run_rope(workdir: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    """`run_study` of the rope cell alone (the signal tests need no second cell)."""
    cmd = [sys.executable, "scripts/run_study.py", f"--workdir={workdir}", *ROPE_ONLY]
    extra = {faults.ENV: fault} if fault else {}
    return subprocess.run(
        cmd, cwd=ROOT, env=env(**extra), capture_output=True, text=True, timeout=600
    )


def rope_values(clean: Path) -> dict:
    return {k: v for k, v in values(clean).items() if k[0] == "rope"}


def test_disk_full_or_failing_stops_the_study_with_one_line_and_a_rerun_finishes(clean, tmp_path):
    """A file-size limit (EFBIG) in orbax's first checkpoint, a failing disk (EIO) writing
    eval.json, a full disk (ENOSPC) writing rows.jsonl: each stops the study at once (the other
    cell is not started), cleans its temporary files; the rerun ends with the clean numbers."""
    study = tmp_path / "study"
    rope, alibi = study / ROPE, study / "runs" / "alibi-seed0"

    def failed(fault: str | None = None, fsize: int | None = None) -> str:
        if fsize is None:
            proc = run_study(study, fault)
        else:
            cmd = [sys.executable, "scripts/run_study.py", f"--workdir={study}", *STUDY_ARGS]
            cmd = restricted(cmd, fsize=fsize)
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600
            )
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert not alibi.exists(), "the study went on to the next cell"
        assert temporary_files(study) == []
        return last_line(proc)

    # 1. Every file is limited to 32 KiB: rope's first checkpoint cannot be written; the
    # message names the step and the file inside it that could not be written.
    line = failed(fsize=32 * 1024)
    assert re.fullmatch(
        re.escape(f"error: cannot write {rope}/checkpoints/4: [Errno 27] File too large ")
        + re.escape(f"(writing {rope}/checkpoints/4.orbax-checkpoint-tmp")
        + r"[^ ]*/[^ /]+\); "
        + re.escape("free space and rerun the same command to resume"),
        line,
    ), line
    assert not list((rope / "checkpoints").iterdir())

    # 2. The disk fails writing rope's eval.json (after training and evaluating it).
    assert failed("write:eval.json:1:EIO") == (
        f"error: cannot write {rope}/eval.json: [Errno 5] Input/output error; "
        "fix the cause and rerun the same command to resume"
    )
    assert sorted(p.name for p in (rope / "checkpoints").iterdir()) == ["4", "8"]
    assert not (rope / "eval.json").exists()

    # 3. The disk is full when rope's rows are written (its eval.json is done).
    assert failed("write:rows.jsonl:1:ENOSPC") == (
        f"error: cannot write {rope}/rows.jsonl: [Errno 28] No space left on device; "
        "free space and rerun the same command to resume"
    )
    assert (rope / "eval.json").exists() and not (rope / "rows.jsonl").exists()

    # 4. Space freed: the same command finishes the study, with the clean run's numbers.
    proc = run_study(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert values(study) == values(clean)
    assert tables(study) == tables(clean)
    assert temporary_files(study) == []


def test_sigint_and_sigterm_end_with_one_line_and_a_rerun_finishes(clean, tmp_path):
    """At exact points: mid-training, inside a checkpoint save and an atomic write (both
    completed before the process stops), during evaluation."""
    study = tmp_path / "study"
    rope = study / ROPE

    def interrupted(fault: str, status: int) -> str:
        proc = run_rope(study, fault)
        assert proc.returncode == status, proc.stderr[-3000:]
        assert temporary_files(study) == []
        return last_line(proc)

    # 1. SIGINT at step 6 of rope (its checkpoint at step 4 is on disk).
    assert interrupted("train_step:6:SIGINT", 130) == (
        "interrupted (SIGINT) at step 6 of cell rope-seed0 "
        "(8 steps; resumes from its checkpoint at step 4)" + RERUN
    )

    # 2. SIGTERM while orbax saves step 8: the save completes first.
    assert interrupted("checkpoint_save:1:SIGTERM", 143) == (
        "interrupted (SIGTERM) at step 8 of cell rope-seed0 "
        "(8 steps; resumes from its checkpoint at step 8)" + RERUN
    )
    assert sorted(p.name for p in (rope / "checkpoints").iterdir()) == ["4", "8"]

    # 3. SIGTERM during evaluation.
    assert interrupted("eval_batch:2:SIGTERM", 143) == (
        "interrupted (SIGTERM) while evaluating cell rope-seed0" + RERUN
    )
    assert not (rope / "eval.json").exists()

    # 4. SIGINT while rope's rows are written: the file is completed first.
    assert interrupted("write:rows.jsonl:1:SIGINT", 130) == (
        "interrupted (SIGINT) while writing the rows of cell rope-seed0" + RERUN
    )
    rows, problems = store.read_rows_file(rope / "rows.jsonl")
    assert problems == [] and len(rows) == len(store.read_rows_file(clean / ROPE / "rows.jsonl")[0])

    # 5. The same command finishes the study, with the clean run's numbers.
    proc = run_rope(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert values(study) == rope_values(clean)


def test_a_real_sigterm_from_outside_while_the_study_holds_its_lock(clean, tmp_path):
    study = tmp_path / "study"
    cmd = [sys.executable, "scripts/run_study.py", f"--workdir={study}", *ROPE_ONLY]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not (study / ROPE / "checkpoints" / "4").is_dir():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(WorkdirBusyError, match=rf"\(pid {proc.pid} "):
            WorkdirLock(study).acquire()  # the running study holds it
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert done.returncode == 143, err[-3000:]
    assert re.fullmatch(
        r"interrupted \(SIGTERM\) (at step \d of|while [a-z ]+) cell rope-seed0( \(.+\))?" + RERUN,
        last_line(done),
    ), last_line(done)
    assert temporary_files(study) == []
    proc = run_rope(study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert values(study) == rope_values(clean)
