"""Damaged state is unfinished state: a study recomputes a cell whose ``rows.jsonl`` or
``eval.json`` is empty, cut short or unparsable (with a warning naming the file), and refuses
to average two rows of one measurement.

Red-team cases (each reproduced, then the new behaviour asserted): an empty
``runs/<cell>/rows.jsonl`` made the encoding vanish from every table with rc 0; a missing
``rows.jsonl`` with a garbage ``eval.json`` raised a bare ``JSONDecodeError`` on every
rerun; a duplicated row of one seed was shown as an interval. One tiny study (two cells,
4 steps) is trained once; every test damages a copy of it and reruns the study in-process.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from experiments import extrapolation_lm
from flaxformer_lite.experiments import results
from flaxformer_lite.experiments.runner import run_study

CELLS = ("rope-seed0", "alibi-seed0")


def config():
    c = extrapolation_lm.get_config("tiny")
    c.sweep.encodings = ("rope", "alibi")
    c.train.update(num_steps=4, checkpoint_every=4)
    c.eval.update(length_multiples=(1, 2), max_tokens=256)
    return c


def run(workdir: Path) -> tuple[dict, list[str]]:
    """The study rerun in ``workdir``: its outcome and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_study(config(), workdir, progress=False)
    return outcome, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished study (read-only: tests copy it)."""
    workdir = tmp_path_factory.mktemp("damaged") / "study"
    outcome, _ = run(workdir)
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    return workdir


@pytest.fixture
def study(finished, tmp_path) -> Path:
    copy = tmp_path / "study"
    shutil.copytree(finished, copy)
    return copy


def measurements(workdir: Path) -> dict:
    """``{(run, encoding, length, metric, bucket): value}`` of results.jsonl (no problems)."""
    rows, problems = results.read_rows_file(workdir / "results.jsonl")
    assert problems == []
    return {
        (r["run"], r["encoding"], r["eval_length"], r["metric"], r.get("bucket")): r["value"]
        for r in rows
    }


def snapshot(cell: Path) -> dict[str, bytes]:
    """The training state of a cell: its checkpoints and metrics (unchanged by a recompute
    from the final checkpoint)."""
    files = [cell / "metrics.jsonl", *(cell / "checkpoints").rglob("*")]
    return {str(p.relative_to(cell)): p.read_bytes() for p in files if p.is_file()}


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("empty", "is empty"),
        ("cut", "misses 1 expected row(s)"),  # its last line (a loss_by_position row) gone
        ("torn", "line 3 is not a valid row (not valid JSON"),
        ("garbage", "line 1 is not a valid row (not valid JSON"),
        ("other_run", "line 1 is a row of run 'alibi-seed0'"),
    ],
)
def test_a_damaged_rows_file_is_an_unfinished_cell_recomputed_from_its_checkpoint(
    finished, study, damage, problem
):
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    lines = rows_file.read_text().splitlines(keepends=True)
    if damage == "empty":
        rows_file.write_text("")
    elif damage == "cut":
        rows_file.write_text("".join(lines[:-1]))
    elif damage == "torn":
        rows_file.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2] + "\n")
    elif damage == "garbage":
        rows_file.write_bytes(b"\x00\xff not json\n")
    else:
        rows_file.write_text((study / "runs" / "alibi-seed0" / "rows.jsonl").read_text())
    before = snapshot(rows_file.parent)

    outcome, messages = run(study)

    assert any(str(rows_file) in m and problem in m for m in messages), messages
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    assert measurements(study) == measurements(finished)  # rope is back in the results
    assert snapshot(rows_file.parent) == before  # recomputed from the final checkpoint
    for table in (study / "tables").glob("bits_per_byte*.md"):
        text = table.read_text()
        assert "| rope |" in text and "| alibi |" in text


def test_a_damaged_cell_outside_only_is_left_out_with_a_warning(study):
    """Not selected (--only): not recomputed, but never merged silently as finished."""
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    rows_file.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_study(config(), study, only=["alibi"], progress=False)
    assert outcome["done"] == ["alibi-seed0"]
    assert any(str(rows_file) in str(w.message) for w in caught)
    assert {k[0] for k in measurements(study)} == {"alibi-seed0"}


@pytest.mark.parametrize("garbage", [b"{not json", b"", b"[1, 2]", b'{"config_hash": 1}'])
def test_a_garbage_eval_cache_is_evaluated_again(finished, study, garbage):
    cell = study / "runs" / "rope-seed0"
    (cell / "rows.jsonl").unlink()
    (cell / "eval.json").write_bytes(garbage)
    before = snapshot(cell)

    outcome, messages = run(study)

    eval_file = str(cell / "eval.json")
    assert any(eval_file in m and "evaluating again" in m for m in messages), messages
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    assert json.loads((cell / "eval.json").read_text())["eval"]  # rewritten whole
    assert measurements(study) == measurements(finished)
    assert snapshot(cell) == before  # no training: the final checkpoint was valid


def test_a_duplicated_row_of_one_seed_is_an_error_not_an_interval(study):
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    first = json.loads(rows_file.read_text().splitlines()[0])
    with rows_file.open("a") as f:  # the same measurement again, another value
        f.write(json.dumps(dict(first, value=first["value"] + 5.0), sort_keys=True) + "\n")
    report_before = (study / "REPORT.md").read_bytes()

    outcome, _ = run(study)

    error = outcome["failed"]["report"]
    assert error.startswith("DuplicateRowsError: duplicate results rows for")
    assert f"run='rope-seed0' seed=0 encoding={first['encoding']!r}" in error
    assert f"metric={first['metric']!r}" in error
    assert f"{study / 'results.jsonl'}:1 and" in error and str(rows_file) in error
    assert (study / "REPORT.md").read_bytes() == report_before  # no averaged table written
