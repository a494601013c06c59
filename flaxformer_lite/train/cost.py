"""How long a run will take, estimated before it starts from its arithmetic.

A run's work is counted in floating-point operations from its config (Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", §2.1: ``2 P`` per token forward, ``6 P`` forward
and backward, plus attention): with ``P`` parameters, ``n`` layers of width ``d`` and a
query that attends ``s`` keys (``s = t / 2`` on average in a causal window of ``t`` tokens;
``min(W, t / 2)`` in a layer with a sliding window or chunk ``W``), one token costs
``2 P + 4 n d s`` forward (the ``q k`` scores and their weighted sum of values), three
times that in a training step. Training: ``num_steps x batch_size x L`` tokens. Evaluation:
every cell of the plan, ``windows x batch rows`` of its sequence length (its protocol's
`count` on the opened data; a cell scored token by token costs the same work).

The seconds are that work over ``EFFICIENCY x`` this machine's matmul rate, plus
``COMPILE_SECONDS`` for each step XLA compiles (the training step, and one evaluation step per
evaluated cell: `run_compiles`), the rate measured on
the default device (`matmul_rate`: a float32 matmul of 1024 x 1024, best of 3, as loaded
as the machine is now). The fraction of that rate a run reaches grows with the model's width
(`efficiency`: ``EFFICIENCY x (d_model / 64)^0.45``, at most 0.5), fitted to two runs on a
2-core CPU: the ``quick`` preset's byte model (width 64, about 15 %) and SmolLM2-135M
evaluated at 2k-16k tokens (width 576, about 41 %: 4.2e14 FLOP in 99 CPU-minutes at a
340 GFLOP/s matmul rate). The figure is an estimate to plan with; the study's per-cell lines
measure.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from flaxformer_lite.evaluation.plan import EvalPlan
from flaxformer_lite.nn import param_count
from flaxformer_lite.nn.model_config import ModelConfig

EFFICIENCY = 0.15
COMPILE_SECONDS = 2.0  # one jit compile of a small model's step on a CPU (larger take longer)


def efficiency(model: ModelConfig) -> float:
    """The fraction of the matmul rate a run of ``model`` reaches (see the module docstring)."""
    return min(0.5, EFFICIENCY * (model.d_model / 64) ** 0.45)


def token_flops(model: ModelConfig, length: int, *, training: bool) -> float:
    """Floating-point work of one token in a causal window of ``length`` tokens."""
    n, d = model.num_decoder_layers, model.d_model
    spans = [length / 2 if k.span is None else min(k.span, length / 2) for k in model.layer_kinds()]
    forward = 2 * param_count.count_parameters(model) + 4 * d * sum(spans[:n])
    return 3 * forward if training else forward


def run_flops(run: Any, plan: EvalPlan, dataset: Any) -> float:
    """The floating-point work of ``run`` (a `RunConfig`): its training (none for a
    pretrained model) and every evaluable cell of ``plan`` on ``dataset`` (the opened corpus
    or task, as `train.loop.preflight` gives them)."""
    total = 0.0
    if not run.pretrained.source:
        length = run.data.train_length
        tokens = run.train.num_steps * run.data.batch_size * length
        total += tokens * token_flops(run.model, length, training=True)
    data = dataset if plan.kind == "task" else dataset.split(plan.split)
    for cell in plan.cells:
        if cell.na is None:
            windows = cell.scoring.count(data)
            tokens = windows * cell.sequence_length
            total += tokens * token_flops(cell.model, cell.sequence_length, training=False)
    return total


def run_compiles(run: Any, plan: EvalPlan) -> int:
    """The steps XLA compiles for ``run``: one per evaluable cell of ``plan``, and the
    training step and its periodic evaluation when the run trains."""
    evaluated = sum(cell.na is None for cell in plan.cells)
    return evaluated + (0 if run.pretrained.source else 2)


def matmul_rate(size: int = 1024) -> float:
    """This machine's float32 matmul rate on the default device in FLOP/s (``size x size``,
    the best of 3 after one compile)."""
    x = jnp.ones((size, size), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def describe(flops: float, compiles: int, rate: float, reached: float = EFFICIENCY) -> str:
    """The estimate as one phrase: ``"≈ 9 min (1.2e+13 FLOP at 15% of this machine's
    150 GFLOP/s matmul rate, 10 compiles)"``; ``reached``: the fraction of the rate
    (`efficiency`)."""
    seconds = flops / (reached * rate) + COMPILE_SECONDS * compiles
    if seconds < 90:
        when = f"{seconds:.0f} s"
    elif seconds < 5400:
        when = f"{seconds / 60:.0f} min"
    else:
        when = f"{seconds / 3600:.1f} h"
    return (
        f"≈ {when} ({flops:.2g} FLOP at {reached:.0%} of this machine's "
        f"{rate / 1e9:.0f} GFLOP/s matmul rate, {compiles} compiles)"
    )
