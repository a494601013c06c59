"""RoPE options from a Hugging Face transformers config (``config.json`` as a dict).

`rope_options_from_hf` reads what transformers' ``ROPE_INIT_FUNCTIONS``
(``transformers/modeling_rope_utils.py``) read, in both config formats:

* transformers 5: ``rope_parameters = {"rope_type": ..., "rope_theta": ..., ...}``;
* older files: ``rope_scaling = {"type" or "rope_type": ..., ...}`` (or null) with
  ``rope_theta`` beside it; GPT-NeoX's ``rotary_emb_base`` / ``rotary_pct``.

and refuses, in one line, what RopeOptions cannot reproduce exactly. The mapping
(tests/core/rope_goldens.json pins the result against transformers):

=============  ==============  ==========================================================
HF rope_type   RopeOptions     fields read
=============  ==============  ==========================================================
default        "none"          rope_theta, partial_rotary_factor
linear         "pi"            factor
dynamic        "dynamic_ntk"   factor; original_length = max_position_embeddings
yarn           "yarn" ("hf")   factor (None: max_position_embeddings / original),
                               original_max_position_embeddings, beta_fast, beta_slow,
                               mscale, mscale_all_dim, attention_factor, truncate
llama3         "llama3"        factor, original_max_position_embeddings,
                               low_freq_factor, high_freq_factor
longrope       "longrope"      short_factor, long_factor, original_max_position_embeddings,
                               factor (None: max_position_embeddings / original),
                               attention_factor  ("su", and Phi-3's "yarn", are longrope)
=============  ==============  ==========================================================

``original_max_position_embeddings`` is taken, as transformers' ``standardize_rope_params``
does, from the top level of the config first (Phi-3 keeps it there; its config class
defaults it to 4096), then from the RoPE dict, then ``max_position_embeddings``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from flaxformer_lite.base.checks import is_int, is_number
from flaxformer_lite.core import rotary
from flaxformer_lite.nn.encodings.base import ModelDims
from flaxformer_lite.nn.encodings.rotary import RopeOptions

HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")

# The keys each rope_type's function reads (HF's _validate_<type>_rope_parameters sets);
# HF ignores any other key with a warning, and so does rope_options_from_hf.
_COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "longrope": {
        "short_factor",
        "long_factor",
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
    },
}
# Keys whose meaning lives in the model code, not in the frequencies: refused.
_REFUSED_KEYS = {
    "mrope_section": "multimodal RoPE (Qwen2-VL) splits the pairs into sections",
    "mrope_interleaved": "multimodal RoPE (Qwen2-VL) splits the pairs into sections",
}


def rope_options_from_hf(
    config: Mapping[str, Any], *, head_dim: int, layout: str = "half"
) -> RopeOptions:
    """The `RopeOptions` that reproduce a Hugging Face config's RoPE exactly.

    Args:
      config: the config as a dict (``config.json``, or ``PretrainedConfig.to_dict()``).
      head_dim: the per-head width (HF ``head_dim``, else ``hidden_size //
        num_attention_heads``).
      layout: ``"half"`` (HF's ``rotate_half``; almost every HF model) or ``"interleaved"``
        (GPT-J, CodeGen); the config does not say.

    Returns:
      RopeOptions (validated against ``head_dim``).

    Raises:
      ValueError (one line): a ``rope_type`` the library lacks (``proportional``,
        ``mrope``, ...), per-layer-type RoPE dicts (Gemma 3), multimodal sections, a
        missing required field, a ``factor`` below 1, ``beta_slow >= beta_fast``, or
        ``int(head_dim * partial_rotary_factor)`` odd or 0.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping (config.json as a dict); got {config!r}")
    if not is_int(head_dim) or head_dim < 2:
        raise ValueError(f"head_dim={head_dim!r}: must be an int >= 2")
    params = _rope_dict(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    model_type = config.get("model_type")
    if rope_type == "su" or (model_type == "phi3" and rope_type == "yarn"):
        rope_type = "longrope"  # transformers' Phi3Config renames both
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(
            f"rope_type={rope_type!r}: this RoPE scaling is not implemented in flaxformer_lite; "
            f"supported: {list(HF_ROPE_TYPES)}"
        )
    for key, why in _REFUSED_KEYS.items():
        if params.get(key) is not None:
            raise ValueError(f"rope_parameters.{key}={params[key]!r}: not supported ({why})")
    ignored = sorted(set(params) - _COMMON_KEYS - _KEYS[rope_type])
    if ignored:
        warnings.warn(
            f"rope_type={rope_type!r} ignores rope_parameters keys {ignored} (so does HF)",
            stacklevel=2,
        )

    base = params.get("rope_theta")
    if not is_number(base) or not 1 < base < math.inf:
        raise ValueError(f"rope_theta={base!r}: must be a finite number > 1")
    fraction = _fraction(config, params, head_dim)
    opts: dict[str, Any] = dict(base=float(base), layout=layout, fraction=fraction)
    max_pos = config.get("max_position_embeddings")

    if rope_type == "linear":
        opts.update(scaling="pi", scale=_factor(params, rope_type))
    elif rope_type == "dynamic":
        if not is_int(max_pos) or max_pos <= 0:
            raise ValueError(
                f"max_position_embeddings={max_pos!r}: rope_type='dynamic' scales beyond it "
                "(a positive int is needed)"
            )
        opts.update(
            scaling="dynamic_ntk", scale=_factor(params, rope_type), original_length=max_pos
        )
    elif rope_type in ("yarn", "llama3", "longrope"):
        original = _original_length(config, params, rope_type)
        opts.update(scaling=rope_type, original_length=original)
        if rope_type == "yarn":
            opts.update(_yarn(params, original, max_pos))
        elif rope_type == "llama3":
            opts.update(_llama3(params))
        else:
            opts.update(_longrope(params, original, max_pos))

    options = RopeOptions(**opts)
    dims = ModelDims(d_model=head_dim, num_heads=1, head_dim=head_dim)
    options.check(dims, "RopeOptions")
    return options


def _rope_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flat RoPE dict with ``rope_theta`` and ``partial_rotary_factor`` filled in as
    transformers' ``convert_rope_params_to_dict`` does (``rope_scaling`` wins)."""
    raw = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"rope_parameters={raw!r}: must be a mapping")
    nested = sorted(k for k, v in raw.items() if isinstance(v, Mapping))
    if nested:
        raise ValueError(
            f"rope_parameters has per-layer-type entries {nested}: different RoPE per layer "
            "type is not supported"
        )
    params = dict(raw)
    neox = config.get("model_type") == "gpt_neox"
    if "rope_theta" in config:
        theta = config["rope_theta"]
    elif neox or "rotary_emb_base" in config:
        theta = config.get("rotary_emb_base", 10000.0)
    else:
        theta = 10000.0
    params.setdefault("rope_theta", theta)
    if params["rope_theta"] is None:
        params["rope_theta"] = theta
    if config.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    elif "rotary_pct" in config or neox:
        params.setdefault("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return params


def _fraction(config: Mapping[str, Any], params: Mapping[str, Any], head_dim: int) -> float:
    """`RopeOptions.fraction` that rotates HF's ``int(head_dim * partial_rotary_factor)``
    dimensions (GPT-J / CodeGen: their ``rotary_dim``)."""
    if config.get("rotary_dim") is not None and "partial_rotary_factor" not in params:
        dim = config["rotary_dim"]
        if not is_int(dim) or not 0 < dim <= head_dim:
            raise ValueError(f"rotary_dim={dim!r}: must be an int in [1, head_dim={head_dim}]")
        source, f = f"rotary_dim={dim}", 1.0
    else:
        f = params.get("partial_rotary_factor", 1.0)
        f = 1.0 if f is None else f
        if not is_number(f) or not 0 < f <= 1:
            raise ValueError(f"partial_rotary_factor={f!r}: must be a number in (0, 1]")
        dim = int(head_dim * f)
        source = f"int(head_dim={head_dim} * partial_rotary_factor={f}) = {dim}"
    if dim == 0:
        raise ValueError(f"{source}: no dimension would rotate")
    if dim % 2:
        raise ValueError(
            f"{source} is odd: transformers then rotates {dim + 1} dimensions with the "
            f"frequencies of {dim} (base^(-2i/{dim})), which flaxformer_lite does not reproduce"
        )
    fraction = float(f)
    if rotary.rotary_dim_for(head_dim, fraction) != dim:
        fraction = dim / head_dim
    if rotary.rotary_dim_for(head_dim, fraction) != dim:  # pragma: no cover - float safety
        raise ValueError(f"{source}: no fraction of head_dim={head_dim} rotates {dim} dims")
    return fraction


def _factor(params: Mapping[str, Any], rope_type: str, default: Any = None) -> float:
    factor = params.get("factor", default)
    if factor is None:
        raise ValueError(f"rope_type={rope_type!r} needs rope_parameters.factor; got None")
    if not is_number(factor) or not 1 <= factor < math.inf:
        raise ValueError(
            f"rope_parameters.factor={factor!r}: flaxformer_lite needs a finite number >= 1 "
            f"for rope_type={rope_type!r}"
        )
    return float(factor)


def _original_length(config: Mapping[str, Any], params: Mapping[str, Any], rope_type: str) -> int:
    if config.get("original_max_position_embeddings") is not None:
        original = config["original_max_position_embeddings"]  # HF: the top level wins
    elif config.get("model_type") == "phi3":
        original = 4096  # Phi3Config's default, which likewise wins
    elif params.get("original_max_position_embeddings") is not None:
        original = params["original_max_position_embeddings"]
    else:
        original = config.get("max_position_embeddings")
    if not is_int(original) or original <= 0:
        raise ValueError(
            f"original_max_position_embeddings={original!r}: rope_type={rope_type!r} needs "
            "a positive int (or max_position_embeddings)"
        )
    return int(original)


def _implied_factor(params: Mapping[str, Any], original: int, max_pos: Any, rope_type: str) -> Any:
    """HF's ``factor``, or ``max_position_embeddings / original`` when it is None."""
    if params.get("factor") is not None:
        return params["factor"]
    if not is_number(max_pos):
        raise ValueError(
            f"rope_type={rope_type!r} without factor needs max_position_embeddings; got {max_pos!r}"
        )
    return max_pos / original


def _yarn(params: Mapping[str, Any], original: int, max_pos: Any) -> dict[str, Any]:
    if "factor" not in params:
        raise ValueError("rope_type='yarn' needs rope_parameters.factor")
    factor = _implied_factor(params, original, max_pos, "yarn")
    scale = _factor({"factor": factor}, "yarn")
    beta_fast = _number(params, "beta_fast") or 32.0  # HF: `or`, so 0 and None: the default
    beta_slow = _number(params, "beta_slow") or 1.0
    if not 0 <= beta_slow < beta_fast:
        slow, fast = params.get("beta_slow") or 1, params.get("beta_fast") or 32  # as given
        raise ValueError(
            f"rope_parameters.beta_slow={slow!r}, beta_fast={fast!r}: flaxformer_lite needs "
            "numbers with 0 <= beta_slow < beta_fast"
        )
    mscale, mscale_all_dim = _number(params, "mscale"), _number(params, "mscale_all_dim")
    if not (mscale and mscale_all_dim):  # HF uses them only when both are set and non-zero
        mscale = mscale_all_dim = None
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"rope_parameters.truncate={truncate!r}: must be true or false")
    return dict(
        scale=scale,
        yarn_alpha=beta_slow,
        yarn_beta=beta_fast,
        yarn_variant="hf",
        yarn_truncate=truncate,
        yarn_mscale=mscale,
        yarn_mscale_all_dim=mscale_all_dim,
        attention_factor=_number(params, "attention_factor"),
    )


def _llama3(params: Mapping[str, Any]) -> dict[str, Any]:
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if params.get(key) is None:
            raise ValueError(f"rope_type='llama3' needs rope_parameters.{key}; got None")
    return dict(
        scale=_factor(params, "llama3"),
        llama3_low_freq_factor=_number(params, "low_freq_factor"),
        llama3_high_freq_factor=_number(params, "high_freq_factor"),
    )


def _longrope(params: Mapping[str, Any], original: int, max_pos: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if not isinstance(value, list | tuple) or not all(
            is_number(v) and math.isfinite(v) for v in value
        ):
            raise ValueError(f"rope_parameters.{key}={value!r}: must be a list of finite numbers")
        out[f"longrope_{key}"] = tuple(float(v) for v in value)
    factor = _implied_factor(params, original, max_pos, "longrope")
    if not is_number(factor) or not 0 < factor < math.inf:
        raise ValueError(f"rope_parameters.factor={factor!r}: must be a finite number > 0")
    out["scale"] = max(1.0, float(factor))  # HF: attention factor 1 for factor <= 1
    out["attention_factor"] = _number(params, "attention_factor")
    return out


def _number(params: Mapping[str, Any], key: str) -> float | None:
    """``rope_parameters[key]`` as a float, None when absent or null; a value of another JSON
    type (a list, a string) or a non-finite one is refused in one line naming the key."""
    value = params.get(key)
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"rope_parameters.{key}={value!r}: must be a finite number")
    return float(value)
