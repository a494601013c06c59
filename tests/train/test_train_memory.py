"""The memory estimate (`train.memory`): closed forms for a tiny config; any config answered at
once, by arithmetic, naming the setting that makes it large (through the command line,
``flaxformer-lite train`` with a million layers or a width of 10**9 is refused in one line
within seconds); a batch of 10M sequences or an evaluation length of 10M tokens refused before
any work; the generation estimate; no refusal of a shipped preset."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from flax import nnx

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.nn.schedules import LayerKind
from flaxformer_lite.study.sweeps import apply_overrides, expand_sweep
from flaxformer_lite.train import memory
from flaxformer_lite.train.run_config import PretrainedConfig, RunConfig

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


def test_generation_estimate_counts_ring_buffers_of_windowed_layers():
    """Two layers, one with a window of 8: its cache holds 8 slots, not prompt + new - 1."""
    m = tiny(positional="alibi").model
    patterned = m.replace(layer_pattern=(LayerKind(window=8), LayerKind()))
    prompt, new = 4, 100
    slots = prompt + new - 1
    assert patterned.kv_cache_slots(slots) == 8 + slots and m.kv_cache_slots(slots) == 2 * slots
    full = memory.generation_estimate(m, prompt_len=prompt, max_new_tokens=new)
    ring = memory.generation_estimate(patterned, prompt_len=prompt, max_new_tokens=new)
    d = 32  # two heads of 16: keys and values, and a position, per slot
    assert full.activations - ring.activations == 4 * (slots - 8) * (2 * d + 1)


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


GiB = 2**30


HOST_22 = (22 * GiB, "test host", False)  # this CPU machine's order of magnitude


H200 = (139 * GiB, "test H200", True)


def tiny_run(**changes) -> RunConfig:
    """The tiny preset with ALiBi (no positional parameters): d=32, f=64, h=2, n=2, V=256,
    B=8, T=16; eval lengths 16, 32, 64 in batches of 8."""
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "alibi"
    for path, value in changes.items():
        section, field = path.split("__")
        c[section][field] = value
    return RunConfig.from_config(c)


def test_parameters_closed_form():
    d, f, n, v = 32, 64, 2, 256
    layer = (4 * d * d + 4 * d) + (d * f + f + f * d + d) + 2 * 2 * d  # attn, ffn, 2 norms
    assert memory.count_parameters(tiny_run().model) == v * d + n * layer + 2 * d == 25344


def test_training_estimate_closed_form():
    p, b, t, n, d, f, h, v = 25344, 8, 16, 2, 32, 64, 2, 256
    est = memory.training_estimate(tiny_run())
    assert est.state == 4 * p * 4  # params, grads, two AdamW moments; float32
    assert est.activations == 4 * b * t * (n * (18 * d + 2 * f + 3 * h * t) + 3 * v)
    assert est.field == "config.data.batch_size" and est.value == 8
    # chunked attention: no h x T scores per layer, 3 blocks of h x min(T, 512)^2 per sequence
    est = memory.training_estimate(tiny_run(model__attention_impl="chunked"))
    assert est.activations == 4 * b * t * (n * (18 * d + 2 * f) + 3 * v) + 4 * 3 * b * h * t * t
    assert memory.training_estimate(tiny_run(), batch=1, copies=8).state == 8 * 4 * p * 4


def test_evaluation_estimate_closed_form():
    p, b, t, d, f, h, v = 25344, 8, 64, 32, 64, 2, 256  # the longest window: 4 x 16 tokens
    est = memory.evaluation_estimate(tiny_run())
    assert est.state == 3 * p * 4
    assert est.activations == 4 * b * t * (8 * d + 2 * f + 2 * v) + 4 * 2 * b * t * h * t
    assert est.what.startswith("evaluating 64-token sequences (nonoverlapping")
    # above the chunking threshold (16 keys here) the windows are chunked: blocks, not T^2
    est = memory.evaluation_estimate(tiny_run(model__chunked_threshold=16))
    assert est.activations == 4 * b * t * (8 * d + 2 * f + 2 * v) + 4 * 2 * b * h * t * t
    est = memory.evaluation_estimate(
        tiny_run(model__chunked_threshold=16, eval__length_multiples=(1, 64))
    )
    t = 1024  # the logits of 512 positions at a time (evaluation.step.LOGIT_CHUNK)
    # the chunked scores: blocks of 256 queries x 512 keys (core.chunked_attention)
    want = 4 * b * (t * (8 * d + 2 * f) + 512 * 2 * v) + 4 * 2 * b * h * 256 * 512
    assert est.activations == want
    # a dynamic-NTK cell (scored at each target's prefix length) counts the same logits, and
    # its key/value cache for the token-by-token path: 2 layers x 64 slots
    est = memory.evaluation_estimate(
        tiny_run(model__positional="rope", eval__rope_scalings=("dynamic_ntk",))
    )
    t, n = 64, 2
    want = 4 * b * (t * (8 * d + 2 * f) + t * 2 * v) + 4 * 2 * b * t * h * t
    assert est.activations == want + 4 * b * 2 * n * t * d
    assert "(nonoverlapping, rope+dynamic_ntk)" in est.what


def test_a_batch_of_ten_million_sequences_is_refused_with_the_estimate_and_setting():
    run = tiny_run(data__batch_size=10_000_000)
    with pytest.raises(ConfigError) as error:
        memory.check_memory(run, available=HOST_22)
    message = str(error.value)
    assert message.startswith("config.data.batch_size=10000000: one training step needs ≈ ")
    assert "TiB (activations" in message and "22.0 GiB available (test host)" in message
    assert "lower config.data.batch_size" in message and "\n" not in message
    # a pretrained model's run trains nothing (Gemma 3's context of 32k tokens "trained" on a
    # CPU would need over 100 GiB): only its evaluation is checked
    pretrained = dataclasses.replace(run, pretrained=PretrainedConfig(source="a-model"))
    memory.check_memory(pretrained, run.eval_plan(), available=HOST_22)


def test_an_evaluation_length_of_twenty_million_tokens_is_refused_before_training():
    run = tiny_run(eval__length_multiples=(1, 1_250_000), eval__max_bytes=0)  # 20M-token windows
    with pytest.raises(ConfigError) as error:
        memory.check_memory(run, available=HOST_22)
    message = str(error.value)
    # even one window does not fit: the length is the setting to change
    assert message.startswith("config.eval.length_multiples=(1, 1250000): evaluating ")
    assert "20000000-token sequences" in message and "lower config.eval.length_multiples" in message
    # a smaller batch would fit: the batch is named
    run = tiny_run(eval__length_multiples=(1, 62_500), eval__max_bytes=0, eval__batch_size=64)
    with pytest.raises(ConfigError, match=r"^config\.eval\.batch_size=64: evaluating 1000000-"):
        memory.check_memory(run, available=(4 * GiB, "test", False))


def test_a_model_too_large_for_one_sequence_names_the_model():
    run = tiny_run(model__d_model=8192, model__d_ff=32768, model__num_heads=64)
    with pytest.raises(ConfigError, match=r"^config\.model\.d_model=8192: one training step"):
        memory.check_memory(run, available=(1 * GiB, "test", False))
    # a small model and a long sequence: the length is named
    run = tiny_run(data__train_length=2**20, eval__length_multiples=(1,), eval__max_bytes=0)
    with pytest.raises(ConfigError, match=r"lower config\.data\.train_length or the model size"):
        memory.check_memory(run, available=(1 * GiB, "test", False))


def test_the_check_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(memory.ENV, "off")
    memory.check_memory(tiny_run(data__batch_size=10_000_000), available=HOST_22)


def test_available_memory_is_read_here():
    free, where, per_device = memory.available_memory()
    assert free is None or free > 0, where
    assert per_device is False  # the tests run on CPU


def _cells(module, preset):
    c = module.get_config(preset)
    for cell in expand_sweep(c):
        try:
            yield RunConfig.from_config(apply_overrides(c, cell["overrides"]))
        except ConfigError:  # a cell the preset's config refuses anyway (not a memory matter)
            continue


@pytest.mark.parametrize(
    ("module", "preset", "available"),
    [(extrapolation_lm, p, HOST_22) for p in ("tiny", "quick", "cpu", "all")]
    + [(extrapolation_tasks, p, HOST_22) for p in ("tiny", "quick", "all")]
    + [
        (extrapolation_lm, "wikitext103_bytes", H200),
        (extrapolation_lm, "wikitext103_bytes", HOST_22),
    ],
)
def test_no_shipped_preset_is_refused(module, preset, available):
    """Every cell of the presets fits a 22 GiB host; wikitext103_bytes (meant for an
    accelerator: ≈ 13 GiB per training step by this estimate, float32) fits one H200 and,
    truthfully, this host too."""
    runs = list(_cells(module, preset))
    assert runs
    for run in runs:
        memory.check_memory(run, available=available)
    if preset == "wikitext103_bytes":
        est = memory.training_estimate(runs[0])
        assert 8 * GiB < est.total < 16 * GiB
