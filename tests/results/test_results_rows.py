"""A finished run's rows are checked before a study writes them (`rows.made_rows_problem`):
the first non-finite value, or a missing expected row, names the metric, model, length and
value (through the study command: tests/study/test_study_hostile_models.py)."""

from __future__ import annotations

import math

from configs import extrapolation_lm
from flaxformer_lite.results.rows import expected_keys, made_rows_problem
from flaxformer_lite.train.run_config import RunConfig


def finished_rows(run: RunConfig) -> list[dict]:
    return [
        {
            "encoding": encoding,
            "eval_length": length,
            "protocol": protocol,
            "metric": metric,
            "value": [2.0, 1.5] if metric == "loss_by_position" else 1.25,
        }
        for encoding, length, protocol, metric in expected_keys(run)
    ]


def test_non_finite_and_missing_rows_are_named():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    run = RunConfig.from_config(c)
    rows = finished_rows(run)
    assert made_rows_problem(rows, run) is None

    curve = next(i for i, r in enumerate(rows) if r["metric"] == "loss_by_position")
    bad = [dict(r) for r in rows]
    bad[curve]["value"] = [2.0, math.inf]
    length = rows[curve]["eval_length"]
    assert made_rows_problem(bad, run) == (
        f"loss_by_position of 'rope' at length {length} (nonoverlapping) is inf at position 1: "
        "the model gave non-finite numbers"
    )
    bad = [dict(r) for r in rows]
    bad[0]["value"] = float("nan")
    assert made_rows_problem(bad, run).startswith("bits_per_byte of 'rope' at length 16 ")
    assert made_rows_problem(rows[1:], run) == (
        "the evaluation gave no bits_per_byte of 'rope' at length 16 (nonoverlapping); "
        "1 expected row(s) missing"
    )
