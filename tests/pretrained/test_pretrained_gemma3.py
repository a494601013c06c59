"""The ``gemma3_text`` family (Gemma3ForCausalLM) beyond the parity goldens: the older
config form, the sliding-window convention, and the real Gemma 3 270M shape.

tests/pretrained/test_pretrained_hf_parity.py pins the tiny ``hf_models/gemma3_text`` model
(6 layers, 5 sliding with a window of 5 then 1 global, a RoPE scaling on the global layer)
against transformers' logits, full pass and cached generation over 32-40 tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.nn import param_count
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.pretrained import PretrainedError, load_pretrained, model_config

MODEL = Path(__file__).parent / "hf_models" / "gemma3_text"

# google/gemma-3-270m's config.json (its GGUF metadata agrees: 18 blocks, embedding 640,
# 4 heads, 1 KV head, key/value length 256, FFN 2048, window 512, freq base 1e6, eps 1e-6)
GEMMA3_270M = {
    "_sliding_window_pattern": 6,
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_bidirectional_attention": False,
    "use_cache": True,
    "vocab_size": 262144,
}


def test_the_older_config_form_maps_to_the_same_model():
    """rope_theta / rope_local_base_freq / rope_scaling and sliding_window_pattern (the
    Hub's configs) equal rope_parameters per layer type and layer_types (transformers 5)."""
    new = json.loads((MODEL / "config.json").read_text())
    old = json.loads((MODEL / "config_legacy.json").read_text())
    assert "rope_parameters" not in old and "layer_types" not in old
    cfg = model_config(new)
    assert model_config(old) == cfg
    local, full = cfg.layer_pattern[0], cfg.layer_pattern[5]
    assert len(cfg.layer_pattern) == 6 and cfg.layer_pattern[:5] == (local,) * 5
    assert (local.window, local.positional_options.base, local.positional_options.scaling) == (
        5,
        1e4,
        "none",
    )
    assert (full.window, full.positional_options.base, full.positional_options.scaling) == (
        None,
        1e6,
        "pi",  # the rope_scaling (linear x2) is the global layers' only
    )
    assert cfg.encoding_label() == "gemma3+pi"


def test_the_window_convention_is_transformers_one():
    """Query i sees keys i - W < j <= i: a window one shorter or longer than config.json's
    moves the logits far from transformers' (the golden covers 40 > W = 5 tokens)."""
    golden = np.load(MODEL / "golden.npz")
    ids = jnp.asarray(golden["input_ids"])
    lm = load_pretrained(MODEL, tokenizer=False)
    np.testing.assert_allclose(np.asarray(lm.model(ids)), golden["logits"], atol=1e-4)
    state = nnx.state(lm.model)
    for window in (4, 6):
        pattern = tuple(
            dataclasses.replace(k, window=window) if k.window else k
            for k in lm.config.layer_pattern
        )
        cfg = lm.config.replace(layer_pattern=pattern)
        other = nnx.merge(
            nnx.split(nnx.eval_shape(lambda c=cfg: DecoderOnlyLM(c, rngs=nnx.Rngs(0))))[0], state
        )
        assert np.abs(np.asarray(other(ids)) - golden["logits"]).max() > 1e-1, window


def test_the_gemma3_270m_shape_loads():
    """The mapped config of the real model builds (abstractly) with its published shapes."""
    cfg = model_config(GEMMA3_270M)
    assert (cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.d_ff) == (
        640,
        4,
        1,
        256,
        2048,
    )
    assert cfg.num_decoder_layers == 18 and cfg.vocab_size == 262144 and cfg.tie_embeddings
    kinds = cfg.layer_kinds()
    assert [k.window for k in kinds] == ([512] * 5 + [None]) * 3
    assert [k.positional_options.base for k in kinds] == ([1e4] * 5 + [1e6]) * 3
    assert cfg.query_pre_attn_scalar == 256 and cfg.norm_epsilon == 1e-6
    abstract = nnx.eval_shape(lambda: DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    total = sum(x.size for x in jax.tree.leaves(params))
    assert total == param_count.count_parameters(cfg) == 268_098_176  # "270M"
    flat = {".".join(map(str, p)): v.shape for p, v in nnx.to_flat_state(params)}
    assert flat["decoder.blocks.0.self_attention.query.kernel"] == (640, 1024)
    assert flat["decoder.blocks.0.self_attention.key.kernel"] == (640, 256)
    assert flat["decoder.blocks.0.self_attention.q_norm.scale"] == (256,)
    assert flat["decoder.blocks.5.ffn_norm.post_norm.scale"] == (640,)
    assert cfg.kv_cache_slots(32768) == 15 * 512 + 3 * 32768  # ring buffers on sliding layers


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("final_logit_softcapping", 30.0, "final_logit_softcapping=30.0 is not supported"),
        ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0 is not supported"),
        ("use_bidirectional_attention", True, "use_bidirectional_attention=True is not supported"),
        ("layer_types", ["sliding_attention"] * 3, r"layer_types=.* must list one of"),
        ("rope_parameters", {"rope_type": "default"}, "rope_parameters=.* must map layer types"),
    ],
)
def test_what_the_library_does_not_implement_is_refused(field, value, message):
    with pytest.raises(PretrainedError, match=message):
        model_config(GEMMA3_270M | {field: value})
