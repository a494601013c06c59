"""A GGUF file (llama.cpp's format) read as a Hugging Face checkpoint, offline and without torch.

A GGUF file holds, in one file, what a Hugging Face folder spreads over ``config.json``,
safetensors and tokenizer files: metadata keys (``general.architecture``,
``<arch>.block_count``, ``tokenizer.ggml.tokens``, ...) and tensors named llama.cpp's way
(``blk.3.attn_q.weight``), most of them quantized. This module turns it into the two things a
folder gives the loader, so the existing families map it (`load.load_pretrained` dispatches
here for a ``.gguf`` path, or a folder holding one ``.gguf`` and no ``config.json``):

* `hf_config`: the ``config.json`` dict transformers builds from the same metadata (its GGUF
  loader, ``modeling_gguf_pytorch_utils.load_gguf_checkpoint`` and
  ``integrations/ggml.py``), fed to `families.model_config`;
* `GGUFCheckpoint`: the tensors under their Hugging Face names, with the interface of
  `files.CheckpointFiles`, fed to the families' weight mappings.

Reading: ``gguf.GGUFReader`` (llama.cpp's own Python reader; the file is memory-mapped, and
its header and every tensor's byte range are checked against the file size first).
Dequantizing: ``gguf.quants.dequantize`` to float32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, the K-quants and whatever else that function supports; another type is refused in one
line naming the tensor and the type). The weights are then the dequantized float32 values:
the quantization error stays in them, as in transformers' GGUF loading.

llama.cpp's converter (``convert_hf_to_gguf.py``) changes some tensors on the way in; they are
changed back here, exactly as transformers does:

===========  ====================================================================
llama        q and k rows permuted per head for llama.cpp's interleaved RoPE
             (``LlamaModel.permute``, weights and biases): the inverse permutation
qwen2        nothing (``Qwen2Model`` does not permute)
gemma3       every ``*norm.weight`` stored as ``w + 1`` (Gemma's RMSNorm multiplies by
             ``1 + w``): ``w`` is restored; no q/k permutation
gpt2         Conv1D weights transposed to ``[out, in]``: transposed back
bloom,       the fused q|k|v projection reordered from per head ``[h, 3, hd]`` to
gptneox      ``[q | k | v]``: reordered back
mpt          nothing
===========  ====================================================================

Refused, each in one line naming the file: not a GGUF file, a header or a tensor that does
not fit the file (a truncated file), absurd sizes (answered by arithmetic before anything is
allocated), more float32 memory than the host has, an unknown architecture (the supported
list is named), metadata keys that would change the model and that nothing maps (a mixture of
experts, llama 3's frequency-factor tensor, RoPE scalings other than linear and YaRN), and an
unsupported tensor type. The tokenizer: `flaxformer_lite.pretrained.gguf_tokenizer`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flaxformer_lite.base.memory import format_bytes, host_available
from flaxformer_lite.pretrained.files import CONFIG, PretrainedError, TensorIndex, strip_prefix

SUFFIX = ".gguf"
# A tensor of more values than this is not a real model's (2^44 float32 values are 64 TiB):
# refused by arithmetic before any array is made.
MAX_ELEMENTS = 2**44


def _gguf():
    """The ``gguf`` package (llama.cpp's reader), or one line saying how to get it."""
    try:
        import gguf
    except ImportError:
        raise PretrainedError(
            "reading a GGUF file needs the `gguf` package (llama.cpp's reader): pip install "
            "'flaxformer-lite[pretrained]'"
        ) from None
    return gguf


def gguf_source(source: Any) -> Path | None:
    """The GGUF file ``source`` names, or None when it names none.

    A path ending in ``.gguf`` (which must exist), or a folder holding exactly one ``.gguf``
    file and no ``config.json`` (a folder with a ``config.json`` is a Hugging Face folder; one
    with several ``.gguf`` files is refused: pass the file)."""
    try:
        path = Path(source).expanduser()
    except TypeError:
        return None
    if path.suffix.lower() == SUFFIX:
        if not path.is_file():
            raise PretrainedError(f"{path}: no such GGUF file")
        return path
    if path.is_dir() and not (path / CONFIG).is_file():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
        if len(found) > 1:
            raise PretrainedError(
                f"{path}: holds {len(found)} GGUF files ({', '.join(p.name for p in found)}); "
                "pass the one to load"
            )
        if found:
            return found[0]
    return None


# ------------------------------------------------------------------------------- reading


def _check_preamble(path: Path, size: int) -> None:
    """Magic, version and counts from the first 24 bytes, before the reader loops over them."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise PretrainedError(f"{path}: not a GGUF file (no GGUF magic in its first bytes)")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise PretrainedError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
    tensors = int.from_bytes(head[8:16], "little")
    keys = int.from_bytes(head[16:24], "little")
    # the smallest key/value entry is 13 bytes, the smallest tensor entry 32: a header that
    # declares more than the file can hold is refused by arithmetic
    if 24 + 13 * keys + 32 * tensors > size:
        raise PretrainedError(
            f"{path}: the header declares {keys} metadata keys and {tensors} tensors, more than "
            f"a file of {size} bytes can hold (truncated or not a GGUF file)"
        )


@functools.cache
def _reader_class():
    """``gguf.GGUFReader`` that checks every tensor's type, shape and byte range against the
    file before the reader maps it (a truncated file or an absurd shape is refused in one
    line instead of failing inside numpy)."""
    gguf = _gguf()

    class Reader(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            size = int(self.data.shape[0])
            for field in fields:
                _, name_data, _, dims, raw_type, offset = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
                except ValueError:
                    raise PretrainedError(
                        f"tensor {name!r} has type id {int(raw_type[0])}, unknown to gguf "
                        f"{gguf.__version__ if hasattr(gguf, '__version__') else ''}".rstrip()
                    ) from None
                shape = [int(d) for d in dims]
                if not 1 <= len(shape) <= 4 or min(shape) < 1:
                    raise PretrainedError(f"tensor {name!r} has shape {shape}")
                count = math.prod(shape)
                if count > MAX_ELEMENTS:
                    raise PretrainedError(
                        f"tensor {name!r} declares shape {shape} ({count:.3e} values): absurd"
                    )
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                if shape[0] % block:
                    raise PretrainedError(
                        f"tensor {name!r} rows of {shape[0]} values are not whole "
                        f"{qtype.name} blocks of {block}"
                    )
                begin = int(start_offs) + int(offset[0])
                end = begin + count // block * type_size
                if end > size:
                    raise PretrainedError(
                        f"tensor {name!r} needs bytes [{begin}, {end}) but the file has {size} "
                        "bytes (truncated)"
                    )
            super()._build_tensors(start_offs, fields)

    return Reader


def read_gguf(path: Path):
    """``gguf.GGUFReader`` over ``path`` (memory-mapped), with one-line refusals."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise PretrainedError(f"{path}: cannot read it ({e.strerror})") from None
    _check_preamble(path, size)
    try:
        return _reader_class()(path)
    except PretrainedError as e:
        raise PretrainedError(f"{path}: {e}") from None
    except Exception as e:  # the reader's own parse errors: ValueError, KeyError, IndexError
        detail = str(e).splitlines()[0] if str(e) else ""
        raise PretrainedError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {detail}; truncated?)"
        ) from None


class Metadata:
    """The key/value metadata of a GGUF file, read by name with typed getters whose errors
    name the file and the key."""

    def __init__(self, reader: Any, path: Path):
        self.path = path
        self.fields = reader.fields
        self.tensor_names = frozenset(t.name for t in reader.tensors)
        self.read: set[str] = set()  # the keys asked for (`hf_config` refuses the others)

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        field = self.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:  # a malformed value
            raise PretrainedError(f"{self.path}: metadata {key} is unreadable ({e})") from None

    def length(self, key: str) -> int | None:
        """The number of items of an array key without reading them."""
        field = self.fields.get(key)
        return None if field is None else len(field.data)

    def _fail(self, key: str, value: Any, what: str):
        raise PretrainedError(f"{self.path}: metadata {key}={value!r} {what}")

    def int(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise PretrainedError(f"{self.path}: no metadata {key} (needed)")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self._fail(key, value, "must be a positive int")
        return int(value)

    def float(self, key: str, default: float | None = None) -> float:
        value = self.get(key, default)
        if value is None:
            raise PretrainedError(f"{self.path}: no metadata {key} (needed)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            self._fail(key, value, "must be a number >= 0")
        return float(value)

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self.get(key, default)
        if value is not None and not isinstance(value, str):
            self._fail(key, value, "must be a string")
        return value


# --------------------------------------------------------------------- config (HF dicts)


def _rope(meta: Metadata, arch: str, *, theta_default: float) -> dict[str, Any]:
    """HF ``rope_parameters`` from ``<arch>.rope.*`` (llama.cpp's ``rope.scaling.type``:
    none, linear -> HF ``linear``, yarn -> HF ``yarn``)."""
    params: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": meta.float(f"{arch}.rope.freq_base", theta_default),
    }
    key = f"{arch}.rope.scaling"
    kind = meta.str(f"{key}.type", "none")
    for unmapped in ("alpha", "attn_factor", "yarn_ext_factor", "yarn_attn_factor",
                     "yarn_log_multiplier"):  # fmt: skip
        if f"{key}.{unmapped}" in meta:
            raise PretrainedError(
                f"{meta.path}: metadata {key}.{unmapped}={meta.get(f'{key}.{unmapped}')!r} is "
                "not supported (no Hugging Face RoPE option reproduces it here)"
            )
    if kind == "linear":
        params.update(rope_type="linear", factor=meta.float(f"{key}.factor"))
    elif kind == "yarn":
        params.update(
            rope_type="yarn",
            factor=meta.float(f"{key}.factor"),
            original_max_position_embeddings=meta.int(f"{key}.original_context_length"),
        )
        for ours, hf in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if f"{key}.{ours}" in meta:
                params[hf] = meta.float(f"{key}.{ours}")
    elif kind != "none":
        raise PretrainedError(
            f"{meta.path}: metadata {key}.type={kind!r} is not supported; supported: none, "
            "linear, yarn"
        )
    return params


def _common(meta: Metadata, arch: str) -> dict[str, Any]:
    """Fields every architecture shares: vocabulary size, tied head, token ids."""
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = meta.length("tokenizer.ggml.tokens")
    if vocab is None:
        raise PretrainedError(
            f"{meta.path}: no {arch}.vocab_size and no tokenizer.ggml.tokens to count"
        )
    config: dict[str, Any] = {
        "vocab_size": vocab,
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in meta.tensor_names,
    }
    for ours, hf in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("unknown_token_id", "unk_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        value = meta.get(f"tokenizer.ggml.{ours}")
        if value is not None:
            config[hf] = value
    return config


def _refuse_experts(meta: Metadata, arch: str) -> None:
    count = meta.get(f"{arch}.expert_count")
    if count:
        raise PretrainedError(
            f"{meta.path}: metadata {arch}.expert_count={count!r}: mixtures of experts are not "
            "supported"
        )


def _head_dim(meta: Metadata, arch: str) -> int | None:
    """The per-head width the file states (``attention.key_length``, ``.value_length``,
    ``rope.dimension_count``: llama.cpp writes the ones it knows); they must agree (a
    partial rotation or a value width of its own is not a llama / Qwen2 model)."""
    keys = [f"{arch}.attention.key_length", f"{arch}.attention.value_length"]
    keys.append(f"{arch}.rope.dimension_count")
    stated = {k: meta.int(k) for k in keys if k in meta}
    if len(set(stated.values())) > 1:
        raise PretrainedError(
            f"{meta.path}: metadata {stated} disagree; {arch} models have one head_dim, all "
            "of it rotated"
        )
    return next(iter(stated.values()), None)


def _llama_config(meta: Metadata, arch: str) -> dict[str, Any]:
    _refuse_experts(meta, arch)
    if "rope_freqs.weight" in meta.tensor_names:
        raise PretrainedError(
            f"{meta.path}: tensor rope_freqs.weight (llama 3's RoPE frequency factors) is not "
            "supported: the metadata does not say which llama3 scaling made it"
        )
    d, h = meta.int(f"{arch}.embedding_length"), meta.int(f"{arch}.attention.head_count")
    config = {
        "model_type": "llama" if arch == "llama" else "qwen2",
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "hidden_size": d,
        "intermediate_size": meta.int(f"{arch}.feed_forward_length"),
        "num_hidden_layers": meta.int(f"{arch}.block_count"),
        "num_attention_heads": h,
        "num_key_value_heads": meta.int(f"{arch}.attention.head_count_kv", h),
        "max_position_embeddings": meta.int(f"{arch}.context_length"),
        "rms_norm_eps": meta.float(f"{arch}.attention.layer_norm_rms_epsilon"),
        "hidden_act": "silu",
        "rope_parameters": _rope(meta, arch, theta_default=10000.0),
    }
    head_dim = _head_dim(meta, arch)
    if head_dim is not None:  # transformers reads rope.dimension_count as head_dim
        config["head_dim"] = head_dim
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in meta.tensor_names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in meta.tensor_names
    return config | _common(meta, arch)


def gemma3_layer_types(meta: Metadata) -> tuple[list[str], int | None]:
    """Gemma 3's per-layer attention: llama.cpp and transformers both make every 6th layer
    global (``full_attention``) and the others local (``sliding_attention``, window
    ``gemma3.attention.sliding_window``); without a window every layer is global. A
    ``sliding_window_pattern`` key, when present, overrides: an int period, or one bool per
    layer (True = local)."""
    layers = meta.int("gemma3.block_count")
    window = meta.get("gemma3.attention.sliding_window")
    if window is None:
        return ["full_attention"] * layers, None
    window = meta.int("gemma3.attention.sliding_window")
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, bool) for p in pattern):
            raise PretrainedError(
                f"{meta.path}: metadata gemma3.attention.sliding_window_pattern must hold one "
                f"bool per layer ({layers}); got {pattern!r}"
            )
        local = pattern
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        local = [bool((i + 1) % pattern) for i in range(layers)]
    else:
        raise PretrainedError(
            f"{meta.path}: metadata gemma3.attention.sliding_window_pattern={pattern!r} must "
            "be a positive int or one bool per layer"
        )
    return ["sliding_attention" if s else "full_attention" for s in local], window


def _gemma3_config(meta: Metadata, arch: str) -> dict[str, Any]:
    d, h = meta.int("gemma3.embedding_length"), meta.int("gemma3.attention.head_count")
    head_dim = meta.int("gemma3.attention.key_length", 256)
    value_dim = meta.int("gemma3.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise PretrainedError(
            f"{meta.path}: metadata gemma3.attention.value_length={value_dim} differs from "
            f"key_length={head_dim}; Gemma 3 has one head_dim"
        )
    layer_types, window = gemma3_layer_types(meta)
    full = _rope(meta, "gemma3", theta_default=1_000_000.0)
    layers = meta.int("gemma3.block_count")
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": d,
        "intermediate_size": meta.int("gemma3.feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": h,
        "num_key_value_heads": meta.int("gemma3.attention.head_count_kv", h),
        "head_dim": head_dim,
        "max_position_embeddings": meta.int("gemma3.context_length"),
        "rms_norm_eps": meta.float("gemma3.attention.layer_norm_rms_epsilon"),
        "hidden_activation": "gelu_pytorch_tanh",
        # the file does not state it: transformers' GGUF loader keeps Gemma3TextConfig's
        # 256 (every released size's value but the 27B model's, which is 168; llama.cpp
        # uses head_dim, or hidden / heads for the 27B model)
        "query_pre_attn_scalar": 256,
        "sliding_window": window,
        "layer_types": layer_types,
        # local layers: base 10000, no scaling (llama.cpp's and transformers' fixed value);
        # global layers: the file's base and scaling
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
        "attn_logit_softcapping": meta.get("gemma3.attn_logit_softcapping"),
        "attention_bias": False,
        "use_bidirectional_attention": False,
    } | _common(meta, arch)


def _gpt2_config(meta: Metadata, arch: str) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": meta.int("gpt2.embedding_length"),
        "n_layer": meta.int("gpt2.block_count"),
        "n_head": meta.int("gpt2.attention.head_count"),
        "n_inner": meta.int("gpt2.feed_forward_length"),
        "n_positions": meta.int("gpt2.context_length"),
        "layer_norm_epsilon": meta.float("gpt2.attention.layer_norm_epsilon"),
        "activation_function": "gelu_new",
    } | _common(meta, arch)


def _heads_kv_equal(meta: Metadata, arch: str) -> int:
    h = meta.int(f"{arch}.attention.head_count")
    kv = meta.int(f"{arch}.attention.head_count_kv", h)
    if kv != h:
        raise PretrainedError(
            f"{meta.path}: metadata {arch}.attention.head_count_kv={kv} differs from "
            f"head_count={h}; grouped-query {arch} models are not supported"
        )
    return h


def _bloom_config(meta: Metadata, arch: str) -> dict[str, Any]:
    # ALiBi has no length limit: the converter's context_length (seq_length, or d_model
    # when the config has none) and its fixed 4 x d feed-forward width change nothing
    meta.get("bloom.context_length")
    d = meta.int("bloom.embedding_length")
    if meta.int("bloom.feed_forward_length", 4 * d) != 4 * d:
        raise PretrainedError(f"{meta.path}: bloom.feed_forward_length must be 4 x d_model")
    return (
        {
            "model_type": "bloom",
            "architectures": ["BloomForCausalLM"],
            "hidden_size": d,
            "n_layer": meta.int("bloom.block_count"),
            "n_head": _heads_kv_equal(meta, arch),
            "layer_norm_epsilon": meta.float("bloom.attention.layer_norm_epsilon"),
        }
        | _common(meta, arch)
        | {"tie_word_embeddings": True}
    )  # transformers always ties BLOOM


def _gptneox_config(meta: Metadata, arch: str) -> dict[str, Any]:
    d, h = meta.int("gptneox.embedding_length"), _heads_kv_equal(meta, arch)
    head_dim = d // h
    rot = meta.int("gptneox.rope.dimension_count", head_dim)
    rope = _rope(meta, arch, theta_default=10000.0)
    return {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_size": d,
        "num_hidden_layers": meta.int("gptneox.block_count"),
        "num_attention_heads": h,
        "intermediate_size": meta.int("gptneox.feed_forward_length"),
        "max_position_embeddings": meta.int("gptneox.context_length"),
        "layer_norm_eps": meta.float("gptneox.attention.layer_norm_epsilon"),
        "use_parallel_residual": bool(meta.get("gptneox.use_parallel_residual", True)),
        "hidden_act": "gelu",
        "rope_parameters": rope | {"partial_rotary_factor": rot / head_dim},
    } | _common(meta, arch)


def _mpt_config(meta: Metadata, arch: str) -> dict[str, Any]:
    d = meta.int("mpt.embedding_length")
    max_bias = meta.float("mpt.attention.max_alibi_bias", 0.0)
    return {
        "model_type": "mpt",
        "architectures": ["MptForCausalLM"],
        "d_model": d,
        "n_layers": meta.int("mpt.block_count"),
        "n_heads": _heads_kv_equal(meta, arch),
        "max_seq_len": meta.int("mpt.context_length"),
        "expansion_ratio": meta.int("mpt.feed_forward_length") / d,
        "layer_norm_epsilon": meta.float("mpt.attention.layer_norm_epsilon", 1e-5),
        "no_bias": "blk.0.attn_qkv.bias" not in meta.tensor_names,
        "attn_config": {
            "alibi": max_bias > 0,
            "alibi_bias_max": max_bias,
            "clip_qkv": meta.get("mpt.attention.clamp_kqv"),
        },
    } | _common(meta, arch)


# ------------------------------------------------------------------------------ tensors

# GGUF tensor name (without .weight / .bias; {i} = block) -> the Hugging Face checkpoint's
# stored name. tests/pretrained/test_pretrained_gguf.py checks every entry against gguf's own
# map (``gguf.get_tensor_name_map``), which is what llama.cpp's converter names tensors with.
_LLAMA_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
_GEMMA3_NAMES = _LLAMA_NAMES | {
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
}
_GPT2_NAMES = {
    "token_embd": "transformer.wte",
    "position_embd": "transformer.wpe",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
    "blk.{i}.attn_norm": "transformer.h.{i}.ln_1",
    "blk.{i}.attn_qkv": "transformer.h.{i}.attn.c_attn",
    "blk.{i}.attn_output": "transformer.h.{i}.attn.c_proj",
    "blk.{i}.ffn_norm": "transformer.h.{i}.ln_2",
    "blk.{i}.ffn_up": "transformer.h.{i}.mlp.c_fc",
    "blk.{i}.ffn_down": "transformer.h.{i}.mlp.c_proj",
}
_BLOOM_NAMES = {
    "token_embd": "transformer.word_embeddings",
    "token_embd_norm": "transformer.word_embeddings_layernorm",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
    "blk.{i}.attn_norm": "transformer.h.{i}.input_layernorm",
    "blk.{i}.attn_qkv": "transformer.h.{i}.self_attention.query_key_value",
    "blk.{i}.attn_output": "transformer.h.{i}.self_attention.dense",
    "blk.{i}.ffn_norm": "transformer.h.{i}.post_attention_layernorm",
    "blk.{i}.ffn_up": "transformer.h.{i}.mlp.dense_h_to_4h",
    "blk.{i}.ffn_down": "transformer.h.{i}.mlp.dense_4h_to_h",
}
_GPTNEOX_NAMES = {
    "token_embd": "gpt_neox.embed_in",
    "output_norm": "gpt_neox.final_layer_norm",
    "output": "embed_out",
    "blk.{i}.attn_norm": "gpt_neox.layers.{i}.input_layernorm",
    "blk.{i}.attn_qkv": "gpt_neox.layers.{i}.attention.query_key_value",
    "blk.{i}.attn_output": "gpt_neox.layers.{i}.attention.dense",
    "blk.{i}.ffn_norm": "gpt_neox.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_up": "gpt_neox.layers.{i}.mlp.dense_h_to_4h",
    "blk.{i}.ffn_down": "gpt_neox.layers.{i}.mlp.dense_4h_to_h",
}
_MPT_NAMES = {
    "token_embd": "transformer.wte",
    "output_norm": "transformer.norm_f",
    "output": "lm_head",
    "blk.{i}.attn_norm": "transformer.blocks.{i}.norm_1",
    "blk.{i}.attn_qkv": "transformer.blocks.{i}.attn.Wqkv",
    "blk.{i}.attn_output": "transformer.blocks.{i}.attn.out_proj",
    "blk.{i}.ffn_norm": "transformer.blocks.{i}.norm_2",
    "blk.{i}.ffn_up": "transformer.blocks.{i}.ffn.up_proj",
    "blk.{i}.ffn_down": "transformer.blocks.{i}.ffn.down_proj",
}

# A transform undoes llama.cpp's converter on one dequantized tensor:
# ``transform(array in llama.cpp's layout, hf_config) -> array in the HF checkpoint's layout``.
Transform = Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]


def unpermute_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``LlamaModel.permute`` of q/k rows (weights ``[heads * hd, d]`` or
    biases ``[heads * hd]``): within each head, llama.cpp stores the rotate-half pairs
    ``(j, j + hd/2)`` of Hugging Face's layout as adjacent rows ``(2j, 2j + 1)``; row
    ``2j + t`` of a head goes back to ``j + t * hd / 2``."""
    half = x.shape[0] // heads // 2
    return x.reshape(heads, half, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _by_heads(fn: Callable[[np.ndarray, int], np.ndarray], field: str) -> Transform:
    """The transform ``fn(x, hf_config[field])`` (``field``: the config's head count)."""
    return lambda x, config: fn(x, config[field])


_unpermute_q = _by_heads(unpermute_rows, "num_attention_heads")
_unpermute_k = _by_heads(unpermute_rows, "num_key_value_heads")


def _transpose(x, config):
    return np.ascontiguousarray(x.T)


def _minus_one(x, config):
    return x - np.float32(1.0)


def qkv_per_head(x: np.ndarray, heads: int) -> np.ndarray:
    """A fused projection stored as ``[q | k | v]`` (rows, each ``heads * hd``) back to
    Hugging Face's per-head ``[heads, 3, hd]`` order (GPT-NeoX, BLOOM ``query_key_value``):
    the inverse of llama.cpp's reordering."""
    hd = x.shape[0] // 3 // heads
    return x.reshape(3, heads, hd, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)


_qkv_neox = _by_heads(qkv_per_head, "num_attention_heads")
_qkv_bloom = _by_heads(qkv_per_head, "n_head")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """How one GGUF architecture (``general.architecture``) maps onto Hugging Face's."""

    name: str  # the GGUF architecture
    config: Callable[[Metadata, str], dict[str, Any]]
    names: Mapping[str, str]  # GGUF name -> HF stored name (without .weight / .bias)
    # (GGUF name pattern, transform): the first pattern that fully matches a GGUF tensor's
    # name (with its suffix) transforms it
    transforms: tuple[tuple[str, Transform], ...] = ()
    transposed: tuple[str, ...] = ()  # name patterns stored transposed (their shape too)


ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            "llama",
            _llama_config,
            _LLAMA_NAMES,
            (
                (r"blk\.\d+\.attn_q\.(weight|bias)", _unpermute_q),
                (r"blk\.\d+\.attn_k\.(weight|bias)", _unpermute_k),
            ),
        ),
        Architecture("qwen2", _llama_config, _LLAMA_NAMES),
        Architecture("gemma3", _gemma3_config, _GEMMA3_NAMES, ((r".*norm\.weight", _minus_one),)),
        Architecture(
            "gpt2",
            _gpt2_config,
            _GPT2_NAMES,
            ((r"blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight", _transpose),),
            transposed=(r"blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight",),
        ),
        Architecture(
            "bloom",
            _bloom_config,
            _BLOOM_NAMES,
            ((r"blk\.\d+\.attn_qkv\.(weight|bias)", _qkv_bloom),),
        ),
        Architecture(
            "gptneox",
            _gptneox_config,
            _GPTNEOX_NAMES,
            ((r"blk\.\d+\.attn_qkv\.(weight|bias)", _qkv_neox),),
        ),
        Architecture("mpt", _mpt_config, _MPT_NAMES),
    )
}
# metadata keys of the architecture that change nothing the library computes
_IGNORED_KEYS = ("vocab_size", "rope.scaling.finetuned", "tensor_data_layout")


def architecture_of(meta: Metadata) -> Architecture:
    arch = meta.str("general.architecture")
    if arch not in ARCHITECTURES:
        raise PretrainedError(
            f"{meta.path}: general.architecture={arch!r} is not supported; supported: "
            f"{sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[arch]


def hf_config(meta: Metadata) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a GGUF file (see the module docstring);
    refuses ``<arch>.*`` metadata keys that nothing maps."""
    arch = architecture_of(meta)
    config = arch.config(meta, arch.name)
    unread = [
        k
        for k in meta.fields
        if k.startswith(f"{arch.name}.")
        and k not in meta.read
        and k[len(arch.name) + 1 :] not in _IGNORED_KEYS
    ]
    if unread:
        raise PretrainedError(
            f"{meta.path}: metadata {unread[0]}={meta.get(unread[0])!r} is not supported "
            f"(nothing maps it onto a {arch.name} model)"
        )
    return config


def _hf_name(arch: Architecture, gguf_name: str) -> str | None:
    """The HF stored name of a GGUF tensor name, or None when the table has none."""
    stem, dot, suffix = gguf_name.rpartition(".")
    if not dot or suffix not in ("weight", "bias"):
        return None
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", stem)
    key, block = (f"blk.{{i}}.{match.group(2)}", match.group(1)) if match else (stem, None)
    target = arch.names.get(key)
    if target is None:
        return None
    return f"{target.format(i=block)}.{suffix}"


class GGUFCheckpoint(TensorIndex):
    """The tensors of a GGUF file under their Hugging Face names, with the interface of
    `files.CheckpointFiles` (``names``, ``has``, ``shape``, ``get``, ``unused``, ``files``):
    the families' weight mappings read it unchanged.

    ``get`` dequantizes one tensor to float32 and undoes llama.cpp's changes to it (see the
    module docstring); shapes come from the header, so the loader checks them before any
    tensor is dequantized. A GGUF tensor that the architecture's table does not name keeps
    its GGUF name, so the loader's "map to no parameter" refusal names it.
    """

    missing = "the GGUF file has no tensor for"

    def __init__(
        self,
        path: Path,
        reader: Any,
        arch: Architecture,
        config: Mapping[str, Any],
        *,
        strip: tuple[str, ...] = (),
    ):
        gguf = _gguf()
        self.path = self.source = path
        self.folder = path.parent
        self.files = [path]
        self.config = config
        self.where: dict[str, Any] = {}
        self.transform: dict[str, Transform] = {}
        self.transposed: set[str] = set()
        self.types: dict[str, str] = {}
        for tensor in reader.tensors:
            name = _hf_name(arch, tensor.name)
            name = tensor.name if name is None else strip_prefix(name, strip)
            if name in self.where:
                raise PretrainedError(f"{path}: tensor {name!r} is stored twice")
            self.where[name] = tensor
            self.types[name] = tensor.tensor_type.name
            for pattern, fn in arch.transforms:
                if re.fullmatch(pattern, tensor.name):
                    self.transform[name] = fn
                    break
            if any(re.fullmatch(p, tensor.name) for p in arch.transposed):
                self.transposed.add(name)
        for qtype in sorted({t.tensor_type for t in reader.tensors}, key=int):
            _, type_size = gguf.GGML_QUANT_SIZES[qtype]
            try:  # one block of zeros: refuses a type the package cannot dequantize
                gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
            except Exception:
                example = next(n for n, t in self.where.items() if t.tensor_type == qtype)
                raise PretrainedError(
                    f"{path}: tensor {self.where[example].name!r} is stored as {qtype.name}, "
                    "which gguf.quants.dequantize does not support"
                ) from None
        self.used: set[str] = set()

    @property
    def dequantized_bytes(self) -> int:
        """Bytes of the largest tensor dequantized to float32: the loader dequantizes one
        tensor at a time (the parameters' own memory is checked from the shapes)."""
        return max((int(t.n_elements) for t in self.where.values()), default=0) * 4

    def quantization(self) -> str:
        """The stored types, most values first (``"Q4_1 + F32 + Q8_0"``)."""
        counts: dict[str, int] = {}
        for name, tensor in self.where.items():
            counts[self.types[name]] = counts.get(self.types[name], 0) + int(tensor.n_elements)
        return " + ".join(sorted(counts, key=lambda k: -counts[k]))

    def location(self, name: str) -> tuple[Path, str]:
        return self.path, self.where[self._check(name)].name  # its GGUF name

    def shape(self, name: str) -> tuple[int, ...]:
        dims = tuple(reversed([int(d) for d in self.where[self._check(name)].shape]))
        return dims[::-1] if name in self.transposed else dims

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` dequantized to float32 in the Hugging Face layout."""
        gguf = _gguf()
        tensor = self.where[self._check(name)]
        self.used.add(name)
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        array = np.asarray(array, np.float32).reshape(
            tuple(reversed([int(d) for d in tensor.shape]))
        )
        if name in self.transform:
            array = self.transform[name](array, self.config)
        return array


@dataclasses.dataclass
class GGUFFile:
    """A GGUF file opened for loading: its reader, metadata, architecture and HF config."""

    path: Path
    reader: Any
    meta: Metadata
    arch: Architecture
    hf_config: dict[str, Any]

    def checkpoint(self, *, strip: tuple[str, ...] = ()) -> GGUFCheckpoint:
        """The tensors (``strip``: the family's base prefixes, as `CheckpointFiles` strips)."""
        files = GGUFCheckpoint(self.path, self.reader, self.arch, self.hf_config, strip=strip)
        free, where = host_available()
        if free is not None and files.dequantized_bytes > free:
            raise PretrainedError(
                f"{self.path}: its largest tensor dequantized to float32 needs "
                f"{format_bytes(files.dequantized_bytes)} but {format_bytes(free)} is free "
                f"({where})"
            )
        return files


def open_gguf(path: Path) -> GGUFFile:
    """Read a GGUF file's header and metadata and map them to a Hugging Face config."""
    reader = read_gguf(path)
    meta = Metadata(reader, Path(path))
    arch = architecture_of(meta)
    return GGUFFile(Path(path), reader, meta, arch, hf_config(meta))
