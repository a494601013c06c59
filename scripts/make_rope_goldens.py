"""Golden RoPE frequencies and attention factors from Hugging Face transformers.

For a grid of configs covering every RoPE scaling transformers ships (``default``,
``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``) and their parameters (head
dims, partial rotary, factors, bases, YaRN's betas / mscale / attention_factor / truncate,
Llama 3's frequency factors, LongRoPE's factor lists), this computes with transformers' own
code -- the model rotary-embedding classes, which call ``ROPE_INIT_FUNCTIONS`` and, for
``dynamic`` and ``longrope``, the ``dynamic_rope_update`` rule -- the inverse frequencies
and the attention factor, at several sequence lengths below and above the original length
(a fresh rotary module per length, fed positions ``0 .. n-1``). Each config is written in
both formats (transformers 5 ``rope_parameters``; older ``rope_scaling`` + ``rope_theta``)
and both must give the same numbers.

Regenerate (needs torch and transformers >= 5; the library's test venv has neither)::

    /work/golden-venv/bin/python scripts/make_rope_goldens.py

which writes tests/core/rope_goldens.json. tests/core/test_core_rope_hf.py checks the
library against the file, and against transformers live when it is importable.
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys
from typing import Any

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "core" / "rope_goldens.json"
DYNAMIC_OFFSETS = (-1, 0, 1)  # n = L + offset (L - 1, L: below/at; L + 1: just above)
DYNAMIC_MULTIPLES = (1.5, 3.0, 10.0)  # n = round(L * m)


def _factors(pairs: int, seed: int, top: float) -> list[float]:
    """LongRoPE-like factor lists: increasing from ~1 to ``top``, 4 decimals."""
    rng = np.random.default_rng(seed)
    ramp = np.sort(rng.uniform(0.0, 1.0, pairs)) ** 2
    return [round(float(v), 4) for v in 1.0 + (top - 1.0) * ramp]


def _case(
    name: str,
    head_dim: int,
    max_pos: int,
    rope: dict[str, Any],
    model_type: str = "llama",
    top: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A config in both formats. ``rope`` holds ``rope_type``, ``rope_theta`` and the rest."""
    common = {
        "model_type": model_type,
        "hidden_size": 2 * head_dim,
        "num_attention_heads": 2,
        "head_dim": head_dim,
        "max_position_embeddings": max_pos,
        **(top or {}),
    }
    new = {**common, "rope_parameters": copy.deepcopy(rope)}
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type")}
    legacy = {**common, "rope_theta": rope["rope_theta"]}
    if "partial_rotary_factor" in scaling:
        legacy["partial_rotary_factor"] = scaling.pop("partial_rotary_factor")
    if rope["rope_type"] != "default":
        legacy["rope_scaling"] = {"type": rope["rope_type"], **scaling}
    else:
        legacy["rope_scaling"] = None
    return {"name": name, "config": new, "legacy_config": legacy}


_Y = {"rope_type": "yarn", "rope_theta": 1e4}
_L3 = {"rope_type": "llama3", "rope_theta": 5e5, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
_LR = {"rope_type": "longrope", "rope_theta": 1e4}
_OMPE = "original_max_position_embeddings"
# The grid (every rope_type and parameter; names say what each one exercises):
# (name, head_dim, max_position_embeddings, rope dict[, model_type, top-level fields])
CASES: list[tuple[Any, ...]] = [
    # default
    ("default_hd64", 64, 2048, {"rope_type": "default", "rope_theta": 1e4}),
    ("default_hd128_base5e5", 128, 8192, {"rope_type": "default", "rope_theta": 5e5}),
    ("default_hd80_partial0.4", 80, 2048,
     {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.4}),
    ("default_hd96_partial0.75_base1e6", 96, 4096,
     {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.75}),
    # linear (library "pi")
    ("linear_hd64_f2", 64, 4096, {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
    ("linear_hd128_f4_base5e5", 128, 16384,
     {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}),
    ("linear_hd64_f8_partial0.5", 64, 2048,
     {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0, "partial_rotary_factor": 0.5}),
    ("linear_hd32_f1.5", 32, 512, {"rope_type": "linear", "rope_theta": 1e4, "factor": 1.5}),
    # dynamic (library "dynamic_ntk"; original length = max_position_embeddings)
    ("dynamic_hd64_f2", 64, 2048, {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
    ("dynamic_hd128_f4_base1e6", 128, 4096,
     {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0}),
    ("dynamic_hd128_f1_partial0.25", 128, 1024,
     {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 1.0, "partial_rotary_factor": 0.25}),
    ("dynamic_hd16_f3", 16, 256, {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 3.0}),
    # yarn
    ("yarn_hd64_f4", 64, 8192, {**_Y, "factor": 4.0, _OMPE: 2048}),
    ("yarn_hd128_f4_base1e6_qwen", 128, 131072,
     {**_Y, "rope_theta": 1e6, "factor": 4.0, _OMPE: 32768}),
    ("yarn_hd64_betas16_2", 64, 32768,
     {**_Y, "factor": 8.0, _OMPE: 4096, "beta_fast": 16.0, "beta_slow": 2.0}),
    ("yarn_hd64_mscale_deepseek", 64, 163840,
     {**_Y, "factor": 40.0, _OMPE: 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
      "mscale_all_dim": 1.0}),
    ("yarn_hd64_mscale0.707_all1", 64, 65536,
     {**_Y, "factor": 16.0, _OMPE: 4096, "mscale": 0.707, "mscale_all_dim": 1.0}),
    ("yarn_hd64_mscale_only", 64, 65536, {**_Y, "factor": 16.0, _OMPE: 4096, "mscale": 0.707}),
    ("yarn_hd64_attention_factor1.25", 64, 8192,
     {**_Y, "factor": 4.0, _OMPE: 2048, "attention_factor": 1.25}),
    ("yarn_hd64_no_truncate_gptoss", 64, 131072,
     {**_Y, "rope_theta": 150000.0, "factor": 32.0, _OMPE: 4096, "beta_fast": 32.0,
      "beta_slow": 1.0, "truncate": False}),
    ("yarn_hd64_factor_none", 64, 16384, {**_Y, "factor": None, _OMPE: 2048}),
    ("yarn_hd128_partial0.5", 128, 8192,
     {**_Y, "factor": 2.0, _OMPE: 4096, "partial_rotary_factor": 0.5}),
    ("yarn_hd64_f1", 64, 2048, {**_Y, "factor": 1.0, _OMPE: 2048}),
    ("yarn_hd32_f2_small", 32, 1024, {**_Y, "factor": 2.0, _OMPE: 512}),
    # llama3
    ("llama3_hd128_llama3.1", 128, 131072, {**_L3, "factor": 8.0, _OMPE: 8192}),
    ("llama3_hd64_llama3.2", 64, 131072, {**_L3, "factor": 32.0, _OMPE: 8192}),
    ("llama3_hd64_low2_high8_base1e4", 64, 8192,
     {**_L3, "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
      _OMPE: 2048}),
    ("llama3_hd128_partial0.5", 128, 65536,
     {**_L3, "factor": 8.0, _OMPE: 8192, "partial_rotary_factor": 0.5}),
    # longrope (lengths straddle original_max_position_embeddings)
    ("longrope_hd96_phi3_mini_128k", 96, 131072,
     {**_LR, "short_factor": _factors(48, 0, 1.2), "long_factor": _factors(48, 1, 60.0),
      _OMPE: 4096}),
    ("longrope_hd128_partial0.75_phi4_mini", 128, 131072,
     {**_LR, "short_factor": _factors(48, 2, 3.0), "long_factor": _factors(48, 3, 40.0),
      _OMPE: 4096, "partial_rotary_factor": 0.75}),
    ("longrope_hd64_factor4", 64, 16384,
     {**_LR, "short_factor": [1.0] * 32, "long_factor": _factors(32, 4, 8.0), _OMPE: 2048,
      "factor": 4.0}),
    ("longrope_hd64_attention_factor1.1", 64, 65536,
     {**_LR, "rope_theta": 5e5, "short_factor": _factors(32, 5, 2.0),
      "long_factor": _factors(32, 6, 16.0), _OMPE: 8192, "attention_factor": 1.1}),
    ("longrope_hd96_phi3_toplevel_original_su", 96, 131072,
     {**_LR, "short_factor": _factors(48, 7, 1.1), "long_factor": _factors(48, 8, 30.0),
      _OMPE: 2048}, "phi3", {_OMPE: 4096}),
]  # fmt: skip


def cases() -> list[dict[str, Any]]:
    """`CASES` in both config formats."""
    c = [_case(*row) for row in CASES]
    su = c[-1]["legacy_config"]["rope_scaling"]
    su["type"] = "su"  # the old name of longrope (Phi3Config renames it); the top-level
    # original_max_position_embeddings (4096) wins over the dict's (2048), as in transformers
    return c


def _lengths(rope_type: str, original: int) -> list[int]:
    if rope_type not in ("dynamic", "longrope"):
        return [original]
    out = {1, 100, *(original + o for o in DYNAMIC_OFFSETS)}
    out |= {round(original * m) for m in DYNAMIC_MULTIPLES}
    return sorted(n for n in out if n >= 1)


def _original(config: dict[str, Any]) -> int:
    rope = config["rope_parameters"]
    if rope["rope_type"] == "dynamic":
        return config["max_position_embeddings"]
    return config.get("original_max_position_embeddings") or rope.get(
        "original_max_position_embeddings", config["max_position_embeddings"]
    )


def hf_results(config: dict[str, Any], lengths: list[int]) -> list[dict[str, Any]]:
    """transformers' inverse frequencies (float32) and attention factor at each length."""
    import torch
    import transformers
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    config = copy.deepcopy(config)
    model_type = config.pop("model_type")
    config_cls, rotary_cls = {
        "llama": (
            transformers.LlamaConfig,
            transformers.models.llama.modeling_llama.LlamaRotaryEmbedding,
        ),
        "phi3": (
            transformers.Phi3Config,
            transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding,
        ),
    }[model_type]
    hf_config = config_cls(**config)
    out = []
    for n in lengths:
        if hf_config.rope_parameters["rope_type"] == "default":
            # LlamaRotaryEmbedding's default ignores partial_rotary_factor; GPT-NeoX's (like
            # Phi's, Persimmon's, StableLM's) honours it: use that one for the default
            inv, factor = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(hf_config)
        else:
            emb = rotary_cls(hf_config)
            x = torch.zeros(1, 1, dtype=torch.float32)
            positions = torch.tensor([[0, n - 1]], dtype=torch.int64)
            emb(x, positions)  # runs the dynamic / longrope update rule
            inv, factor = emb.inv_freq, emb.attention_scaling
        inv_freq = inv.detach().cpu().numpy().astype(np.float32)
        out.append(
            {
                "length": n,
                "inv_freq": [float(str(v)) for v in inv_freq],
                "attention_factor": float(factor),
            }
        )
    return out


def main() -> None:
    import transformers

    goldens = []
    for case in cases():
        lengths = _lengths(
            case["config"]["rope_parameters"]["rope_type"], _original(case["config"])
        )
        new = hf_results(case["config"], lengths)
        old = hf_results(case["legacy_config"], lengths)
        if new != old:
            sys.exit(f"{case['name']}: the two config formats disagree in transformers")
        goldens.append({**case, "results": new})
    payload = {
        "source": f"transformers {transformers.__version__} (scripts/make_rope_goldens.py)",
        "cases": goldens,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB, {len(goldens)} configs)")


if __name__ == "__main__":
    main()
