"""The commands (`flaxformer_lite.cli`): the ``flaxformer-lite`` dispatcher, configs by name,
help and output, and bad input through the command line: one clear line, exit status 2 (1
for a report that cannot be written), nothing written.

Every bad-input case runs ``scripts/train.py`` or ``scripts/run_study.py`` as a user would,
with 8 simulated CPU devices (for the data-parallel batch check). To keep this fast, one helper
process per script (`subprocess_checks.HARNESS`) imports its command once and forks a child per
case (the import of JAX, Flax and orbax is most of a CLI call's time); the child calls the
command's ``run`` exactly as ``python scripts/X.py ARGS`` does. ``--help`` and make_report's bad
paths run in a subprocess (absl flags are global to a process); the dispatcher and the config
resolution in-process. The installed command from a wheel:
tests/integration/test_integration_wheel.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import env, last_line, restricted, run_cases

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite import cli
from flaxformer_lite.cli import common
from flaxformer_lite.cli.train import result_lines
from flaxformer_lite.train.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "--config=configs/extrapolation_lm.py:tiny"


def different_config(workdir: Path, positional: str) -> None:
    """A workdir holding a run of the tiny config with another learning rate."""
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = positional
    c.optim.learning_rate = 1e-4
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(RunConfig.from_config(c).to_dict()))


def a_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory\n")


# (id, extra arguments, the error line (regex), setup(dir) -> workdir or None for dir/"w")
COMMON = [
    ("lr", ["--config.optim.learning_rate=-1"], r"config\.optim\.learning_rate=-1\.0: must be > 0"),
    # values checked up front, before the workdir is written
    (
        "lr_inf",
        ["--config.optim.learning_rate=inf"],
        r"config\.optim\.learning_rate=inf: must be > 0 and finite",
    ),
    (
        "lr_nan",
        ["--config.optim.learning_rate=nan"],
        r"config\.optim\.learning_rate=nan: must be > 0 and finite",
    ),
    (
        "max_bytes_short",
        ["--config.eval.max_bytes=32"],
        r"config\.eval\.max_bytes=32: must be 0 \(every target of the split\) or >= the longest "
        r"evaluation window \(64 tokens, protocol 'nonoverlapping'\)",
    ),
    (
        "memory",
        ["--config.data.batch_size=10000000"],
        r"config\.data\.batch_size=10000000: one training step needs ≈ [\d.]+ TiB \(activations "
        r".*\), [\d.]+ [KMGT]iB available \(.*\); lower config\.data\.batch_size",
    ),
    ("batch0", ["--config.data.batch_size=0"], r"config\.data\.batch_size=0: must be > 0"),
    (
        "eval_shorter",
        ["--config.eval.length_multiples=(0,1)"],
        r"config\.eval\.length_multiples=\(0, 1\): each multiple must be >= 1 \(an eval length "
        r"shorter than the training length",
    ),
    (  # two evaluations of one length: their rows collide and the study had no results
        "eval_repeated",
        ["--config.eval.length_multiples=(1,1)"],
        r"config\.eval\.length_multiples=\(1, 1\): lists 1 twice; each value at most once",
    ),
    ("protocol", ["--config.eval.protocols=('bogus',)"], r"config\.eval\.protocols=.*must be one"),
    ("encoding", ["--config.model.positional=bogus"], r"positional='bogus'.*allowed: \["),
    ("heads", ["--config.model.num_heads=3"], r"num_heads=3: d_model=32 must be divisible"),
    (
        "learned_table",
        [
            "--config.model.positional=learned",
            "--config.model.positional_options.learned.max_length=8",
        ],
        r"config\.model\.positional_options\.learned\.max_length=8: must be >= 16: the 'learned' "
        r"encoding must encode every position of the training sequence",
    ),
    (
        "moved_model_field",
        ["--config.model.rope_base=5.0"],
        r"--config\.model\.rope_base=5\.0: config\.model has no field 'rope_base'; allowed: "
        r"\[.*'positional_options'",
    ),
    (
        "moved_eval_field",
        ["--config.eval.chunked_threshold=16"],
        r"--config\.eval\.chunked_threshold=16: config\.eval has no field 'chunked_threshold'; "
        r"allowed: \[.*'length_multiples'",
    ),
    (
        "randomized_range",
        ["--config.model.randomized_positions=true", "--config.model.max_position=20"],
        r"config\.model\.max_position=20: randomized positions need .* \(64 tokens\)",
    ),
    ("source", ["--config.data.source=bogus"], r"config\.data\.source='bogus': allowed: \["),
    (  # a byte that is not UTF-8 (as a shell passes it): no row or REPORT.md could hold it
        "path_not_utf8",
        ["--config.data.corpus=path", "--config.data.path=/tmp/corpus\udcff.txt"],
        r"^error: --config\.data\.path=b'/tmp/corpus\\xff\.txt': holds bytes that are not "
        r"UTF-8; use UTF-8 names$",
    ),
    (  # a path it reads: "cannot be read", the value cut, exit 2
        "path_too_long",
        ["--config.data.corpus=path", "--config.data.path=/tmp/" + "a" * 120_000],
        r"^error: config\.data\.path='/tmp/a+\.\.\.' \(120005 characters\): cannot be read "
        r"\(File name too long\)$",
    ),
    ("no_task", ["--config.data.source=task"], r"config\.data\.task='': a task name is required"),
    ("corpus", ["--config.data.corpus=bogus"], r"unknown corpus name 'bogus'; valid names: \["),
    (
        "corpus_path",
        ["--config.data.corpus=path", "--config.data.path=/nonexistent/x.txt"],
        r"config\.data: .*no such file or directory: /nonexistent/x\.txt",
    ),
    (
        "too_long",  # (max_bytes=0: the tiny preset's cap would be refused first)
        ["--config.data.train_length=100000000", "--config.eval.max_bytes=0"],
        r"a training window of length=100000000 needs at least",
    ),
    ("vocab", ["--config.model.vocab_size=100"], r"vocab_size=100: byte corpora need >= 256"),
    ("split", ["--config.eval.split=train"], r"config\.eval\.split='train': allowed: \["),
    ("b1", ["--config.optim.b1=1.5"], r"config\.optim\.b1=1\.5: must be in \[0, 1\)"),
    ("steps", ["--config.train.num_steps=0"], r"config\.train\.num_steps=0: must be > 0"),
    (
        "dp_divisible",
        ["--config.data.batch_size=12"],
        r"config\.data\.batch_size=12: must be divisible by the 8 data-parallel devices",
    ),
    (
        "dp_explicit",
        ["--config.mesh.data=3"],
        r"config\.data\.batch_size=8: must be divisible by the 3 data-parallel devices",
    ),
    # malformed overrides
    ("type", ["--config.train.num_steps=abc"], r"--config\.train\.num_steps='abc': must be an int"),
    (
        "unknown_field",
        ["--config.train.bogus=1"],
        r"--config\.train\.bogus=1: config\.train has no field 'bogus'; allowed: \[.*'num_steps'",
    ),
    ("unknown_section", ["--config.bogus.x=1"], r"config has no field 'bogus'; allowed: \["),
    (
        "tuple",
        ["--config.eval.length_multiples=(1,2"],
        r"length_multiples='\(1,2': must be a tuple",
    ),
    ("missing_value", ["--config.train.num_steps"], r"num_steps: missing value; .* takes an int"),
    (
        "not_a_section",
        ["--config.train.num_steps.x=3"],
        r"config\.train\.num_steps is a int, not a section",
    ),
    (
        "preset",
        ["--config=configs/extrapolation_lm.py:bogus"],
        r"--config=configs/extrapolation_lm\.py:bogus: preset='bogus' is not known; allowed",
    ),
    ("config_file", ["--config=configs/nope.py:tiny"], r"No such file or directory"),
    (  # a user's file named like a standard-library module would replace it everywhere
        "import_shadows",
        ["--import={base}/encodings.py"],
        r"--import=.*/encodings\.py: 'encodings' is a module of Python's standard library; "
        r"importing this file under the name 'encodings' would replace it",
    ),
    (
        "no_preset",
        ["--config=configs/extrapolation_lm.py"],
        r"--config=configs/extrapolation_lm\.py: name a preset, .*:PRESET with PRESET one "
        r"of " + re.escape(str(list(extrapolation_lm.PRESETS))),
    ),
]
WORKDIR_CASES = [
    ("not_writable", a_file, r"workdir='.*/file/w': '.*/file' is not a directory; must be a"),
    (
        "workdir_not_utf8",
        None,
        r"^error: --workdir=b'.*/w\\xff': holds bytes that are not UTF-8; use UTF-8 names$",
    ),
    (
        "workdir_too_long",
        None,
        r"^error: workdir='.*/d+\.\.\.' \(\d+ characters\): not a usable path \(File name too "
        r"long\); must be a writable directory$",
    ),
    (
        "backslash",
        None,
        r"workdir='.*/w\\\\x': contains a backslash, which checkpoint paths cannot hold \(orbax "
        r"would write the arrays outside the workdir\)",
    ),
]
TRAIN_CASES = [
    *COMMON,
    (
        "different_config",
        ["--config.optim.learning_rate=0.003"],
        r"workdir='.*' holds a run of a different config \(differs in "
        r"optim\.learning_rate: 0\.0001 -> 0\.003\); use another --workdir",
    ),
    ("seed", ["--config.seed=-1"], r"config\.seed=-1: must be an int in \[0, 4294967294\]"),
]
STUDY_ONLY = {  # run_study: the sweep sets the encoding, so these cases select it with --only
    "encoding": (
        "swept_field",
        ["--config.model.positional=learned"],
        r"--config\.model\.positional=learned: set for every cell by the study's sweep; "
        r"select cells with --only",
    ),
    "learned_table": (
        "learned_table",
        ["--only=learned", "--config.model.positional_options.learned.max_length=8"],
        r"config\.model\.positional_options\.learned\.max_length=8: must be >= 16: the 'learned' "
        r"encoding must encode every position of the training sequence",
    ),
}
STUDY_CASES = [
    *(STUDY_ONLY.get(case[0], case) for case in COMMON),
    (
        "different_config",
        [],
        r"workdir='.*/runs/rope-seed0' holds a run of a different config \(differs in "
        r"optim\.learning_rate: 0\.0001 -> 0\.003\)",
    ),
    ("swept_seed", ["--config.seed=1"], r"--config\.seed=1: set for every cell by the study's"),
    ("only", ["--only=xpos"], r"--only=xpos: \['xpos'\] not in this sweep; known: \["),
    (
        "seeds",
        ["--config.sweep.seeds=(-1,)"],
        r"config\.sweep\.seeds=\(-1,\): each seed must be an int in \[0, 4294967294\]",
    ),
    (
        "cell_outside",  # would be created as STUDY/runs/../../x-seed0
        ["--config.sweep.encodings=('../../x',)"],
        r"sweep cell name='\.\./\.\./x-seed0': must be a plain directory name under STUDY/runs/",
    ),
]


def _setup(script: str, case_id: str, base: Path) -> Path:
    """The case's --workdir, with its pre-existing content if the case needs some."""
    if case_id == "not_writable":
        a_file(base / "file")
        return base / "file" / "w"
    if case_id == "backslash":
        return base / "w\\x"
    if case_id == "workdir_not_utf8":
        return base / "w\udcff"
    if case_id == "workdir_too_long":
        return base / ("d" * 120_000)
    if case_id == "import_shadows":
        (base / "encodings.py").write_text("SHADOW = True\n")
    if case_id == "different_config":
        workdir = base / "w"
        if script == "train":
            different_config(workdir, "alibi")
        else:
            different_config(workdir / "runs" / "rope-seed0", "rope")
        return workdir
    return base / "w"


def _snapshot(base: Path) -> dict[str, str]:
    """``{file: sha256}`` of everything under ``base``."""
    files = (p for p in base.rglob("*") if p.is_file())
    return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _all_cases(script: str):
    cases = TRAIN_CASES if script == "train" else STUDY_CASES
    return [*cases, *((i, [], m) for i, _, m in WORKDIR_CASES)]


def _run_all(script: str, tmp: Path) -> dict[str, tuple[dict, dict, dict]]:
    argvs, bases, before = [], {}, {}
    for case_id, extra, _ in _all_cases(script):
        base = tmp / case_id
        base.mkdir()
        workdir = _setup(script, case_id, base)
        bases[case_id], before[case_id] = base, _snapshot(base)
        config = [] if any(a.startswith("--config=") for a in extra) else [CONFIG]
        only = (
            ["--only=rope"]
            if script == "run_study" and not any("--only" in a for a in extra)
            else []
        )
        extra = [a.replace("{base}", str(base)) for a in extra]
        argvs.append([*config, f"--workdir={workdir}", *only, *extra])
    eight = env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    outcomes = run_cases(f"scripts/{script}.py", argvs, environment=eight)
    return {
        case_id: (out, before[case_id], _snapshot(bases[case_id]))
        for (case_id, _, _), out in zip(_all_cases(script), outcomes, strict=True)
    }


@pytest.fixture(scope="session")
def outcomes(shared):
    """Every case of both scripts, run once per test run (shared by the xdist workers)."""

    def produce(directory: Path) -> None:
        out = {}
        for script in ("train", "run_study"):
            (directory / script).mkdir()
            out[script] = _run_all(script, directory / script)
        (directory / "outcomes.json").write_text(json.dumps(out))

    return json.loads((shared("bad_input", produce) / "outcomes.json").read_text())


@pytest.mark.parametrize(
    ("script", "case_id", "pattern"),
    [("train", i, m) for i, _, m in _all_cases("train")]
    + [("run_study", i, m) for i, _, m in _all_cases("run_study")],
    ids=[f"train-{c[0]}" for c in _all_cases("train")]
    + [f"run_study-{c[0]}" for c in _all_cases("run_study")],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(outcomes, script, case_id, pattern):
    out, before, after = outcomes[script][case_id]
    lines = [line for line in out["output"].splitlines() if line.strip()]
    assert out["rc"] == 2, out["output"][-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), out["output"][-3000:]
    assert len(lines[0]) < 2100, f"a line of {len(lines[0])} characters"  # long values are cut
    assert re.search(pattern, lines[0]), lines[0][:3000]
    assert after == before, "wrote " + str(sorted(set(after) - set(before)))


@pytest.mark.parametrize(
    ("script", "args", "missing"),
    [
        ("run_study", [], "--config and --workdir"),
        ("run_study", [CONFIG], "--workdir"),
        ("train", ["--workdir=w"], "--config"),
    ],
)
def test_missing_required_flags_are_named_in_one_line(script, args, missing, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args],
        cwd=tmp_path if not args or args[0] != CONFIG else ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: missing {missing}; e.g. --config=configs/extrapolation_lm.py:quick "
        "--workdir=runs/quick (--help lists every flag)"
    )
    assert not (tmp_path / "w").exists()


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


def test_the_dispatcher_lists_subcommands_and_refuses_unknown_ones(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["flaxformer-lite"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    for name in ("study", "train", "report", "generate", "demo"):
        assert f"\n  {name} " in err
    with pytest.raises(SystemExit) as e:
        cli.main(["flaxformer-lite", "--help"])
    assert e.value.code == 0 and "SUBCOMMAND" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["flaxformer-lite", "studdy"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: unknown subcommand 'studdy'; allowed: study, train, report, generate, demo "
        "(flaxformer-lite --help)\n"
    )


def test_configs_resolve_by_name_to_the_config_files():
    configs = common.packaged_configs()
    assert configs["extrapolation_lm"].resolve() == ROOT / "configs" / "extrapolation_lm.py"
    assert set(configs) == {"extrapolation_lm", "extrapolation_tasks", "pretrained"}
    argv = common.resolve_config(["prog", "--config=extrapolation_tasks:tiny", "--only=rope"])
    assert argv == ["prog", f"--config={configs['extrapolation_tasks']}:tiny", "--only=rope"]
    assert common.resolve_config(["prog", "--config", "extrapolation_lm:cpu"])[2] == (
        f"{configs['extrapolation_lm']}:cpu"
    )
    by_path = ["prog", "--config=configs/extrapolation_lm.py:tiny"]
    assert common.resolve_config(by_path) == by_path
    assert common.config_presets(configs["extrapolation_tasks"]) == list(
        extrapolation_tasks.PRESETS
    )


def test_an_unknown_config_name_is_one_line_naming_the_packaged_ones(capsys):
    with pytest.raises(SystemExit) as e:
        common.resolve_config(["prog", "--config=extrapolation:quick"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: --config=extrapolation:quick: no packaged study config 'extrapolation'; allowed: "
        "['extrapolation_lm', 'extrapolation_tasks', 'pretrained'] "
        "(or a config file FILE.py:PRESET)\n"
    )


def test_help_exits_0_keeps_the_usage_lines_and_lists_every_preset():
    proc = subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the backslash continuation of the usage example is printed as written
    assert "--workdir=runs/tiny \\\n        --config.model.positional=rope" in proc.stdout
    flat = " ".join(proc.stdout.split())
    assert f"extrapolation_lm: {', '.join(extrapolation_lm.PRESETS)};" in flat
    assert f"extrapolation_tasks: {', '.join(extrapolation_tasks.PRESETS)}" in flat


def test_train_prints_one_aligned_line_per_length_with_rounded_values():
    summary = {
        "eval": [
            {"encoding": "rope", "protocol": "nonoverlapping", "eval_length": 64,
             "bits_per_byte": 1.964213456},
            {"encoding": "learned", "protocol": "nonoverlapping", "eval_length": 128,
             "bits_per_byte": None, "na": "no embedding past 64"},
            {"encoding": "alibi", "protocol": "task", "eval_length": 32, "exact_match": 0.375},
        ]
    }  # fmt: skip
    assert result_lines(summary) == [
        "rope                     nonoverlapping  length     64  1.9642 bits/byte",
        "learned                  nonoverlapping  length    128  n/a (no embedding past 64)",
        "alibi                    task            length     32  37.5 % exact match",
    ]


def test_report_compares_a_rate_sweep_at_the_study_rate(tmp_path):
    from flaxformer_lite.cli.report import study_rate

    def study(name, rate):
        d = tmp_path / name
        d.mkdir()
        (d / "study.json").write_text(json.dumps({"config": {"optim": {"learning_rate": rate}}}))
        return str(d)

    a, b, c = study("a", 0.003), study("b", 0.003), study("c", 0.01)
    assert study_rate([a]) == study_rate([a, b]) == 0.003
    assert study_rate([a, c]) is None  # the studies disagree: the grid's middle rate
    assert study_rate([a, str(tmp_path / "no_study")]) is None
    assert study_rate([study("d", "fast")]) is None
