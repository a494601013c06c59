"""A run continues only under the identity it was made with; a workdir holds one study.

The identity (`train.identity`): the config fields that change numbers, the corpus content
hash and the versions. The cases: a finished study rerun with another schedule or
evaluation, a killed run resumed with another schedule, another jax / Python / corpus
content, the same corpus at a new path, another study in the same workdir. Each ends in one
refusal naming the fields (or, with
``restart_changed``, a fresh start in place), acceptance where nothing that changes numbers
changed. A restart in place, or a resume, deletes only what the run wrote: through the
``train`` and ``study`` commands, the user's files in a workdir stay, and a ``checkpoints/``
that is a link or holds folders no run wrote is refused. The tiny preset on a small file
corpus, 4 training steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from subprocess_checks import env, run_cases

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.nn import schedules
from flaxformer_lite.train import identity, loop
from flaxformer_lite.train.batches import TrainBatches
from flaxformer_lite.train.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]
CELL = "alibi-seed0"
WORDS = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta", b"theta"]


def toy_text(seed: int = 0, lines: int = 800) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(
        b" ".join(WORDS[i] for i in rng.integers(0, 8, size=6)) + b".\n" for _ in range(lines)
    )


def study_config(corpus: Path, **train):
    c = extrapolation_lm.get_config("tiny")
    c.data.corpus = "path"
    c.data.path = str(corpus)
    c.train.update(dict(num_steps=4, checkpoint_every=2, log_every=2) | train)
    c.eval.update(length_multiples=(1,), max_bytes=256)
    return c


def study(config, workdir: Path, only=(CELL,), **kwargs) -> dict:
    return run_study(config, workdir, only=only, report=False, progress=False, **kwargs)


def rows(workdir: Path) -> list[dict]:
    text = (workdir / "results.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def snapshot(base: Path) -> dict[str, str]:
    """``{file: sha256}`` of everything under ``base`` (the locks aside)."""
    files = (p for p in base.rglob("*") if p.is_file() and p.name != ".lock")
    return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="session")
def finished(shared) -> tuple[Path, Path]:
    """``(corpus file, study dir)``: the tiny study's alibi cell, finished (read-only)."""

    def produce(directory: Path) -> None:
        (directory / "corpus").mkdir()
        (directory / "corpus" / "toy.txt").write_bytes(toy_text())
        out = study(study_config(directory / "corpus" / "toy.txt"), directory / "study")
        assert out["done"] == [CELL] and not out["failed"]

    directory = shared("identity_finished", produce)
    return directory / "corpus" / "toy.txt", directory / "study"


@pytest.fixture
def copy(finished, tmp_path) -> tuple[Path, Path]:
    """A writable copy of the finished study (the corpus stays where it was)."""
    corpus, original = finished
    shutil.copytree(original, tmp_path / "study")
    return corpus, tmp_path / "study"


def rope_tiny():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"  # the chosen encoding's options are part of the config
    return c


def test_identity_is_what_changes_numbers():
    base = RunConfig.from_config(rope_tiny())
    same = rope_tiny()
    same.preset, same.study = "other", "other"
    same.train.update(log_every=1, eval_every=3, checkpoint_every=7, keep_checkpoints=5)
    same.train.steps_per_call = 2
    same.train.cpu_matmul = "xla"
    same.train.progress = True
    same.model.update(attention_impl="chunked", chunked_threshold=8)
    same.model.positional_options.t5.num_buckets = 7  # another encoding's option
    same.data.update(path="/elsewhere", cache_dir="/another/cache")
    same.eval.update(paired_reference="rope", paired_all=True)
    same.mesh.data = 1
    assert RunConfig.from_config(same).identity() == base.identity()
    assert RunConfig.from_config(same).hash() == base.hash()
    for path, value, named in (
        ("train.num_steps", 40, "train.num_steps: 20 -> 40"),
        ("eval.length_multiples", (1, 2), "eval.length_multiples: [1, 2, 4] -> [1, 2]"),
        ("eval.max_bytes", 512, "eval.max_bytes: 2048 -> 512"),
        ("eval.batch_size", 4, "eval.batch_size: 8 -> 4"),  # randomized positions: per batch
        ("data.batch_size", 4, "data.batch_size: 8 -> 4"),
        ("optim.learning_rate", 1e-4, "optim.learning_rate: 0.003 -> 0.0001"),
        ("model.positional_options.rope.base", 500.0, "model.positional_options.base: "),
    ):
        other = rope_tiny()
        section, *middle, field = path.split(".")
        node = other[section]
        for part in middle:
            node = node[part]
        node[field] = value
        run = RunConfig.from_config(other)
        assert run.hash() != base.hash(), path
        assert run.identity_diff(base)[0].startswith(named), run.identity_diff(base)
        assert len(run.identity_diff(base)) == 1


def test_attention_options_at_their_defaults_leave_the_identity_as_it_was():
    """Fields added after runs were recorded (attention sinks, query temperatures) are not
    in the identity while at their defaults, so earlier hashes stay valid; set, they are."""
    base = RunConfig.from_config(rope_tiny())
    identity_ = base.identity()
    for section, names in (
        ("model", ("attention_sinks", "attention_temperature", "temperature_length")),
        ("eval", ("temperatures",)),
    ):
        assert not set(names) & set(identity_[section]), section
    patterned = rope_tiny()
    patterned.model.layer_pattern = schedules.gemma3(window=4)
    kinds = RunConfig.from_config(patterned).identity()["model"]["layer_pattern"]
    expected = ["chunk", "name", "positional", "positional_options", "window"]
    assert all(sorted(k) == expected for k in kinds)  # no sinks / temperature keys
    for path, value in (
        ("model.attention_sinks", True),
        ("model.attention_temperature", "logn"),
        ("eval.temperatures", ("logn",)),
    ):
        other = rope_tiny()
        section, field = path.split(".")
        other[section][field] = value
        run = RunConfig.from_config(other)
        assert run.hash() != base.hash(), path
        assert any(line.startswith(path) for line in run.identity_diff(base)), path


def test_finished_study_rerun_with_another_schedule_is_refused_then_restarted(copy):
    """``--config.train.num_steps=40`` on a finished study is refused in one line naming the
    field, nothing written (never every cell skipped and the old tables kept with rc 0);
    settings that change no number are accepted; ``restart_changed`` trains the cell afresh."""
    corpus, workdir = copy
    before = snapshot(workdir)
    finished_rows = (workdir / "results.jsonl").read_bytes()
    with pytest.raises(ConfigError) as e:
        study(study_config(corpus, num_steps=6), workdir)
    message = str(e.value)
    assert "\n" not in message
    assert re.match(
        rf"workdir='.*/runs/{CELL}' holds a run of a different config \(differs in "
        r"train\.num_steps: 4 -> 6\); use another --workdir, the same config, or "
        r"--restart_changed to start it afresh in place$",
        message,
    ), message
    assert snapshot(workdir) == before

    # Only what does not change a number: accepted, nothing recomputed.
    quiet = study_config(corpus, log_every=1, checkpoint_every=4, keep_checkpoints=3)
    quiet.eval.paired_reference = "rope"
    quiet.model.attention_impl = "chunked"
    assert study(quiet, workdir)["done"] == [CELL]
    assert (workdir / "results.jsonl").read_bytes() == finished_rows
    old_hash = rows(workdir)[0]["config_hash"]

    out = study(study_config(corpus, num_steps=6), workdir, restart_changed=True)
    assert out["done"] == [CELL] and not out["failed"]
    cell = workdir / "runs" / CELL
    assert (cell / "rows.jsonl").read_bytes() != finished_rows
    metrics = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["split"] == "train"] == [2, 4, 6]  # from step 0
    assert json.loads((cell / "eval.json").read_text())["steps"] == 6
    recorded = json.loads((cell / identity.IDENTITY_FILE).read_text())
    assert recorded["config"]["train"]["num_steps"] == 6
    assert {r["config_hash"] for r in rows(workdir)} == {recorded["hash"]} != {old_hash}


def test_new_evaluation_lengths_keep_the_training(copy):
    """New ``eval.length_multiples`` on a finished study are refused, not ignored; with
    ``restart_changed`` the cell is evaluated again from its final checkpoint."""
    corpus, workdir = copy
    wider = study_config(corpus)
    wider.eval.length_multiples = (1, 2)
    with pytest.raises(ConfigError, match=r"differs in eval\.length_multiples: \[1\] -> \[1, 2\]"):
        study(wider, workdir)
    cell = workdir / "runs" / CELL
    trained = {p: (cell / p).read_bytes() for p in ("metrics.jsonl", "config.json")}
    checkpoints = snapshot(cell / "checkpoints")
    old_hash = rows(workdir)[0]["config_hash"]

    assert study(wider, workdir, restart_changed=True)["done"] == [CELL]
    assert (cell / "metrics.jsonl").read_bytes() == trained["metrics.jsonl"]  # not retrained
    assert snapshot(cell / "checkpoints") == checkpoints
    assert {r["eval_length"] for r in rows(workdir)} == {16, 32}
    assert {r["config_hash"] for r in rows(workdir)} != {old_hash}
    assert json.loads((cell / "config.json").read_text())["eval"]["length_multiples"] == [1, 2]


def test_killed_run_never_resumes_into_another_schedule(finished, tmp_path, monkeypatch):
    """A run killed at step 3 of 4 and resumed with 6 steps is refused (it would mix two
    learning-rate schedules under the config_hash of a clean 6-step run); restarted, it
    equals the clean run, number for number and hash for hash."""
    corpus, _ = finished
    original = TrainBatches.__call__

    def dying(self, step):
        if step == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self, step)

    monkeypatch.setattr(TrainBatches, "__call__", dying)
    with pytest.raises(KeyboardInterrupt):
        loop.train_and_evaluate(study_config(corpus), tmp_path / "a")
    monkeypatch.setattr(TrainBatches, "__call__", original)
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["2"]
    killed = json.loads((tmp_path / "a" / identity.IDENTITY_FILE).read_text())["hash"]

    with pytest.raises(ConfigError, match=r"differs in train\.num_steps: 4 -> 6\)"):
        loop.train_and_evaluate(study_config(corpus, num_steps=6), tmp_path / "a")
    restarted = loop.train_and_evaluate(
        study_config(corpus, num_steps=6), tmp_path / "a", restart_changed=True
    )
    clean = loop.train_and_evaluate(study_config(corpus, num_steps=6), tmp_path / "b")
    assert restarted["config_hash"] == clean["config_hash"] != killed
    assert [r["loss"] for r in restarted["eval"]] == [r["loss"] for r in clean["eval"]]


def test_other_versions_and_corpus_content_are_refused(copy, tmp_path, monkeypatch):
    """A resume under another jax or Python, or after the corpus's files changed, is refused
    naming the field and both values; the same content at another path is accepted; another
    git commit is only a warning."""
    corpus, workdir = copy
    moved = tmp_path / "elsewhere" / corpus.name
    moved.parent.mkdir()
    shutil.copy(corpus, moved)
    results = (workdir / "results.jsonl").read_bytes()
    assert study(study_config(moved), workdir)["done"] == [CELL]  # same bytes, new path
    assert (workdir / "results.jsonl").read_bytes() == results

    versions = identity.versions()
    for name, value in (("jax", "0.0.1"), ("python", "3.0.0"), ("flaxformer-lite", "9.9")):
        monkeypatch.setattr(identity, "versions", lambda n=name, v=value: versions | {n: v})
        pattern = re.escape(f"versions.{name}: {versions[name]!r} -> {value!r}")
        with pytest.raises(ConfigError, match=pattern):
            study(study_config(moved), workdir)
        monkeypatch.undo()

    before = snapshot(workdir)
    moved.write_bytes(toy_text(seed=1))  # same path, other bytes
    with pytest.raises(ConfigError, match=r"differs in corpus_sha256: '[0-9a-f]{16}\.\.\.' -> '"):
        study(study_config(moved), workdir)
    assert snapshot(workdir) == before

    moved.write_bytes(corpus.read_bytes())
    monkeypatch.setattr(identity.provenance, "git_commit", lambda: "0123abc")
    warning = r"its run so far used git commit \S+, this one 0123abc"
    with pytest.warns(RuntimeWarning, match=warning):
        summary = loop.train_and_evaluate(study_config(moved), workdir / "runs" / CELL)
    assert summary["config_hash"] == rows(workdir)[0]["config_hash"]  # the cached result


def test_identical_folder_corpus_at_another_path_and_cache_is_accepted(tmp_path):
    """The same corpus at a new path / cache_dir is accepted (content compared, not paths)."""
    folder = tmp_path / "a" / "docs"
    folder.mkdir(parents=True)
    for i in range(60):
        (folder / f"doc{i:02d}.txt").write_bytes(toy_text(seed=i, lines=20))
    c = study_config(folder)
    c.data.cache_dir = str(tmp_path / "cache1")
    run = RunConfig.from_config(c)
    loop.prepare_process(run)
    loop.prepare_workdir(tmp_path / "w", run)

    shutil.copytree(folder, tmp_path / "b" / "docs")
    d = study_config(tmp_path / "b" / "docs")
    d.data.cache_dir = str(tmp_path / "cache2")
    assert loop.check_workdir(tmp_path / "w", RunConfig.from_config(d)) == []
    (tmp_path / "b" / "docs" / "doc07.txt").write_bytes(b"changed\n" * 40)
    with pytest.raises(ConfigError, match=r"differs in corpus_sha256"):
        loop.check_workdir(tmp_path / "w", RunConfig.from_config(d))


def test_another_study_in_the_workdir_is_refused(copy):
    """A second study in one workdir is refused; it never replaces the first's results."""
    corpus, workdir = copy
    before = snapshot(workdir)
    tasks = extrapolation_tasks.get_config("tiny")
    with pytest.raises(ConfigError) as e:
        study(tasks, workdir, only=())
    assert str(e.value) == (
        f"workdir={str(workdir)!r} holds study 'extrapolation_lm' (preset 'tiny'), not "
        "'extrapolation_tasks' (preset 'tiny'); use another --workdir"
    )
    quick = study_config(corpus)
    quick.preset = "quick"
    with pytest.raises(ConfigError, match=r"holds study 'extrapolation_lm' \(preset 'tiny'\)"):
        study(quick, workdir)
    fewer = study_config(corpus)
    fewer.sweep.encodings = ("rope",)
    with pytest.raises(ConfigError, match=rf"holds 1 cell\(s\) that the sweep .* \({CELL}\)"):
        study(fewer, workdir, only=())
    assert snapshot(workdir) == before
    manifest = json.loads((workdir / "study.json").read_text())
    assert manifest["study"]["name"] == "extrapolation_lm" and CELL in manifest["study"]["cells"]


def test_only_subsets_share_the_workdir_and_left_out_cells_are_checked(copy):
    """--only subsets of one study fill one workdir; a changed config is refused for the
    cells --only leaves out too (the results would mix two configs), and restarting resets
    them."""
    corpus, workdir = copy
    assert study(study_config(corpus), workdir, only=("rope",))["done"] == ["rope-seed0"]
    assert {r["run"] for r in rows(workdir)} == {"rope-seed0", CELL}

    with pytest.raises(ConfigError, match=r"so do 1 more cell\(s\) \(.*\)") as e:
        study(study_config(corpus, num_steps=6), workdir, only=("rope",))
    assert "train.num_steps: 4 -> 6" in str(e.value)

    out = study(study_config(corpus, num_steps=6), workdir, only=("rope",), restart_changed=True)
    assert out["done"] == ["rope-seed0"]
    assert {r["run"] for r in rows(workdir)} == {"rope-seed0"}  # alibi: reset, not run
    alibi = workdir / "runs" / CELL
    assert not (alibi / "rows.jsonl").exists() and not (alibi / "checkpoints").exists()
    again = study(study_config(corpus, num_steps=6), workdir, only=("rope",))  # not refused
    assert again["done"] == ["rope-seed0"] and not again["failed"]


def test_cli_refusals_are_one_line(copy):
    corpus, workdir = copy
    args = [
        "--config=configs/extrapolation_lm.py:tiny",
        f"--workdir={workdir}",
        "--only=alibi",
        "--config.data.corpus=path",
        f"--config.data.path={corpus}",
        "--config.train.num_steps=40",
        "--config.train.checkpoint_every=2",
        "--config.train.log_every=2",
        "--config.eval.length_multiples=(1,)",
        "--config.eval.max_bytes=256",
        "--progress=false",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("FLAXFORMER_LITE_FAULT", None)
    for argv, pattern in (
        (args, r"differs in train\.num_steps: 4 -> 40\).*--restart_changed"),
        (
            ["--config=configs/extrapolation_tasks.py:tiny", f"--workdir={workdir}"],
            r"holds study 'extrapolation_lm' \(preset 'tiny'\), not 'extrapolation_tasks'",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "scripts/run_study.py", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(lines) == 1 and lines[0].startswith("error: workdir="), lines
        assert re.search(pattern, lines[0]), lines[0]


def test_renamed_cap_keeps_a_trained_runs_recorded_identity_but_not_a_pretrained_ones():
    """``eval.max_bytes`` (recorded as ``max_tokens``, which on a byte corpus meant the same)
    leaves a trained run's identity as recorded, so finished workdirs continue; a pretrained
    run's cap changed meaning (tokens -> bytes of text), so its identity takes the new name."""
    trained = RunConfig.from_config(rope_tiny()).identity()
    assert "max_bytes" not in trained["eval"] and trained["eval"]["max_tokens"] == 2048
    pretrained = RunConfig.from_config(rope_tiny())
    pretrained = dataclasses.replace(
        pretrained, pretrained=dataclasses.replace(pretrained.pretrained, source="/some/model")
    ).identity()
    assert "max_tokens" not in pretrained["eval"] and pretrained["eval"]["max_bytes"] == 2048


TRAIN_ARGS = (  # `flaxformer-lite train` of the finished study's cell (the same identity)
    "--config=configs/extrapolation_lm.py:tiny",
    "--config.model.positional=alibi",
    "--config.data.corpus=path",
    "--config.train.num_steps=4",
    "--config.train.checkpoint_every=2",
    "--config.train.log_every=2",
    "--config.eval.length_multiples=(1,)",
    "--config.eval.max_bytes=256",
)
USER_FILES = {"notes.md": "my notes\n", "slurm-123.out": "job log\n", "src/model.py": "x = 1\n"}


def add_user_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def run_train_cases(cases: list[list[str]]) -> list[dict]:
    """``flaxformer-lite train`` with each argument list (`subprocess_checks.HARNESS`: one
    import, a forked child per case): ``[{"rc", "output"}]``."""
    return run_cases("scripts/train.py", cases)


def test_restarts_and_resumes_never_delete_what_the_run_did_not_make(finished, tmp_path):
    """Through ``flaxformer-lite train``: ``--restart_changed`` deletes the run's own files
    only (the user's notes, job log and sources stay, named in one line); a ``checkpoints/``
    moved to another disk and replaced by a link is refused in one line, and so is a
    ``checkpoints/`` holding folders named like steps that no run wrote -- in both, the
    user's folders (``2024/``, ``6/``) are left as they were."""
    corpus, original = finished
    cell = original / "runs" / CELL
    base = [*TRAIN_ARGS, f"--config.data.path={corpus}"]
    restart, linked, foreign = (tmp_path / n for n in ("restart", "linked", "foreign"))
    for workdir in (restart, linked, foreign):
        shutil.copytree(cell, workdir)
    add_user_files(restart, USER_FILES)
    (restart / "checkpoints" / "README").write_text("mine\n")
    disk = tmp_path / "bigger_disk" / "checkpoints"
    disk.parent.mkdir()
    shutil.move(linked / "checkpoints", disk)
    (linked / "checkpoints").symlink_to(disk)
    for folder in (disk, foreign / "checkpoints"):
        add_user_files(folder, {"2024/photo.txt": "a photo\n", "6/data.txt": "data\n"})
    disk_before = snapshot(disk)
    foreign_before = snapshot(foreign)

    outs = run_train_cases(
        [
            [*base, f"--workdir={restart}", "--config.train.num_steps=6", "--restart_changed"],
            [*base, f"--workdir={linked}"],
            [*base, f"--workdir={foreign}"],
        ]
    )
    out = outs[0]
    assert out["rc"] == 0, out["output"][-3000:]
    for name, text in USER_FILES.items():
        assert (restart / name).read_text() == text, name
    assert (restart / "checkpoints" / "README").read_text() == "mine\n"
    assert json.loads((restart / "eval.json").read_text())["steps"] == 6
    kept = [line for line in out["output"].splitlines() if "kept what the run did not make" in line]
    assert len(kept) == 1 and kept[0].endswith(
        "kept what the run did not make: checkpoints/README, notes.md, slurm-123.out, src/"
    ), out["output"][-3000:]

    for out, pattern in (
        (outs[1], rf"refusing to write {re.escape(str(linked))}/checkpoints: a symbolic link "),
        (outs[2], r"checkpoints holds 6/, 2024/, named like checkpoint steps but not written"),
    ):
        lines = [line for line in out["output"].splitlines() if line.strip()]
        assert out["rc"] == 2 and len(lines) == 1, out["output"][-3000:]
        assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines[0]
    assert snapshot(disk) == disk_before
    assert snapshot(foreign) == foreign_before


def test_the_study_restart_keeps_what_the_runs_did_not_make(copy):
    """``flaxformer-lite study --restart_changed`` (what the identity refusal recommends)
    restarts the changed cell and keeps the user's files in its workdir, named in one line."""
    corpus, workdir = copy
    cell = workdir / "runs" / CELL
    add_user_files(cell, USER_FILES)
    args = [a for a in TRAIN_ARGS if "positional" not in a and "num_steps" not in a]
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/run_study.py",
            *args,
            f"--workdir={workdir}",
            "--only=alibi",
            f"--config.data.path={corpus}",
            "--config.train.num_steps=6",
            "--progress=false",
            "--restart_changed",
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, text in USER_FILES.items():
        assert (cell / name).read_text() == text, name
    assert json.loads((cell / "eval.json").read_text())["steps"] == 6
    assert (
        f"workdir={str(cell)!r}: kept what the run did not make: notes.md, slurm-123.out, src/"
        in proc.stderr.splitlines()
    ), proc.stderr[-3000:]


def test_options_added_since_runs_were_recorded_count_only_when_set():
    """A model option added later (``qk_norm``, ``layer_pattern``, ...) at its default leaves
    the identity as earlier runs recorded it; set, it is part of the identity and named."""
    base = RunConfig.from_config(rope_tiny())
    assert "qk_norm" not in base.identity()["model"]
    changed = rope_tiny()
    changed.model.qk_norm = True
    run = RunConfig.from_config(changed)
    assert run.identity()["model"]["qk_norm"] is True and run.hash() != base.hash()
    assert [x.split(":")[0] for x in run.identity_diff(base)] == ["model.qk_norm"]
