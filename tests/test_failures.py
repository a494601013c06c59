"""Every failure ends in one line (issue 16): one writer per workdir, a full or failing disk,
SIGINT/SIGTERM, and make_report's bad paths.

Each test reproduces a red-team case, then asserts the new behaviour: a second process on a
workdir is refused with the holder's pid (exit 2) and a dead holder's lock is taken over; an
OS error while writing state stops the study with one line naming the file (exit 1), leaves
no temporary file and a state that the same command resumes to the clean run's numbers;
SIGINT/SIGTERM print where the run was (exit 130/143), never cut a file or a checkpoint in
half, and resume likewise. The subprocess studies are those of test_kill_resume.py (tiny
preset, two cells, 8 steps; the signal tests run its rope cell alone) and the reruns must end
with its clean run's numbers; `flaxformer_lite.base.faults` sends the signal or raises the
OS error at an exact point (``FLAXFORMER_LITE_FAULT=<point>:<n>:SIGINT|ENOSPC|...``).
"""

from __future__ import annotations

import errno
import gc
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from test_kill_resume import STUDY_ARGS, run_study, tables, values

from experiments import extrapolation_lm
from flaxformer_lite.base import faults, interrupt
from flaxformer_lite.base.io import StateWriteError, atomic_write_text
from flaxformer_lite.base.lock import WorkdirBusyError, WorkdirLock
from flaxformer_lite.experiments import results, runner

ROOT = Path(__file__).resolve().parent.parent
ROPE = Path("runs") / "rope-seed0"
RERUN = "; rerun the same command to resume"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != faults.ENV}
    return out | {"JAX_PLATFORMS": "cpu"} | extra


def last_line(proc) -> str:
    """The last line of stderr, after checking that no traceback came before it."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines, f"rc {proc.returncode}, empty stderr"
    return lines[-1]


@pytest.fixture(scope="session")
def clean(shared) -> Path:
    """The uninterrupted study of test_kill_resume.py (one shared directory: built once)."""

    def produce(directory: Path) -> None:
        proc = run_study(directory / "study")
        assert proc.returncode == 0, proc.stderr[-3000:]
        (directory / "stderr.txt").write_text(proc.stderr)  # as test_kill_resume.py's

    return shared("kill_resume_clean", produce) / "study"


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


def temporary_files(directory: Path) -> list[Path]:
    """Temporary files of atomic writes and orbax temporary checkpoint directories."""
    return [p for p in directory.rglob("*") if re.search(r"\.tmp\d*$|orbax-checkpoint-tmp", p.name)]


RESTRICT = """
import ctypes, os, resource, sys
fsize, read_only, cmd = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
if fsize:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if read_only and os.geteuid() == 0:  # root: give up ignoring file permissions
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP: gone after the exec
os.execv(cmd[0], cmd)
"""


def restricted(cmd: list[str], *, fsize: int = 0, read_only: bool = False) -> list[str]:
    """``cmd`` run under a file-size limit (a small disk) or, for root, with file permissions
    enforced (a read-only directory is read-only to it too); no ``preexec_fn`` (a fork of this
    multithreaded process)."""
    return [sys.executable, "-c", RESTRICT, str(fsize), str(int(read_only)), *cmd]


# ----------------------------------------------------------------------------- one writer


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
                "--config=experiments/extrapolation_lm.py:tiny",
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


# ----------------------------------------------------------------------------- disk full


@pytest.mark.parametrize(
    ("patched", "code"), [("fsync", errno.ENOSPC), ("replace", errno.EIO)], ids=["enospc", "eio"]
)
def test_a_failed_atomic_write_names_the_file_and_leaves_no_temporary(
    tmp_path, monkeypatch, patched, code
):
    target = tmp_path / "rows.jsonl"
    target.write_text("old\n")

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, patched, fail)
    with pytest.raises(StateWriteError) as raised:
        atomic_write_text(target, "new\n")
    monkeypatch.undo()
    assert str(raised.value) == f"cannot write {target}: [Errno {code}] {os.strerror(code)}"
    assert raised.value.errno == code
    hint = "free space" if code == errno.ENOSPC else "fix the cause"
    assert raised.value.hint == f"{hint} and rerun the same command to resume"
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


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


@pytest.fixture
def fake_cells(monkeypatch):
    """The tiny study's rope and alibi cells, whose `Study.run_cell` raises what the test
    sets in ``raises`` instead of training; ``calls`` lists the cells started."""
    calls: list[str] = []
    raises: list[BaseException] = []

    def run_cell(self, cell):
        calls.append(cell.name)
        raise raises[0]

    monkeypatch.setattr(runner.Study, "run_cell", run_cell)
    monkeypatch.setattr(faults, "_counts", {})
    return calls, raises


def _run_tiny_study(workdir: Path):
    config = extrapolation_lm.get_config("tiny")
    return runner.run_study(
        config, workdir, only=("alibi", "rope"), report=False, progress=False, command="test"
    )


def test_a_full_disk_while_writing_error_txt_stops_the_study(fake_cells, tmp_path, monkeypatch):
    """A cell fails (its math), then writing its error.txt hits ENOSPC: one error naming
    error.txt, not a traceback from the error handler, and the next cell is not started."""
    calls, raises = fake_cells
    raises.append(FloatingPointError("loss is nan"))
    monkeypatch.setenv(faults.ENV, "write:error.txt:1:ENOSPC")
    with pytest.raises(StateWriteError) as raised:
        _run_tiny_study(tmp_path / "study")
    error = tmp_path / "study" / ROPE / "error.txt"
    assert str(raised.value) == f"cannot write {error}: [Errno 28] No space left on device"
    assert calls == ["rope-seed0"]
    assert not error.exists() and temporary_files(tmp_path) == []


@pytest.mark.parametrize(
    ("error", "stops"),
    [
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/q/metrics.jsonl"), True),
        (OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/eval.json"), True),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), False),
        (ValueError("a bug in one cell"), False),
    ],
    ids=["quota", "read-only", "enoent", "bug"],
)
def test_storage_errors_stop_the_study_other_failures_do_not(fake_cells, tmp_path, error, stops):
    calls, raises = fake_cells
    raises.append(error)
    if stops:
        with pytest.raises(StateWriteError, match=re.escape(f"cannot write {error.filename}: ")):
            _run_tiny_study(tmp_path / "study")
        assert calls == ["rope-seed0"]
    else:
        outcome = _run_tiny_study(tmp_path / "study")
        assert calls == ["rope-seed0", "alibi-seed0"]
        assert sorted(outcome["failed"]) == ["alibi-seed0", "rope-seed0"]
        assert (tmp_path / "study" / ROPE / "error.txt").exists()


# ----------------------------------------------------------------------------- signals


def test_a_signal_inside_a_deferred_section_waits_for_its_end():
    reached = []
    before = [signal.getsignal(s) for s in interrupt.SIGNALS]
    with interrupt.handling_signals():
        with pytest.raises(interrupt.Interrupted) as raised:
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now: held, not raised
                reached.append(True)
        assert reached == [True]
        assert raised.value.exit_status == 143
        with pytest.raises(interrupt.Interrupted) as raised:  # outside: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert raised.value.exit_status == 130
    assert [signal.getsignal(s) for s in interrupt.SIGNALS] == before


HANGING_COMMAND = """
import os, signal, sys, threading, time
from flaxformer_lite.base import interrupt
from flaxformer_lite.experiments import cli

MODE = sys.argv[1]  # run_command replaces sys.argv

def main(argv):
    with cli.one_line_failures():
        interrupt.where(run="cell x", phase="evaluating")
        if MODE == "shutdown":  # a thread that interpreter exit waits for, for ever
            threading.Thread(target=threading.Event().wait).start()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        finally:
            if MODE == "cleanup":  # a finally block that never ends
                threading.Event().wait()

cli.run_command(main, doc="test", module=__name__, argv=["hang"])
"""


@pytest.mark.parametrize("hang", ["cleanup", "shutdown"])
def test_an_interrupted_command_ends_even_when_its_cleanup_hangs(tmp_path, hang):
    """A command ends ``FLAXFORMER_LITE_EXIT_GRACE`` seconds after SIGTERM with status 143
    and the one line, though a ``finally`` block or a thread at interpreter exit never ends."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING_COMMAND)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), hang],
        cwd=ROOT,
        env=env(**{interrupt.GRACE_ENV: "1"}),
        capture_output=True,
        text=True,
        timeout=120,  # without the watchdog: TimeoutExpired
    )
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    lines = proc.stderr.strip().splitlines()
    line = "interrupted (SIGTERM) while evaluating cell x; rerun the same command to resume"
    assert lines[-1] == line and lines.count(line) == 1, proc.stderr[-3000:]
    warned = "warning: the process did not end within 1 s of SIGTERM"
    # the command printed its line before exit hung: the watchdog adds nothing
    assert any(x.startswith(warned) for x in lines) is (hang == "cleanup"), lines


def test_exit_grace_is_read_from_its_variable(monkeypatch):
    monkeypatch.delenv(interrupt.GRACE_ENV, raising=False)
    assert interrupt.exit_grace() == interrupt.DEFAULT_GRACE_S == 60.0
    monkeypatch.setenv(interrupt.GRACE_ENV, " 2.5 ")
    assert interrupt.exit_grace() == 2.5
    bad_values = (("0", "0.0"), ("-1", "-1.0"), ("abc", "'abc'"), ("inf", "inf"), ("nan", "nan"))
    for bad, shown in bad_values:
        monkeypatch.setenv(interrupt.GRACE_ENV, bad)
        message = f"{interrupt.GRACE_ENV}={shown}: must be a finite number > 0"
        with pytest.raises(ValueError, match=re.escape(message) + "$"):
            interrupt.exit_grace()
    with pytest.raises(ValueError, match=re.escape("exit_after=0: must be a finite number > 0")):
        with interrupt.handling_signals(exit_after=0):
            pass


def test_a_signal_handled_inside_a_gc_callback_is_not_lost():
    """Python ignores an exception raised in a garbage-collector callback (JAX registers one):
    a signal whose handler runs there is sent again and raised in ordinary code."""
    ran = []

    def callback(phase, info):
        if phase == "start" and not ran:
            ran.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # bytecode to run the handler on, inside the callback
                pass

    hook = sys.unraisablehook
    gc.callbacks.append(callback)
    try:
        with interrupt.handling_signals():
            with pytest.raises(interrupt.Interrupted) as raised:
                gc.collect()
                for _ in range(100):
                    time.sleep(0.01)
            assert raised.value.exit_status == 143
            assert ran == [True]
            # the signal came back through the hook, not from the callback's own frame
            assert "callback" not in [f.name for f in traceback.extract_tb(raised.tb)]
    finally:
        gc.callbacks.remove(callback)
    assert sys.unraisablehook is hook


SESSION_COMMAND = """
import sys, types
from flaxformer_lite.experiments import cli

shell = types.ModuleType("IPython")  # imported (tqdm.auto imports it); a shell only if running
shell.get_ipython = (lambda: object()) if sys.argv[1] == "shell" else (lambda: None)
sys.modules["IPython"] = shell
cli.run_command(lambda argv: print(cli._running_a_command), doc="test", module=__name__, argv=["p"])
"""


def test_an_interactive_session_never_arms_the_watchdog(tmp_path):
    """`run_command` in IPython / a notebook: its SystemExit does not end the kernel, so no
    watchdog may end it later; a command line arms it."""
    script = tmp_path / "session.py"
    script.write_text(SESSION_COMMAND)
    for session, armed in (("shell", "False"), ("none", "True")):
        proc = subprocess.run(
            [sys.executable, str(script), session], cwd=ROOT, env=env(), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip() == armed, proc.stderr[-3000:]


def test_without_exit_after_an_interruption_arms_no_watchdog():
    """In-process use (a notebook, these tests) catches `Interrupted` and goes on: nothing may
    end the process later."""
    with interrupt.handling_signals():
        with pytest.raises(interrupt.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert interrupt._watchdog is None


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
    rows, problems = results.read_rows_file(rope / "rows.jsonl")
    assert problems == [] and len(rows) == len(
        results.read_rows_file(clean / ROPE / "rows.jsonl")[0]
    )

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


# ----------------------------------------------------------------------------- make_report

ROW = (
    '{"study": "s", "preset": "tiny", "run": "rope-seed0", "encoding": "rope", "seed": 0, '
    '"train_length": 64, "eval_length": 64, "protocol": "nonoverlapping", "stride": 64, '
    '"task": null, "metric": "bits_per_byte", "value": 2.0}\n'
)


def make_report(*args: str, read_only: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "scripts/make_report.py", *args]
    return subprocess.run(
        restricted(cmd, read_only=True) if read_only else cmd,
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_report_on_a_bad_path_is_one_line(tmp_path):
    missing = tmp_path / "missing"
    proc = make_report(str(missing))
    assert proc.returncode == 2
    assert last_line(proc) == f"error: {missing}: no such run dir or results file"

    (tmp_path / "isdir" / "results.jsonl").mkdir(parents=True)
    proc = make_report(str(tmp_path / "isdir"))
    assert proc.returncode == 2
    assert last_line(proc) == (
        f"error: {tmp_path}/isdir/results.jsonl: is a directory, not a results file "
        "(JSON lines of rows)"
    )

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text(ROW)
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    proc = make_report(str(run), f"--out={out}")
    assert proc.returncode == 1
    assert last_line(proc) == (
        f"error: cannot write {out}/tables: [Errno 20] Not a directory; "
        f"the report goes into --out={out}"
    )


def test_make_report_into_a_read_only_dir_is_one_line(tmp_path):
    run = tmp_path / "run"
    (run / "tables").mkdir(parents=True)
    (run / "results.jsonl").write_text(ROW)
    for path in (run / "tables", run):
        path.chmod(0o555)
    try:
        probe = [sys.executable, "-c", f"open({str(run / 'probe')!r}, 'w')"]
        if subprocess.run(restricted(probe, read_only=True), capture_output=True).returncode == 0:
            pytest.skip("this process cannot give up its permission to write read-only dirs")
        proc = make_report(str(run), read_only=True)
    finally:
        for path in (run, run / "tables"):
            path.chmod(0o755)
    assert proc.returncode == 1
    assert re.fullmatch(
        rf"error: cannot write {re.escape(str(run))}/tables/\w+\.md: \[Errno 13\] Permission "
        rf"denied; the report goes into --out={re.escape(str(run))}",
        last_line(proc),
    ), last_line(proc)
    assert sorted(p.name for p in (run / "tables").iterdir()) == []  # no temporary file
