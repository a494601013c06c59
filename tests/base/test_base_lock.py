"""Nothing is written through a link: the workdir lock and every file written in place refuse a
symbolic link, a hard link or a special file in one line and leave its target untouched."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import STUDY_ARGS, env, last_line, run_cases

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.io import (
    StateWriteError,
    UnsafeFileError,
    append_text,
    atomic_write_text,
)
from flaxformer_lite.base.lock import WorkdirBusyError, WorkdirLock

ROOT = Path(__file__).resolve().parent.parent.parent
CONFIG = "--config=configs/extrapolation_lm.py:tiny"
PRECIOUS = "export PATH=$HOME/bin:$PATH\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    target = tmp_path / "outside" / ".bashrc"
    target.parent.mkdir()
    target.write_text(PRECIOUS)
    return target


def test_a_lock_symlink_is_refused_and_its_target_untouched(tmp_path, outside):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / ".lock").symlink_to(outside)
    with pytest.raises(UnsafeFileError) as raised:
        WorkdirLock(workdir).acquire()
    assert isinstance(raised.value, ConfigError) and isinstance(raised.value, StateWriteError)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"refusing to write {workdir / '.lock'}: a symbolic link to ")
    assert outside.read_text() == PRECIOUS
    assert (workdir / ".lock").is_symlink()


def test_a_dangling_lock_symlink_creates_nothing(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / ".lock").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafeFileError, match="a symbolic link"):
        WorkdirLock(workdir).acquire()
    assert not (tmp_path / "nowhere").exists()


def test_a_hard_linked_lock_is_refused(tmp_path, outside):
    workdir = tmp_path / "w"
    workdir.mkdir()
    os.link(outside, workdir / ".lock")
    with pytest.raises(UnsafeFileError, match="a hard link"):
        WorkdirLock(workdir).acquire()
    assert outside.read_text() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    workdir = tmp_path / "w"
    workdir.mkdir()
    if kind == "fifo":
        os.mkfifo(workdir / ".lock")
    else:
        (workdir / ".lock").mkdir()
    with pytest.raises(UnsafeFileError) as raised:
        WorkdirLock(workdir).acquire()
    assert "\n" not in str(raised.value)


def test_a_regular_lock_still_locks_and_releases(tmp_path):
    workdir = tmp_path / "w"
    with WorkdirLock(workdir):
        assert (workdir / ".lock").read_text().startswith(f"pid={os.getpid()} ")
    assert (workdir / ".lock").read_text() == ""


def test_append_refuses_a_link_and_appends_to_a_regular_file(tmp_path, outside):
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(outside)
    with pytest.raises(UnsafeFileError):
        append_text(link, "{}\n")
    assert outside.read_text() == PRECIOUS
    plain = tmp_path / "plain.jsonl"
    append_text(plain, "a\n")
    append_text(plain, "b\n")
    assert plain.read_text() == "a\nb\n"


def test_atomic_write_replaces_a_link_and_never_writes_its_target(tmp_path, outside):
    link = tmp_path / "results.jsonl"
    link.symlink_to(outside)
    tmp = tmp_path / f".results.jsonl.tmp{os.getpid()}"  # its temporary file, planted too
    tmp.symlink_to(outside)
    atomic_write_text(link, "row\n")
    assert outside.read_text() == PRECIOUS
    assert not link.is_symlink() and link.read_text() == "row\n"
    assert not tmp.exists() and not tmp.is_symlink()


# ------------------------------------------------------------------------ through the command line

# (case, script, path of the link under the workdir, its target is a directory); a state file
# without the run's identity.json is refused before anything opens it (a run of another config)
CASES = [
    ("train_lock", "train", ".lock", False),
    ("train_metrics", "train", "metrics.jsonl", False),
    ("train_tensorboard", "train", "tensorboard", True),
    ("train_probe", "train", ".write_test", False),
    ("study_lock", "run_study", ".lock", False),
    ("study_cell_lock", "run_study", "runs/rope-seed0/.lock", False),
    ("study_cell_metrics", "run_study", "runs/rope-seed0/metrics.jsonl", False),
]
OTHER_CONFIG = {"train_metrics", "study_cell_metrics"}


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run once, in one helper process per script that forks a child per case."""
    base = tmp_path_factory.mktemp("links")
    out = {}
    for script in ("train", "run_study"):
        cases = [c for c in CASES if c[1] == script]
        argvs = []
        for case, _, link, is_dir in cases:
            target = base / case / "outside" / ("events" if is_dir else ".bashrc")
            target.parent.mkdir(parents=True)
            if is_dir:
                target.mkdir()
                (target / "keep").write_text(PRECIOUS)
            else:
                target.write_text(PRECIOUS)
            workdir = base / case / "w"
            (workdir / link).parent.mkdir(parents=True, exist_ok=True)
            (workdir / link).symlink_to(target)
            only = ["--only=rope"] if script == "run_study" else []
            argvs.append([CONFIG, f"--workdir={workdir}", *only])
        results = run_cases(f"scripts/{script}.py", argvs)
        for (case, _, link, _), result in zip(cases, results, strict=True):
            outside = base / case / "outside"
            out[case] = (result, _snapshot(outside), base / case / "w" / link)
    return out


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_a_planted_link_is_refused_in_one_line_and_its_target_untouched(outcomes, case):
    result, after, link = outcomes[case]
    output = result["output"]
    errors = re.findall(r"error: [^\r\n]*", output)  # the study's bar ends with a \r, no \n
    assert "Traceback" not in result["output"], result["output"][-3000:]
    if case == "train_probe":  # the writability probe makes a file of its own: the run runs
        assert result["rc"] == 0 and errors == [], result["output"][-3000:]
    else:
        assert result["rc"] == 2, result["output"][-3000:]
        assert len(errors) == 1 and output.rstrip().endswith(errors[0]), output[-3000:]
    if case in OTHER_CONFIG:
        assert "holds a run of a different config" in errors[0], errors[0]
    elif errors:
        assert errors[0].startswith(f"error: refusing to write {link}: a symbolic link"), errors[0]
    assert set(after.values()) == {PRECIOUS.encode()}
    assert link.is_symlink()


def test_the_metrics_writer_refuses_a_linked_log_or_event_directory(tmp_path, outside):
    from flaxformer_lite.train.writer import MetricsWriter

    for name in ("metrics.jsonl", "tensorboard"):
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / name).symlink_to(outside if name == "metrics.jsonl" else outside.parent)
        with pytest.raises(UnsafeFileError, match="a symbolic link"):
            MetricsWriter(workdir, resume_step=0)
        assert outside.read_text() == PRECIOUS
        assert sorted(p.name for p in outside.parent.iterdir()) == [".bashrc"]


HOLDER = """
import sys, time
from flaxformer_lite.base.lock import WorkdirLock
locks = [WorkdirLock(path).acquire() for path in sys.argv[1:]]
print("locked", flush=True)
time.sleep(600)
"""


def test_a_locked_workdir_is_refused_with_the_holders_pid_and_taken_over_when_it_dies(tmp_path):
    study, single = tmp_path / "study", tmp_path / "single"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(study), str(single)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            WorkdirBusyError, match=rf"in use by another process \(pid {holder.pid} "
        ):
            WorkdirLock(study).acquire()

        # A second study and a second single run on the held workdirs: one line, status 2.
        second = [
            [sys.executable, "scripts/run_study.py", f"--workdir={study}", *STUDY_ARGS],
            [
                sys.executable,
                "scripts/train.py",
                "--config=configs/extrapolation_lm.py:tiny",
                f"--workdir={single}",
            ],
        ]
        procs = [
            subprocess.Popen(c, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for c in second
        ]
        for workdir, p in zip((study, single), procs, strict=True):
            out, err = p.communicate(timeout=300)
            done = subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode())
            assert done.returncode == 2, done.stderr[-3000:]
            assert re.fullmatch(
                rf"error: workdir='{re.escape(str(workdir))}': in use by another process "
                rf"\(pid {holder.pid} on host \S+ since \S+, holding {re.escape(str(workdir))}"
                r"/\.lock\); wait for it to end or stop it, or use another workdir",
                last_line(done),
            )
        # The refused processes wrote nothing: the holder's lock file is all there is.
        assert sorted(p.name for p in study.iterdir()) == [".lock"]
        assert sorted(p.name for p in single.iterdir()) == [".lock"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    # The holder died holding the lock (SIGKILL: no cleanup ran); its lock file still names
    # it, but the kernel released the lock, so the next writer takes it over.
    assert f"pid={holder.pid} " in (study / ".lock").read_text()
    with WorkdirLock(study):
        assert f"pid={os.getpid()} " in (study / ".lock").read_text()
        with pytest.raises(WorkdirBusyError, match=rf"\(pid {os.getpid()} "):
            WorkdirLock(study).acquire()  # not re-entrant, even within one process
    assert (study / ".lock").read_text() == ""  # released: no stale pid to mislead
