"""Rows with impossible numbers are skipped lines, reported with file and line: a value that
is not a finite float (NaN, ±inf, a 401-digit integer), a length beyond 2**40, negative bits
per byte, an accuracy outside [0, 1] -- never a traceback and never a table cell. A results
file loads without pickle."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from flaxformer_lite.results import store


def _row(seed=0, value=2.0, metric="bits_per_byte", **extra):
    return {
        "study": "s",
        "run": f"rope-seed{seed}",
        "seed": seed,
        "encoding": "rope",
        "train_length": 64,
        "eval_length": 64,
        "protocol": "nonoverlapping",
        "metric": metric,
        "value": value,
    } | extra


# (the line as written, what the skipped line's message says)
BAD = [
    ('{"value": NaN}', "'value' must be a finite number, got NaN"),
    ('{"value": Infinity}', "'value' must be a finite number, got Infinity"),
    ('{"value": -Infinity}', "'value' must be a finite number, got -Infinity"),
    ('{"value": 1' + "0" * 400 + "}", "'value' must be a finite number, got an integer of 401"),
    ('{"eval_length": 1' + "0" * 30 + "}", "'eval_length' must be at most 2**40"),
    ('{"train_length": 1099511627777}', "'train_length' must be at most 2**40"),
    ('{"tokens": -3}', "'tokens' must be an integer in [0, 2**40], got -3"),
    ('{"value": -0.5}', "'value' of bits_per_byte is -0.5: must be >= 0 and finite"),
    ('{"metric": "accuracy", "value": 1.5}', "'value' of accuracy is 1.5: must be in [0, 1]"),
    ('{"metric": "exact_match", "value": -0.1}', "'value' of exact_match is -0.1: must be in"),
    ('{"metric": "perplexity", "value": 0.5}', "'value' of perplexity is 0.5: must be >= 1"),
    ('{"train_seconds": 1' + "0" * 400 + "}", "'train_seconds' must be a finite number"),
    (
        '{"metric": "loss_by_position", "value": [1.0, NaN]}',
        "'value' of loss_by_position at position 1 is NaN",
    ),
    ('{"value": 1' + "0" * 5000 + "}", "not a usable JSON value (ValueError: Exceeds"),
]


def _line(patch: str) -> str:
    """A row with ``patch``'s fields replaced, as text (``patch`` may hold NaN, 10**400)."""
    if "0" * 4400 in patch:  # beyond what json.loads reads: spliced in as text
        return json.dumps(_row(seed=7)).replace('"value": 2.0', '"value": ' + patch[10:-1])
    return json.dumps(_row(seed=7))[:-1] + ", " + patch[1:]  # later keys win in json.loads


@pytest.mark.parametrize(("patch", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_an_impossible_number_is_a_skipped_line_with_its_place(tmp_path, patch, message):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + _line(patch) + "\n")
    rows, problems = store.read_rows_file(path)
    assert rows == [_row()]
    (problem,) = problems
    assert (problem.path, problem.line) == (str(path), 2)
    assert problem.message.startswith("skipped: " + message), problem.message


def test_the_limits_themselves_are_rows(tmp_path):
    path = tmp_path / "results.jsonl"
    good = [
        _row(eval_length=2**40, value=0.0),
        _row(metric="accuracy", value=1),
        _row(metric="accuracy", value=0.0, seed=1),
        _row(metric="perplexity", value=1.0),
        _row(value=None, na="the learned table has 64 rows", seed=2),
        _row(metric="loss_by_position", value=[0.5, None, 1.25]),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in good))
    assert store.read_rows_file(path) == (good, [])


def test_the_report_skips_each_impossible_row_naming_file_and_line(tmp_path):
    """Through the command: the good rows make the table (seed 1's NaN does not turn the mean
    into nan), every bad line is one warning with file:line, REPORT.md lists them."""
    lines = [json.dumps(_row(seed=0, value=2.0)), json.dumps(_row(seed=1, value=2.2))]
    lines += [_line(patch) for patch, _ in BAD]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "report", "run", "--out=out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [w for w in proc.stderr.splitlines() if w.startswith("warning: ")]
    assert len(warnings) == len(BAD)
    for number, (warning, (_, message)) in enumerate(zip(warnings, BAD, strict=True), start=3):
        assert warning.startswith(f"warning: run/results.jsonl:{number}: skipped: {message}")
    table = (tmp_path / "out" / "tables" / "bits_per_byte_nonoverlapping.csv").read_text()
    assert "nan" not in table.lower() and "inf" not in table.lower()
    assert "2.1" in table  # the mean of the two good seeds
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert f"{len(BAD)} results line(s) were skipped" in report


@pytest.fixture
def no_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used to load data")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


def test_results_load_without_pickle(tmp_path, no_pickle):
    """A results file loads with pickle refused: rows are JSON lines."""
    row = {"encoding": "rope", "metric": "loss", "value": 1.5, "eval_length": 16}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    assert store.load_rows(tmp_path) == [row]
