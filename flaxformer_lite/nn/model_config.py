"""The model configuration: a frozen, hashable dataclass validated once on construction.

Defaults are the base Transformer of Vaswani et al. 2017 (Table 3, "base"): 6 encoder and
6 decoder layers, ``d_model`` 512, 8 heads, ``d_ff`` 2048, dropout 0.1, post-LN, ReLU,
sinusoidal positions. The vocabulary defaults to 256 bytes (this library is byte-level; the
paper used a shared 37k BPE vocabulary).

Every error names the field, the value and what is allowed, e.g.::

    ModelConfig.num_heads=3: d_model=512 must be divisible by num_heads
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

NORM_POSITIONS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of every model in `flaxformer_lite.nn.models`."""

    vocab_size: int = 256  # output classes / input tokens (256 = raw bytes)
    d_model: int = 512  # residual stream width
    num_heads: int = 8  # attention heads; head_dim = d_model // num_heads
    d_ff: int = 2048  # hidden width of the position-wise feed-forward block
    num_encoder_layers: int = 6  # blocks in the Encoder (EncoderDecoder, Encoder)
    num_decoder_layers: int = 6  # blocks in the Decoder (EncoderDecoder, DecoderOnlyLM)
    dropout_rate: float = 0.1  # residual and embedding dropout (0 disables)
    norm: str = "post"  # "post": LN(x + f(x)) as in the paper; "pre": x + f(LN(x))
    activation: str = "relu"  # feed-forward non-linearity: "relu" (paper) or "gelu"
    use_bias: bool = True  # biases in the attention and feed-forward projections
    tie_embeddings: bool = True  # output logits use the transposed token embedding
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper §3.4)
    positional: str = "sinusoidal"  # registry name, see encodings.positional_encoding_names()
    max_length: int = 2048  # rows of the learned table; positions must be < max_length
    rope_base: float = 10000.0  # RoPE frequency base; theta_i = base^(-2i/d)
    rope_layout: str = "half"  # RoPE pairing: "half" (i, i+d/2) or "interleaved" (2i, 2i+1)
    rope_fraction: float = 1.0  # partial rotary: rotate the even dim count nearest f*head_dim
    rope_scaling: str = "none"  # RoPE extension: "none", "pi", "ntk", "dynamic_ntk", "yarn"
    rope_scale: float = 1.0  # s = L'/L >= 1 for pi / ntk / yarn; 1 for none and dynamic_ntk
    rope_original_length: int | None = None  # training length L (yarn, dynamic_ntk)
    yarn_alpha: float = 1.0  # YaRN ramp: pairs turning < alpha times over L are interpolated
    yarn_beta: float = 32.0  # YaRN ramp: pairs turning > beta times over L are kept
    xpos_scale_base: float = 512.0  # xPos: query pair i scaled by zeta_i^(n / xpos_scale_base)
    t5_num_buckets: int = 32  # T5 bias: buckets (half per direction when bidirectional)
    t5_max_distance: int = 128  # T5 bias: distances >= this share their side's last bucket
    fire_mlp_width: int = 32  # FIRE: hidden width of the 2-layer MLP f_theta
    fire_threshold_init: float = 512.0  # FIRE: initial threshold L of psi(max(L, i))
    randomized_positions: bool = False  # engine draws sorted random positions (Ruoss et al.)
    max_position: int = 2048  # randomized positions are drawn from [0, max_position)
    sinusoidal_base: float = 10000.0  # wavelength base of the sinusoidal encoding
    attention_impl: str = "xla"  # attention implementation, see attention.IMPLEMENTATIONS
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict or ``ml_collections.ConfigDict``; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"ModelConfig has no field(s) {unknown}; allowed fields: {sorted(known)}"
            )
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fail(field: str, value: Any, allowed: str) -> None:
    raise ValueError(f"ModelConfig.{field}={value!r}: {allowed}")


def _validate(cfg: ModelConfig) -> None:
    from flaxformer_lite.core import attention
    from flaxformer_lite.nn.encodings import get_positional_encoding

    for name in (
        "vocab_size",
        "d_model",
        "num_heads",
        "d_ff",
        "max_length",
        "max_position",
    ):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            _fail(name, value, "must be a positive int")
    for name in ("num_encoder_layers", "num_decoder_layers"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            _fail(name, value, "must be an int >= 0")
    if cfg.d_model % cfg.num_heads:
        _fail("num_heads", cfg.num_heads, f"d_model={cfg.d_model} must be divisible by num_heads")
    if not isinstance(cfg.dropout_rate, int | float) or not 0.0 <= cfg.dropout_rate < 1.0:
        _fail("dropout_rate", cfg.dropout_rate, "must be in [0, 1)")
    for name, allowed in (
        ("norm", NORM_POSITIONS),
        ("activation", ACTIVATIONS),
        ("dtype", DTYPES),
        ("param_dtype", DTYPES),
        ("attention_impl", attention.IMPLEMENTATIONS),
    ):
        value = getattr(cfg, name)
        if value not in allowed:
            _fail(name, value, f"allowed values: {list(allowed)}")
    for name in ("rope_base", "sinusoidal_base"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 1.0:
            _fail(name, value, "must be a number > 1")
    if not isinstance(cfg.randomized_positions, bool):
        _fail("randomized_positions", cfg.randomized_positions, "must be a bool")
    spec = get_positional_encoding(cfg.positional)  # raises, listing the valid names
    spec.validate(cfg)
