"""evaluation.step: the argmax helper computes exactly numpy's argmax; scoring a slice of
positions at a time gives the sums of the full logits; a model rebuilt under another config
keeps its parameters; evaluation's attention threshold; the scoring step's compiler options."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.core.attention import FORWARD_CHUNKED_THRESHOLD
from flaxformer_lite.evaluation.score import attention_config
from flaxformer_lite.evaluation.step import argmax_last, rebuild_model
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.encodings.base import PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM


def test_argmax_last_equals_argmax_including_ties():
    rng = np.random.default_rng(0)
    smooth = rng.standard_normal((3, 5, 17)).astype(np.float32)
    ties = rng.integers(0, 3, (4, 6, 9)).astype(np.float32)  # many tied maxima
    ties[0, 0] = 2.0  # a row that is all maxima: index 0
    for x in (smooth, ties):
        np.testing.assert_array_equal(argmax_last(jnp.asarray(x)), np.argmax(x, axis=-1))
    assert argmax_last(jnp.asarray(ties)).dtype == jnp.int32


def _numpy_sums(logits: np.ndarray, batch: dict) -> dict:
    """The step's outputs computed in float64 numpy from the full logits."""
    z = logits.astype(np.float64)
    log_z = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    target_logit = np.take_along_axis(z, batch["targets"][..., None], -1)[..., 0]
    mask = np.asarray(batch["loss_mask"], np.float64)
    predictions = z.argmax(-1)
    return {
        "token_loss": (log_z - target_logit) * mask,
        "token_correct": (predictions == batch["targets"]) * mask,
        "predictions": predictions,
        "count": mask.sum(0),
    }


def test_scoring_a_slice_of_positions_at_a_time_equals_the_full_logits():
    """37 positions in chunks of 8 (the last one padded), of 1000 (one slice) and token by
    token through the cache: the same sums as numpy on the model's full logits."""
    import jax
    from flax import nnx

    from flaxformer_lite.evaluation import step
    from flaxformer_lite.nn.model_config import ModelConfig
    from flaxformer_lite.nn.models import DecoderOnlyLM

    cfg = ModelConfig(
        vocab_size=97, d_model=32, num_heads=2, d_ff=64, num_decoder_layers=2, positional="rope"
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    batch = {
        "inputs": rng.integers(0, 97, (3, 37)).astype(np.int32),
        "targets": rng.integers(0, 97, (3, 37)).astype(np.int32),
        "loss_mask": rng.integers(0, 2, (3, 37)).astype(np.float32),
        "positions": np.tile(np.arange(37, dtype=np.int32), (3, 1)),
    }
    want = _numpy_sums(np.asarray(model(batch["inputs"], batch["positions"])), batch)
    graphdef, params, rest = step.split_model(model)
    steps = {
        "chunk 8": step.make_eval_step(graphdef, logit_chunk=8),
        "chunk 1000": step.make_eval_step(graphdef, logit_chunk=1000),
        "incremental": step.make_incremental_eval_step(graphdef),
    }
    for name, fn in steps.items():
        got = jax.device_get(jax.jit(fn)(params, rest, batch))
        for key in ("token_loss", "token_correct", "count"):
            np.testing.assert_allclose(got[key], want[key], atol=2e-5, err_msg=f"{name} {key}")
        np.testing.assert_array_equal(got["predictions"], want["predictions"], err_msg=name)
        np.testing.assert_allclose(got["loss_sum"], want["token_loss"].sum(0), atol=5e-5)


def test_no_array_of_length_times_vocabulary_in_the_compiled_step():
    """The compiled evaluation step of a 2048-token window holds no array of more than
    ``LOGIT_CHUNK x vocabulary`` values with a vocabulary axis (the logits exist a slice at a
    time); with a slice longer than the window, the ``[1, 2048, 97]`` logits appear."""
    import re

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flaxformer_lite.evaluation import step
    from flaxformer_lite.nn.model_config import ModelConfig
    from flaxformer_lite.nn.models import DecoderOnlyLM

    cfg = ModelConfig(
        vocab_size=97, d_model=32, num_heads=2, d_ff=64, num_decoder_layers=1, positional="rope"
    )
    graphdef, params, rest = step.split_model(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)))
    fields = {"inputs": jnp.int32, "targets": jnp.int32, "loss_mask": jnp.float32}
    batch = {k: jax.ShapeDtypeStruct((1, 2048), d) for k, d in fields.items()}
    batch["positions"] = jax.ShapeDtypeStruct((1, 2048), jnp.int32)

    def vocabulary_sized(chunk: int) -> set[str]:
        fn = jax.jit(step.make_eval_step(graphdef, logit_chunk=chunk))
        text = fn.lower(params, rest, batch).compile().as_text()
        shapes = {s for s in re.findall(r"\w+\[([\d,]*)\]", text) if "97" in s.split(",")}
        return {s for s in shapes if math.prod(int(x) for x in s.split(",")) > 512 * 97}

    assert vocabulary_sized(step.LOGIT_CHUNK) == set()
    assert "1,2048,97" in vocabulary_sized(4096)


def test_rebuild_model_keeps_an_encodings_plain_array_and_the_parameters(monkeypatch, tiny_config):
    """A registered encoding may hold a plain array attribute (docs/experiments.md's example
    does); an abstract build leaves a tracer there, so the rebuilt model must be built for
    real: same logits as the model it was rebuilt from, under another attention path."""

    class HeldSlopes(PositionalEncoding):
        hook = "bias"

        def __init__(self, dims, options, *, rngs):
            self.slopes = jnp.linspace(0.5, 0.1, dims.num_heads)  # a plain array

        def bias(self, q_positions, k_positions, *, causal):
            rel = (q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
            return -self.slopes[None, :, None, None] * jnp.abs(rel)[:, None]

    spec = EncodingSpec("held_slopes_test", "bias", HeldSlopes)
    monkeypatch.setitem(registry._REGISTRY, spec.name, spec)
    cfg = tiny_config("held_slopes_test", num_encoder_layers=0, attention_impl="xla")
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(3))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (1, 12), 0, 32)
    rebuilt = rebuild_model(model, cfg.replace(attention_impl="chunked"))
    assert rebuilt.cfg.attention_impl == "chunked"
    np.testing.assert_allclose(
        np.asarray(rebuilt(tokens)), np.asarray(model(tokens)), rtol=1e-5, atol=1e-5
    )


def test_evaluation_chunks_from_the_forward_threshold():
    """`attention_config`: "xla" becomes "chunked" above 768 keys (a forward pass alone),
    "auto" keeps deciding per call with that threshold, and a model's lower threshold wins."""
    assert FORWARD_CHUNKED_THRESHOLD == 768
    xla, auto = ModelConfig(attention_impl="xla"), ModelConfig(attention_impl="auto")
    assert attention_config(xla, 768).attention_impl == "xla"
    assert attention_config(xla, 769).attention_impl == "chunked"
    assert attention_config(auto, 768) == auto  # unchanged: no rebuild
    assert attention_config(auto, 1024).chunked_threshold == 768
    assert attention_config(auto, 2048) == auto  # past the model's own threshold already
    low = ModelConfig(attention_impl="xla", chunked_threshold=64)
    assert attention_config(low, 65).attention_impl == "chunked"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="oneDNN products are a CPU setting")
def test_the_evaluator_compiles_its_step_with_the_drivers_options(tiny_config):
    """``compiler_options`` reach the compiled scoring step: oneDNN's products appear in its
    program (and not in the default one), with the same sums to float32 tolerance; an option
    XLA does not know fails the first call."""
    from flaxformer_lite.evaluation.step import Evaluator
    from flaxformer_lite.train import cpu_matmul

    if cpu_matmul.onednn_problem() is not None:
        pytest.skip(f"this jaxlib fails the oneDNN check: {cpu_matmul.onednn_problem()}")
    model = DecoderOnlyLM(tiny_config("rope", num_encoder_layers=0), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.cfg.vocab_size, (2, 17)).astype(np.int32)
    batch = {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "positions": np.broadcast_to(np.arange(16, dtype=np.int32), (2, 16)),
        "loss_mask": np.ones((2, 16), np.float32),
    }
    plain = Evaluator(model)
    onednn = Evaluator(model, compiler_options=cpu_matmul.ONEDNN_PRODUCTS)
    args = {k: jnp.asarray(v) for k, v in batch.items()}

    def program(ev):
        return ev.step.lower(ev.params, ev.rest, args).compile().as_text()

    assert "__onednn_fusion" in program(onednn) and "__onednn_fusion" not in program(plain)
    np.testing.assert_allclose(onednn(batch)["loss_sum"], plain(batch)["loss_sum"], rtol=1e-5)
    with pytest.raises(Exception, match="xla_no_such_compile_option"):
        Evaluator(model, compiler_options={"xla_no_such_compile_option": 1})(batch)
