"""Rows that must not share a table are refused by `flaxformer-lite report`: another config
(the SLURM shard launched with another override), another corpus, another jax release; and
``--allow-mixed`` merges them on purpose with a caption that says so.

Every case runs the command on rows written here by hand (no training), shaped as a study's
rows are (`results.rows.rows_for_cell`: ``setting``, ``swept``, ``data``, ``packages``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flaxformer_lite.results import comparable

ROOT = Path(__file__).resolve().parents[2]
SHA_A = "a" * 64
SHA_B = "b" * 64


def _rows(encoding: str, *, num_steps=20, sha=SHA_A, jax="0.4.30", python="3.11.9", seed=0):
    """The bits-per-byte rows of one cell of study ``s`` (two evaluation lengths)."""
    setting = {
        "seed": seed,
        "model.positional": encoding,
        "model.positional_options.base": 10000.0 if encoding == "rope" else None,
        "model.d_model": 64,
        "train.num_steps": num_steps,
        "optim.learning_rate": 0.003,
        "data.train_length": 64,
    }
    return [
        {
            "study": "s",
            "preset": "tiny",
            "run": f"{encoding}-seed{seed}",
            "seed": seed,
            "encoding": encoding,
            "train_length": 64,
            "eval_length": length,
            "protocol": "nonoverlapping",
            "task": None,
            "metric": "bits_per_byte",
            "value": value,
            "setting": setting,
            "swept": ["model.positional", "seed"],
            "data": {"name": "stdlib", "sha256": sha},
            "packages": {"jax": jax, "jaxlib": jax, "numpy": "1.26.4", "matplotlib": "3.8.0"},
            "python": python,
        }
        for length, value in ((64, 2.0 + seed / 10), (128, 2.5 + seed / 10))
    ]


def _shard(tmp_path: Path, name: str, *cells: list[dict]) -> str:
    """A study dir ``name`` holding ``cells``' rows in its results.jsonl; its path."""
    directory = tmp_path / name
    directory.mkdir()
    lines = [json.dumps(r, sort_keys=True) + "\n" for cell in cells for r in cell]
    (directory / "results.jsonl").write_text("".join(lines))
    return name


def _report(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "report", *args, "--out=out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def test_the_slurm_shard_launched_with_other_steps_is_refused_in_one_line(tmp_path):
    s0 = _shard(tmp_path, "s0", _rows("rope", num_steps=20))
    s1 = _shard(tmp_path, "s1", _rows("alibi", num_steps=60))
    proc = _report(tmp_path, s0, s1)
    assert proc.returncode == 2, proc.stderr
    assert _errors(proc) == [
        "error: train.num_steps: 20 (rope-seed0, s0/results.jsonl) vs 60 (alibi-seed0, "
        "s1/results.jsonl)",
        "error: these rows must not share a table (their numbers do not compare); report "
        "them separately, or merge them on purpose with --allow-mixed=train.num_steps",
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_two_corpora_in_one_cell_are_refused(tmp_path):
    # the same cell's seeds run under two Pythons: two stdlib corpora (and a patch release)
    s0 = _shard(tmp_path, "s0", _rows("rope", seed=0), _rows("alibi", seed=0))
    s1 = _shard(tmp_path, "s1", _rows("rope", seed=1, sha=SHA_B, python="3.11.4"))
    proc = _report(tmp_path, s0, s1)
    assert proc.returncode == 2, proc.stderr
    assert _errors(proc)[0] == (
        "error: corpus_sha256: aaaaaaaaaaaa... (rope-seed0, s0/results.jsonl) vs "
        "bbbbbbbbbbbb... (rope-seed1, s1/results.jsonl)"
    )
    assert len(_errors(proc)) == 2  # the corpus line and what to do; python only warns
    assert (
        "warning: versions.python: 3.11.9 (rope-seed0, s0/results.jsonl) vs 3.11.4 "
        "(rope-seed1, s1/results.jsonl)"
    ) in proc.stderr


def test_two_jax_releases_are_refused_and_allow_mixed_merges_them_with_a_caption(tmp_path):
    s0 = _shard(tmp_path, "s0", _rows("rope"))
    s1 = _shard(tmp_path, "s1", _rows("alibi", jax="0.5.0"))
    proc = _report(tmp_path, s0, s1)
    assert proc.returncode == 2, proc.stderr
    assert _errors(proc)[:2] == [
        "error: versions.jax: 0.4.30 (rope-seed0, s0/results.jsonl) vs 0.5.0 (alibi-seed0, "
        "s1/results.jsonl)",
        "error: versions.jaxlib: 0.4.30 (rope-seed0, s0/results.jsonl) vs 0.5.0 (alibi-seed0, "
        "s1/results.jsonl)",
    ]
    assert _errors(proc)[2].endswith("--allow-mixed=versions.jax,versions.jaxlib")

    proc = _report(tmp_path, s0, s1, "--allow-mixed=versions")
    assert proc.returncode == 0, proc.stderr
    note = (
        "Mixed on purpose (--allow-mixed): versions.jax 0.4.30 (rope-seed0) vs 0.5.0 "
        "(alibi-seed0); versions.jaxlib 0.4.30 (rope-seed0) vs 0.5.0 (alibi-seed0)."
    )
    table = (tmp_path / "out" / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    assert note in table
    assert note in proc.stdout  # the table the command prints
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert "## Mixed rows" in text
    assert (  # the runs, not the files: the report is the same wherever the rows lie
        "- `mixed on purpose (--allow-mixed): versions.jax: 0.4.30 (rope-seed0) vs 0.5.0 "
        "(alibi-seed0)`"
    ) in text


def test_allow_mixed_steps_and_a_patch_release_warns(tmp_path):
    s0 = _shard(tmp_path, "s0", _rows("rope", num_steps=20))
    s1 = _shard(tmp_path, "s1", _rows("alibi", num_steps=60, jax="0.4.31"))
    proc = _report(tmp_path, s0, s1, "--allow_mixed=train.num_steps,model.d_model")
    assert proc.returncode == 0, proc.stderr
    assert "warning: versions.jax: 0.4.30 (rope-seed0, s0/results.jsonl) vs 0.4.31" in proc.stderr
    assert "warning: --allow-mixed=model.d_model: no rows differ in it" in proc.stderr
    table = (tmp_path / "out" / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    table = table.replace("\\_", "_")  # Markdown's escaped underscores
    assert "Mixed on purpose (--allow-mixed): train.num_steps 20 (rope-seed0) vs 60" in table
    assert "Versions differ in a patch release: versions.jax 0.4.30 (rope-seed0) vs 0.4.31" in table


# ----------------------------------------------------------------------------- the rule


def test_what_is_compared_and_what_is_not():
    rope, alibi = _rows("rope"), _rows("alibi", seed=1)
    # the encoding, its options and the seed differ: that is what the table compares
    assert comparable.check(rope + alibi).refused == ()
    # a field the study's sweep set for its cells (a rate sweep) is not compared either
    fast = [r | {"setting": r["setting"] | {"optim.learning_rate": 0.01}} for r in alibi]
    assert [d.field for d in comparable.check(rope + fast).refused] == ["optim.learning_rate"]
    swept = [r | {"swept": [*r["swept"], "optim.learning_rate"]} for r in fast]
    assert comparable.check(rope + swept).refused == ()
    # rows of another table group (another train length) are not compared with these
    other = [
        r | {"train_length": 128, "setting": r["setting"] | {"train.num_steps": 9}} for r in alibi
    ]
    assert comparable.check(rope + other).refused == ()
    # rows from before a field was recorded are not compared on it
    old = [{k: v for k, v in r.items() if k not in ("setting", "packages")} for r in alibi]
    assert comparable.check(rope + old).refused == ()
    # two rows of one cell that differ are found too
    torn = [rope[0], rope[1] | {"setting": rope[1]["setting"] | {"model.d_model": 32}}]
    (difference,) = comparable.check(torn, ["a.jsonl", "b.jsonl"]).refused
    assert (
        difference.line() == "model.d_model: 64 (rope-seed0, a.jsonl) vs 32 (rope-seed0, b.jsonl)"
    )


@pytest.mark.parametrize(
    ("a", "b", "differ"),
    [
        (64, 64, False),
        (64, 64.0, True),  # as JSON records them: 64 and 64.0 are two values
        (1, True, True),
        (None, "None", True),
        ([1, 2], [1, 2], False),
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}, False),
        ([1, 2], [2, 1], True),
    ],
)
def test_recorded_values_are_compared_as_json_records_them(a, b, differ):
    def at(value, rows):
        return [r | {"setting": r["setting"] | {"model.d_model": value}} for r in rows]

    verdict = comparable.check(at(a, _rows("rope")) + at(b, _rows("alibi", seed=1)))
    assert [d.field for d in verdict.refused] == (["model.d_model"] if differ else [])


@pytest.mark.parametrize(
    ("a", "b", "patch_only"),
    [
        ("1.26.3", "1.26.4", True),
        ("0.4.30", "0.4.31", True),
        ("3.11.4", "3.11.9", True),
        ("0.4.30", "0.5.0", False),
        ("1.26.4", "2.0.0", False),
        ("0.4.30", "not installed", False),
    ],
)
def test_versions_rule(a, b, patch_only):
    verdict = comparable.check(_rows("rope", jax=a) + _rows("alibi", jax=b))
    assert bool(verdict.patch) is patch_only
    assert bool(verdict.refused) is not patch_only
