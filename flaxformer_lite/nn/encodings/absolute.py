"""Encodings **added** to the token embeddings: sinusoidal and learned (hook ``add``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.base.checks import ConfigError, check_positive_int, fail, is_int, is_number
from flaxformer_lite.core import absolute
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec, register

Array = jax.Array


SINUSOIDAL_VARIANTS = ("vaswani", "fairseq")


def _check_offset(path: str, offset: object) -> None:
    if not is_int(offset) or offset < 0:
        fail(f"{path}.offset", offset, "must be an int >= 0")


@dataclasses.dataclass(frozen=True)
class SinusoidalOptions(EncodingOptions):
    """Options of the sinusoidal encoding."""

    base: float = 10000.0  # wavelength base: PE[p, 2i] = sin(p / base^(2i/d_model))
    # "vaswani": sin/cos interleaved (the paper); "fairseq": sines | cosines concatenated,
    # frequencies base^(-i/(d/2 - 1)) (fairseq, XGLM), `absolute.sinusoidal_fairseq`
    variant: str = "vaswani"
    offset: int = 0  # encode position p as p + offset (XGLM: 2, fairseq's padding_idx + 1)

    def check(self, dims: ModelDims, path: str) -> None:
        if not is_number(self.base) or not self.base > 1.0:
            fail(f"{path}.base", self.base, "must be a number > 1")
        if self.variant not in SINUSOIDAL_VARIANTS:
            fail(f"{path}.variant", self.variant, f"allowed: {list(SINUSOIDAL_VARIANTS)}")
        if self.variant == "fairseq" and dims.d_model < 4:
            fail(f"{path}.variant", self.variant, f"needs d_model >= 4; got {dims.d_model}")
        _check_offset(path, self.offset)


class SinusoidalEncoding(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017, §3.5); see
    `flaxformer_lite.core.absolute.sinusoidal` for the layout (sin on even dims, cos on odd),
    or `absolute.sinusoidal_fairseq` for ``variant="fairseq"`` (XGLM), of ``positions +
    offset``."""

    hook = "add"

    def __init__(self, dims: ModelDims, options: SinusoidalOptions, *, rngs: nnx.Rngs):
        del rngs
        self.d_model = dims.d_model
        self.base = options.base
        self.variant = options.variant
        self.offset = options.offset

    def add(self, x: Array, positions: Array) -> Array:
        fn = absolute.sinusoidal_fairseq if self.variant == "fairseq" else absolute.sinusoidal
        if self.offset:
            positions = positions + self.offset
        pe_BTD = fn(positions, self.d_model, base=self.base)
        return (x.astype(jnp.float32) + pe_BTD).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class LearnedOptions(EncodingOptions):
    """Options of the learned absolute table."""

    max_length: int = 2048  # rows of the table: positions must be < max_length - offset
    offset: int = 0  # position p reads row p + offset (OPT: 2); capacity max_length - offset

    def check(self, dims: ModelDims, path: str) -> None:
        check_positive_int(f"{path}.max_length", self.max_length, error=ConfigError)
        _check_offset(path, self.offset)
        if self.offset >= self.max_length:
            fail(
                f"{path}.offset",
                self.offset,
                f"must be < max_length={self.max_length} (the table encodes positions "
                "0..max_length - offset - 1)",
            )


class LearnedEncoding(PositionalEncoding):
    """A trained table ``[max_length, d_model]`` added to the embeddings (GPT-2, BERT); row
    ``p + offset`` for position ``p`` (OPT's ``OPTLearnedPositionalEmbedding`` has offset 2),
    so it encodes ``max_length - offset`` positions.

    It cannot encode a position it has no row for. JAX clamps out-of-range gathers silently
    (the last row would be reused), which would make an extrapolation study a lie, so:

    * a sequence longer than the table is a ``ValueError`` when the model is traced;
    * a position value past the table (e.g. an offset under jit) gathers NaN rows, which
      poison the output visibly instead of clamping.

    Studies that evaluate beyond the training length size the table for the longest
    evaluation length (the registry's ``max_positions`` capability lets the evaluation plan
    check it before training); rows past the training length are then never trained.
    """

    hook = "add"

    def __init__(self, dims: ModelDims, options: LearnedOptions, *, rngs: nnx.Rngs):
        self.max_length = options.max_length
        self.offset = options.offset
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(
            init(rngs.params(), (options.max_length, dims.d_model), jnp.dtype(dims.param_dtype)),
            logical_axes=("position", "embed"),
        )

    def add(self, x: Array, positions: Array) -> Array:
        length = positions.shape[-1]
        if length > self.max_length - self.offset:
            offset = f" - offset={self.offset}" if self.offset else ""
            raise ValueError(
                f"learned positional table has max_length={self.max_length}{offset} rows but "
                f"the sequence has length {length}; set the learned encoding's max_length >= "
                f"{length + self.offset} (ModelConfig.positional_options; rows beyond the "
                "training length stay untrained)"
            )
        table_LD = self.table[...].astype(jnp.float32)  # L: the table's max_length rows
        if self.offset:
            positions = positions + self.offset
        pe_BTD = jnp.take(table_LD, positions, axis=0, mode="fill", fill_value=jnp.nan)
        return (x.astype(jnp.float32) + pe_BTD).astype(x.dtype)


for _spec in (
    EncodingSpec(
        "sinusoidal",
        "add",
        SinusoidalEncoding,
        options=SinusoidalOptions,
        num_params=lambda dims, options: 0,
        summary="fixed sinusoids added to the embeddings (Vaswani et al. 2017)",
    ),
    EncodingSpec(
        "learned",
        "add",
        LearnedEncoding,
        options=LearnedOptions,
        max_positions=lambda options: options.max_length - options.offset,
        capacity_field="max_length",
        num_params=lambda dims, options: options.max_length * dims.d_model,
        summary="trained absolute table added to the embeddings",
    ),
):
    register(_spec)
