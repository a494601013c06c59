"""Write a Hugging Face folder as llama.cpp's converter would (a test helper, not a test).

A transcription of what ``convert_hf_to_gguf.py`` (llama.cpp) does for each architecture the
library maps, written independently of `flaxformer_lite.pretrained.gguf` (which undoes it):

* tensor names from ``gguf.get_tensor_name_map`` (gguf-py's own table, the converter's);
* metadata keys from the converter's ``set_gguf_parameters`` (``GGUFWriter.add_*``);
* tensor changes from its ``modify_tensors``: llama's q/k rows permuted per head
  (``LlamaModel.permute``), Gemma 3's norms stored as ``w + 1``, GPT-2's Conv1D weights
  transposed, BLOOM's and GPT-NeoX's fused q|k|v reordered from per head to ``[q | k | v]``;
* the tokenizer as ``tokenizer.ggml.*`` keys (``gpt2``: tokens, token types, merges).

One knowing deviation: GPT-2's feed-forward width is written from ``n_inner`` (the converter
writes ``4 * n_embd``, which is wrong for models with another ``n_inner``).

``scripts/make_gguf_goldens.py`` writes the committed GGUF fixtures with it, and
tests/pretrained/test_pretrained_gguf.py converts the safetensors fixtures of
``hf_models/`` at test time (float32, so the committed transformers logits still apply).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# HF model_type -> GGUF architecture
ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "gemma3_text": "gemma3",
    "gpt2": "gpt2",
    "bloom": "bloom",
    "gpt_neox": "gptneox",
    "mpt": "mpt",
}
# buffers HF checkpoints may hold that the converter drops
SKIP = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", ".attention.bias")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A float32 safetensors file as ``{name: array}`` (numpy only, so that the torch
    environment that writes the fixtures needs nothing of this library)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        begin, end = info["data_offsets"]
        data = np.frombuffer(raw[8 + size + begin : 8 + size + end], "<f4")
        out[name] = data.reshape(info["shape"])
    return out


def random_q4_k(shape: tuple[int, ...], *, seed: int) -> np.ndarray:
    """Random Q4_K blocks for a ``[rows, cols]`` weight (``cols`` a multiple of 256): gguf-py
    dequantizes K-quants but cannot quantize to them, so a fixture's K-quant tensor is drawn
    directly as blocks (scale 5e-4 and offset 2e-3 in float16, random 6-bit scales and 4-bit
    values), which dequantize to weights in about [-0.13, 0.47]."""
    rows, cols = shape
    blocks = np.random.default_rng(seed).integers(0, 256, (rows, cols // 256, 144), np.uint8)
    blocks[..., 0:2] = np.frombuffer(np.float16(5e-4).tobytes(), np.uint8)
    blocks[..., 2:4] = np.frombuffer(np.float16(2e-3).tobytes(), np.uint8)
    return blocks.reshape(rows, cols // 256 * 144)


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (rotate-half rows -> interleaved pairs)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def qkv_to_gpt_layout(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's BLOOM / GPT-NeoX reordering: per head ``[h, 3, hd]`` -> ``[q | k | v]``."""
    rest = w.shape[1:]
    x = w.reshape(n_head, 3, w.shape[0] // n_head // 3, *rest)
    return np.concatenate([x[:, i].reshape(-1, *rest) for i in range(3)], axis=0)


def _rope_theta(cfg: dict[str, Any]) -> float:
    rope = cfg.get("rope_parameters") or {}
    if "full_attention" in rope:
        rope = rope["full_attention"]
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _metadata(w, cfg: dict[str, Any], arch: str) -> None:
    """``set_gguf_parameters`` of the converter's model class for ``arch``."""
    if arch in ("llama", "qwen2"):
        d, h = cfg["hidden_size"], cfg["num_attention_heads"]
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(d)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(h)
        w.add_head_count_kv(cfg.get("num_key_value_heads", h))
        w.add_rope_freq_base(_rope_theta(cfg))
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        if cfg.get("head_dim") is not None:
            w.add_key_length(cfg["head_dim"])
            w.add_value_length(cfg["head_dim"])
        if arch == "llama":
            w.add_vocab_size(cfg["vocab_size"])
            w.add_rope_dimension_count(cfg.get("head_dim") or d // h)
        rope = cfg.get("rope_parameters") or {}
        if rope.get("rope_type") == "linear":
            import gguf

            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    elif arch == "gemma3":
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_rope_freq_base(_rope_theta(cfg))
        w.add_sliding_window(cfg["sliding_window"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
    elif arch == "gpt2":
        w.add_block_count(cfg["n_layer"])
        w.add_context_length(cfg["n_positions"])
        w.add_embedding_length(cfg["n_embd"])
        w.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])
        w.add_head_count(cfg["n_head"])
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    elif arch == "bloom":
        d = cfg["hidden_size"]
        w.add_context_length(cfg.get("seq_length", d))
        w.add_embedding_length(d)
        w.add_feed_forward_length(4 * d)
        w.add_block_count(cfg["n_layer"])
        w.add_head_count(cfg["n_head"])
        w.add_head_count_kv(cfg["n_head"])
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    elif arch == "gptneox":
        d, h = cfg["hidden_size"], cfg["num_attention_heads"]
        fraction = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(d)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_rope_dimension_count(int(fraction * (d // h)))
        w.add_head_count(h)
        w.add_parallel_residual(cfg.get("use_parallel_residual", True))
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
    elif arch == "mpt":
        w.add_context_length(cfg["max_seq_len"])
        w.add_embedding_length(cfg["d_model"])
        w.add_block_count(cfg["n_layers"])
        w.add_feed_forward_length(4 * cfg["d_model"])
        w.add_head_count(cfg["n_heads"])
        w.add_layer_norm_eps(1e-5)
        attn = cfg["attn_config"]
        w.add_max_alibi_bias(attn["alibi_bias_max"] if attn.get("alibi") else 0.0)
    else:
        raise ValueError(arch)


def byte_level_vocab(folder: Path) -> dict[str, Any]:
    """``tokenizer.json`` (byte-level BPE) as the converter's ``_set_vocab_gpt2`` writes it."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return {
        "model": "gpt2",
        "pre": "default",
        "tokens": tokens,
        "types": [3 if t in special else 1 for t in tokens],
        "merges": merges,
    }


def _modify(arch: str, cfg: dict[str, Any], name: str, x: np.ndarray) -> np.ndarray:
    """``modify_tensors`` of the converter's model class (HF name, float32 array)."""
    if arch == "llama":
        h = cfg["num_attention_heads"]
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            return permute(x, h, h)
        if name.endswith(("k_proj.weight", "k_proj.bias")):
            return permute(x, h, cfg.get("num_key_value_heads", h))
    elif arch == "gemma3" and name.endswith("norm.weight"):
        return x + np.float32(1.0)
    elif arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
        return np.ascontiguousarray(x.T)
    elif arch in ("bloom", "gptneox") and "query_key_value" in name:
        heads = cfg.get("n_head", cfg.get("num_attention_heads"))
        return qkv_to_gpt_layout(x, heads)
    return x


def convert(
    folder: Path,
    out: Path,
    *,
    qtype: Callable[[str, np.ndarray], Any] | None = None,
    vocab: dict[str, Any] | None = None,
    name: str = "tiny",
) -> Path:
    """Write ``folder`` (config.json + model.safetensors + tokenizer.json) as the GGUF file
    ``out``. ``qtype(gguf_name, array)`` picks each tensor's stored type (default F32);
    ``vocab`` replaces the tokenizer read from ``tokenizer.json`` (keys ``model``, ``pre``,
    ``tokens``, ``types``, and ``merges`` or ``scores``, optional ``add_bos``)."""
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    arch = ARCH[cfg["model_type"]]
    tensors = read_safetensors(folder / "model.safetensors")
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer", cfg.get("n_layers")))
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), layers
    )
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name)
    _metadata(w, cfg, arch)
    vocab = byte_level_vocab(folder) if vocab is None else vocab
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    for key in ("bos", "eos", "pad", "unk"):
        value = vocab.get(f"{key}_id", cfg.get(f"{key}_token_id"))
        if value is not None:
            getattr(w, f"add_{key}_token_id")(int(value))
    if "add_bos" in vocab:
        w.add_add_bos_token(vocab["add_bos"])
    for hf_name in sorted(tensors):
        if hf_name.endswith(SKIP):
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        target = names.get_name(stem)
        if target is None and stem.startswith("transformer."):  # bloom: the converter
            target = names.get_name(stem[len("transformer.") :])  # drops "transformer."
        if target is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        x = _modify(arch, cfg, hf_name, np.asarray(tensors[hf_name], np.float32))
        kind = gguf.GGMLQuantizationType.F32 if qtype is None else qtype(target, x)
        if kind == gguf.GGMLQuantizationType.F32:
            w.add_tensor(f"{target}.{suffix}", np.ascontiguousarray(x, np.float32))
        elif kind == gguf.GGMLQuantizationType.F16:
            w.add_tensor(f"{target}.{suffix}", x.astype(np.float16))
        elif kind == gguf.GGMLQuantizationType.Q4_K:  # gguf-py cannot quantize K-quants
            w.add_tensor(
                f"{target}.{suffix}", random_q4_k(x.shape, seed=len(hf_name)), raw_dtype=kind
            )
        else:
            w.add_tensor(f"{target}.{suffix}", gguf.quants.quantize(x, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
