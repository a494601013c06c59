"""Parity with Hugging Face transformers, offline: every family and every RoPE scaling.

The folders under ``hf_models/`` are tiny random models saved by transformers itself
(``scripts/make_hf_goldens.py``, which also computed ``golden.npz`` with PyTorch); here they
are loaded with `load_pretrained` (numpy + JAX only) and must reproduce transformers' logits
to 1e-4 in float32 -- a full forward pass, and each step of cached greedy generation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_lite as ffl
from flaxformer_lite.pretrained import load_pretrained, model_config

MODELS = Path(__file__).parent / "hf_models"
CASES = sorted(p.name for p in MODELS.iterdir() if (p / "golden.npz").is_file())
# HF's own cached decoding differs from its full forward pass only where the frequencies
# depend on the length so far (dynamic NTK, LongRoPE): there the goldens pin HF's cache.
LENGTH_DEPENDENT = {"llama_rope_dynamic", "llama_rope_longrope"}
TOL = 1e-4
SNIPPET = (
    "The transformer computes, for each position, a distribution over the next token from the "
    "tokens that came before it, and attention lets every position look back."
)


def _golden(case: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / case / "golden.npz") as z:
        return dict(z)


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = load_pretrained(MODELS / case)
        return cache[case]

    return get


def test_every_family_is_covered():
    families = {json.loads((MODELS / c / "config.json").read_text())["model_type"] for c in CASES}
    assert families >= {"gpt2", "opt", "xglm", "gpt_neox", "llama", "qwen2", "bloom", "mpt"}
    assert "gemma3_text" in families
    rope_types = {
        json.loads((MODELS / c / "config.json").read_text())
        .get("rope_parameters", {})
        .get("rope_type")
        for c in CASES
    }
    assert rope_types >= {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}


@pytest.mark.parametrize("case", CASES)
def test_full_forward_matches_transformers(case, loaded):
    golden, lm = _golden(case), loaded(case)
    logits = np.asarray(lm.model(jnp.asarray(golden["input_ids"])))
    err = np.abs(logits - golden["logits"]).max()
    assert err < TOL, f"{case}: max |logit - transformers| = {err:.2e}"


def _cached_logits(model, prompt: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """Teacher-forced cached decoding: prefill ``prompt`` [1, P], then feed ``continuation``
    [1, N] one token per step; the logits that predict each of the N tokens, [1, N, V]."""
    total = prompt.shape[1] + continuation.shape[1]
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, tokens, positions, cache):
        m = nnx.merge(graphdef, state)
        return m.decode_step(tokens, positions, cache)

    cache = model.init_cache(1, total)
    p = prompt.shape[1]
    logits, cache = step(state, jnp.asarray(prompt), jnp.arange(p)[None], cache)
    out = [np.asarray(logits[:, -1])]
    for i in range(continuation.shape[1] - 1):
        tok = jnp.asarray(continuation[:, i : i + 1])
        logits, cache = step(state, tok, jnp.full((1, 1), p + i), cache)
        out.append(np.asarray(logits[:, -1]))
    return np.stack(out, axis=1)


@pytest.mark.parametrize("case", CASES)
def test_cached_generation_matches_transformers(case, loaded):
    golden, lm = _golden(case), loaded(case)
    prompt, generated = golden["prompt_ids"], golden["generated_ids"]
    logits = _cached_logits(lm.model, prompt, generated)
    err = np.abs(logits - golden["generated_logits"]).max()
    assert err < TOL, f"{case}: cached step logits differ from transformers' by {err:.2e}"
    tokens = ffl.generate(lm.model, jnp.asarray(prompt), max_new_tokens=generated.shape[1])
    np.testing.assert_array_equal(np.asarray(tokens), generated)
    if case not in LENGTH_DEPENDENT:  # cached decoding equals the full pass over the tokens
        full = np.asarray(lm.model(jnp.asarray(np.concatenate([prompt, generated], axis=1))))
        rows = full[:, prompt.shape[1] - 1 : -1]
        assert np.abs(logits - rows).max() < TOL


def test_tokenizer_matches_transformers(loaded):
    lm = loaded("gpt2")
    ids = lm.tokenizer.encode(SNIPPET)
    np.testing.assert_array_equal(ids[:40], _golden("gpt2")["input_ids"][0])
    assert lm.tokenizer.decode(ids) == SNIPPET
    assert lm.info.tokenizer_sha256.startswith("sha256:")
    assert lm.info.weights_sha256.startswith("sha256:") and lm.info.family == "gpt2"


@pytest.mark.parametrize("case", ["llama_rope_yarn", "llama_rope_linear"])
def test_legacy_rope_config_maps_to_the_same_model(case):
    new = json.loads((MODELS / case / "config.json").read_text())
    old = json.loads((MODELS / case / "config_legacy.json").read_text())
    assert "rope_scaling" in old and "rope_parameters" not in old
    assert model_config(old) == model_config(new)


def test_bfloat16_parameters_halve_memory_and_stay_close(loaded):
    lm32 = loaded("llama")
    lm16 = load_pretrained(MODELS / "llama", dtype="bfloat16", tokenizer=False)
    leaves = jax.tree.leaves(nnx.state(lm16.model, nnx.Param))
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
    ids = jnp.asarray(_golden("llama")["input_ids"])
    diff = np.abs(np.asarray(lm16.model(ids)) - np.asarray(lm32.model(ids))).max()
    assert 0 < diff < 0.5  # bf16 rounding, nowhere near a mis-mapping (logits std ~ 1.2)


SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from flaxformer_lite.pretrained import load_pretrained
from flaxformer_lite.train.sharding import state_shardings
mesh = jax.make_mesh((1, 8), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rules = {{"embed": ("fsdp",)}}
lm = load_pretrained(
    "{folder}", tokenizer=False, shardings=lambda a: state_shardings(a, mesh, rules)
)
table = lm.model.decoder.embed.embed.embedding[...]
assert table.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp"), table.sharding
golden = np.load("{folder}/golden.npz")
err = np.abs(np.asarray(lm.model(jnp.asarray(golden["input_ids"]))) - golden["logits"]).max()
assert err < 1e-4, err
print("ok", len(table.sharding.device_set))
"""


def test_loading_shards_parameters_over_a_mesh():
    """Each parameter is placed as ``shardings`` says (here over 8 CPU devices, ``embed``
    split over ``fsdp``), and the sharded model still matches transformers."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    code = SHARDED.format(folder=MODELS / "gpt2")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "8"]


def test_copy_of_a_folder_loads(tmp_path):
    """Nothing depends on the fixture's location (e.g. a hub-cache copy)."""
    dst = tmp_path / "m"
    shutil.copytree(MODELS / "qwen2", dst)
    assert load_pretrained(dst).info.family == "qwen2"
