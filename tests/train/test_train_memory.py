"""The memory estimate answers any config at once, by arithmetic, and names the setting that
makes it large: through the command line, ``flaxformer-lite train`` with a million layers or
a width of 10**9 is refused in one line within seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from flax import nnx

from experiments import extrapolation_lm
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train import memory
from flaxformer_lite.train.run_config import RunConfig

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = (22 * 2**30, "test host", False)


def tiny(**model) -> RunConfig:
    c = extrapolation_lm.get_config("tiny")
    for field, value in model.items():
        c.model[field] = value
    return RunConfig.from_config(c)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"num_decoder_layers": 10**6}, "config.model.num_decoder_layers=1000000"),
        ({"d_model": 10**9}, "config.model.d_model=1000000000"),
        ({"d_ff": 10**10}, "config.model.d_ff=10000000000"),
        ({"vocab_size": 10**10}, "config.model.vocab_size=10000000000"),
    ],
)
def test_an_absurd_size_is_answered_at_once_and_named(fields, named):
    run = tiny(**fields)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as raised:
        memory.check_memory(run, available=HOST)
    assert time.perf_counter() - start < 1.0
    message = str(raised.value)
    assert message.startswith(f"{named}: one training step needs ≈ "), message
    field = named.split("=")[0]
    assert f"; lower {field} (the estimate is " in message and "\n" not in message
    assert "train_length" not in message


def test_the_count_is_the_models():
    run = tiny(num_decoder_layers=3, d_model=48, num_heads=4)
    model = nnx.eval_shape(lambda: DecoderOnlyLM(run.model, rngs=nnx.Rngs(0)))
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert memory.count_parameters(run.model) == traced


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("--config.model.num_decoder_layers=1000000", "config.model.num_decoder_layers=1000000"),
        ("--config.model.d_model=1000000000", "config.model.d_model=1000000000"),
    ],
)
def test_the_command_line_refuses_an_absurd_model_in_one_line_within_seconds(
    override, named, tmp_path
):
    env = {k: v for k, v in os.environ.items() if k != memory.ENV} | {"JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flaxformer_lite",
            "train",
            "--config=extrapolation_lm:tiny",
            override,
            f"--workdir={tmp_path / 'w'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {named}: one training step"), lines
    assert seconds < 60, seconds  # the import of JAX is most of it; minutes before
    assert not (tmp_path / "w").exists()


def test_generation_estimate_closed_form():
    run = tiny(positional="alibi")
    m = run.model
    p, n, d, f, h, v = memory.count_parameters(m), 2, 32, 64, 2, 256
    prompt, new = 4, 100
    slots = prompt + new - 1
    est = memory.generation_estimate(m, prompt_len=prompt, max_new_tokens=new)
    assert est.state == 3 * p * 4
    cache = 4 * n * slots * (2 * d + 1)
    prefill = 4 * prompt * (8 * d + 2 * f + 2 * v) + 4 * 2 * h * prompt * slots
    assert est.activations == cache + prefill + 4 * (2 * slots + new)


@pytest.mark.parametrize(
    ("prompt", "new", "start"),
    [
        (4, 10**9, "--max_new_tokens=1000000000: generating 1000000000 tokens after a 4-token"),
        (10**5, 5, "the prompt (100000 tokens): generating 5 tokens after a 100000-token"),
    ],
)
def test_generation_that_cannot_fit_is_refused_naming_what_to_change(prompt, new, start):
    with pytest.raises(ConfigError) as raised:
        memory.check_generation_memory(
            tiny(positional="alibi").model, prompt_len=prompt, max_new_tokens=new, available=HOST
        )
    assert str(raised.value).startswith(start), str(raised.value)
    memory.check_generation_memory(
        tiny().model, prompt_len=4, max_new_tokens=200, available=HOST
    )  # the default call fits
