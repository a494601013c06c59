"""The sweep runner: overrides, cell selection, rows (kill-then-rerun: test_kill_resume.py)."""

from __future__ import annotations

import json

import pytest

from experiments import extrapolation_lm
from flaxformer_lite.experiments import runner
from flaxformer_lite.train.run_config import ConfigError, RunConfig


def test_sweep_lists_every_encoding_and_seed():
    c = extrapolation_lm.get_config("cpu")
    sweep = extrapolation_lm.get_sweep(c)
    assert len(sweep) == 5 * 3
    assert sweep[0] == {
        "name": "sinusoidal-seed0",
        "overrides": {"model.positional": "sinusoidal", "seed": 0},
    }
    assert len({s["name"] for s in sweep}) == len(sweep)


def test_apply_overrides_and_errors():
    c = extrapolation_lm.get_config("tiny")
    d = runner.apply_overrides(c, {"model.positional": "rope", "seed": 3})
    assert (d.model.positional, d.seed) == ("rope", 3)
    assert c.model.positional == "alibi"  # the original is untouched
    with pytest.raises(ConfigError, match="no field 'bogus'"):
        runner.apply_overrides(c, {"model.bogus": 1})


def test_select_cells_by_encoding_or_name():
    sweep = extrapolation_lm.get_sweep(extrapolation_lm.get_config("cpu"))
    picked = runner.select_cells(sweep, ["alibi", "rope-seed2"])
    assert [c["name"] for c in picked] == [
        "rope-seed2",
        "alibi-seed0",
        "alibi-seed1",
        "alibi-seed2",
    ]
    with pytest.raises(ConfigError, match=r"--only=.*\['xpos'\] not in this sweep"):
        runner.select_cells(sweep, ["xpos"])


def test_rows_for_cell_one_row_per_length_and_metric():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    run = RunConfig.from_config(c)
    env = {
        "git_commit": "abc",
        "packages": {},
        "python": "3.11",
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "data": {"sha256": "x"},
    }
    evals = []
    for variant in ("base", "pi"):
        for length in (16, 32):
            evals.append(
                {
                    "variant": variant,
                    "eval_length": length,
                    "protocol": "nonoverlapping",
                    "stride": length,
                    "tokens": 100,
                    "loss": 1.0,
                    "bits_per_byte": 1.4,
                    "perplexity": 2.7,
                    "accuracy": 0.5,
                    "bucket_loss": {"[0,16)": 1.0} | ({"[16,32)": 1.1} if length == 32 else {}),
                    "loss_by_position": [1.0] * length,
                }
            )
    summary = {
        "config_hash": run.hash(),
        "provenance": env,
        "train_seconds": 1.0,
        "eval_seconds": 2.0,
        "eval": evals,
        "finished_at": "2026-01-01T00:00:00+00:00",
    }
    rows = runner.rows_for_cell(run, "rope-seed0", summary, "cmd")
    # per length: 4 scalars + buckets (1 or 2) + 1 curve; 2 variants
    assert len(rows) == 2 * ((4 + 1 + 1) + (4 + 2 + 1))
    labels = {r["encoding"] for r in rows}
    assert labels == {"rope", "rope+pi"}
    pi = next(r for r in rows if r["encoding"] == "rope+pi")
    assert pi["variant"]["rope_scaling"] == "pi"
    assert {r["eval_multiple"] for r in rows} == {1, 2}
    json.dumps(rows)  # serialisable
