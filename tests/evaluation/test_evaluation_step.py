"""evaluation.step: the argmax helper computes exactly numpy's argmax; scoring a slice of
positions at a time gives the sums of the full logits."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from flaxformer_lite.evaluation.step import argmax_last


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
