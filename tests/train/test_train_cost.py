"""train.cost: a run's floating-point work in closed form, and the estimate's wording."""

from __future__ import annotations

import dataclasses

from configs import extrapolation_lm
from flaxformer_lite.nn.schedules import LayerKind
from flaxformer_lite.train import cost
from flaxformer_lite.train.loop import preflight
from flaxformer_lite.train.run_config import RunConfig

P = 25344  # the tiny ALiBi model's parameters (test_train_memory: closed form)


def _tiny(**eval_changes) -> RunConfig:
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "alibi"
    c.eval.update(eval_changes)
    return RunConfig.from_config(c)


def test_token_work_counts_parameters_and_the_causal_span_of_each_layer():
    model = _tiny().model  # d = 32, n = 2 layers
    assert cost.token_flops(model, 64, training=False) == 2 * P + 4 * 32 * 2 * 32
    assert cost.token_flops(model, 64, training=True) == 3 * (2 * P + 4 * 32 * 2 * 32)
    # a layer with an 8-token window attends at most 8 keys however long the window
    local = dataclasses.replace(model, layer_pattern=(LayerKind(window=8), LayerKind()))
    assert cost.token_flops(local, 64, training=False) == 2 * P + 4 * 32 * (8 + 32)


def test_run_work_is_training_plus_every_evaluated_window(tmp_path):
    run = _tiny(length_multiples=(1, 2), max_bytes=0)
    ready = preflight(run, tmp_path)
    steps, batch, length = run.train.num_steps, run.data.batch_size, run.data.train_length
    want = steps * batch * length * cost.token_flops(run.model, length, training=True)
    split = ready.dataset.split(ready.plan.split)
    for t in (length, 2 * length):  # the whole split in non-overlapping windows of t
        windows = -(-(split.num_tokens - 1) // t)  # every target once; the last window short
        assert windows == split.num_eval_windows(t) > 0
        want += windows * t * cost.token_flops(run.model, t, training=False)
    assert cost.run_flops(run, ready.plan, ready.dataset) == want


def test_the_estimate_reads_as_time_work_rate_and_compiles(tmp_path):
    rate = 150e9
    minutes = cost.describe(1.2e13, 10, rate)
    assert minutes == (
        "≈ 9 min (1.2e+13 FLOP at 15% of this machine's 150 GFLOP/s matmul rate, 10 compiles)"
    )
    assert cost.describe(cost.EFFICIENCY * rate * 26, 2, rate).startswith("≈ 30 s ")
    assert cost.describe(cost.EFFICIENCY * rate * 7200, 0, rate).startswith("≈ 2.0 h ")
    assert cost.describe(1.2e13, 0, rate, reached=0.4).startswith("≈ 3 min (1.2e+13 FLOP at 40% ")
    # wider models reach more of the rate: the byte model 15 %, SmolLM2's width 576 about 40 %
    assert cost.efficiency(_tiny().model.replace(d_model=64)) == cost.EFFICIENCY == 0.15
    assert 0.38 < cost.efficiency(_tiny().model.replace(d_model=576, num_heads=8)) < 0.42
    assert cost.efficiency(_tiny().model.replace(d_model=8192, num_heads=64)) == 0.5
    assert cost.matmul_rate() > 1e8  # any machine multiplies faster than 0.1 GFLOP/s
    run = _tiny(length_multiples=(1, 2, 4))
    plan = run.eval_plan()
    assert cost.run_compiles(run, plan) == 3 + 2  # 3 lengths; training and its evaluation
