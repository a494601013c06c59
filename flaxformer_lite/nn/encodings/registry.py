"""The positional-encoding registry: the one place that knows encodings by name (DESIGN.md §3).

An `EncodingSpec` declares everything the rest of the library may ask about an encoding --
its hook, its options, whether it is causal-only, how many positions it can encode, whether
RoPE scaling applies at evaluation, its label in results rows -- so models, evaluation and
the experiment runner ask the spec and never compare an encoding's name. Adding an encoding
is one module, one `register` call and its tests; the model config is not edited.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax import nnx

from flaxformer_lite.base.checks import check_type
from flaxformer_lite.nn.encodings.base import (
    HOOKS,
    EncodingOptions,
    ModelDims,
    PositionalEncoding,
)

# factory(dims, options, rngs=...) -> the encoding module
Factory = Callable[..., PositionalEncoding]


@dataclasses.dataclass(frozen=True)
class NoOptions(EncodingOptions):
    """An encoding without options of its own (NoPE, ALiBi, KERPLE)."""


@dataclasses.dataclass(frozen=True)
class EncodingSpec:
    """A registry entry: how to build an encoding and what it can do.

    Attributes:
      name: the config name (``ModelConfig.positional``).
      hook: where it acts, one of `HOOKS`.
      factory: ``factory(dims, options, rngs=...)`` returns the `PositionalEncoding` module.
      options: the frozen `EncodingOptions` dataclass of its settings (defaults = the
        paper's); recorded in every results row (papers disagree on what "rotary" means).
      causal_only: defined only for causal self-attention (e.g. xPos).
      max_positions: ``max_positions(options)``, how many positions ``0..n-1`` it can
        encode (a learned table's rows); None for any number.
      capacity_field: the option that sets ``max_positions`` (named in error messages).
      eval_variant: ``eval_variant(options, variant, eval_length)``: the options that
        evaluate a trained model under an evaluation-time variant (a RoPE scaling: same
        parameters, other frequencies); None when no variant applies.
      eval_variants: the variants ``eval_variant`` accepts (``EvalConfig.rope_scalings``
        names them); empty when RoPE scaling does not apply.
      eval_identity: ``eval_identity(options, variant, eval_length)``: True where
        ``eval_variant`` changes no number of the model (a RoPE scaling at ``s = 1``), so
        evaluation repeats the model's own result for that cell instead of scoring it again;
        None: never.
      label_suffix: ``label_suffix(options)``, appended to the name in results rows for a
        variant the options select (``"+pi"`` for RoPE with ``scaling="pi"``).
      incremental: ``incremental(options)``: True when a target's output depends on the
        length of the sequence so far (dynamic NTK scaling), so that scoring a whole window
        in one pass would give every target the scale of the window's length; evaluation
        then scores such a model token by token through its KV cache.
      num_params: ``num_params(dims, options)``, how many parameters the encoding module
        has (`flaxformer_lite.nn.param_count` counts a model by arithmetic); None: it is
        counted by tracing the module alone.
      per_layer: the module is built once per decoder layer that uses it, its parameters
        the layer's own (``decoder.blocks.<i>.pe``), instead of once per stack and shared
        by those layers (``decoder.pe``, as T5's, KERPLE's and FIRE's tables are). Not for
        an "add" encoding, which acts once per stack on the embeddings.
      summary: one line for listings and docs.
    """

    name: str
    hook: str
    factory: Factory
    options: type[EncodingOptions] = NoOptions
    causal_only: bool = False
    max_positions: Callable[[Any], int | None] | None = None
    capacity_field: str = ""
    eval_variant: Callable[[Any, str, int], Any] | None = None
    eval_variants: tuple[str, ...] = ()
    eval_identity: Callable[[Any, str, int], bool] | None = None
    label_suffix: Callable[[Any], str] | None = None
    incremental: Callable[[Any], bool] | None = None
    num_params: Callable[[ModelDims, Any], int] | None = None
    per_layer: bool = False
    summary: str = ""

    # ------------------------------------------------------------------ options

    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options))

    def make_options(self, value: Any = None, *, path: str) -> EncodingOptions:
        """``value`` (None, a mapping of option names, or an instance) as this encoding's
        options; unknown names and wrongly typed values raise ValueError naming ``path``."""
        if value is None:
            return self.options()
        if isinstance(value, self.options):
            return value
        if isinstance(value, EncodingOptions):
            raise ValueError(
                f"{path}={value!r}: positional={self.name!r} takes {self.options.__name__}, "
                f"not {type(value).__name__}"
            )
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{path}={value!r}: must be a mapping of {self.name!r} options or a "
                f"{self.options.__name__}"
            )
        values = dict(value.items())
        unknown = sorted(set(values) - set(self.option_names()))
        if unknown:
            raise ValueError(
                f"{path} has no option(s) {unknown} for positional={self.name!r}; allowed: "
                f"{sorted(self.option_names())}"
            )
        hints = typing.get_type_hints(self.options)
        kwargs = {
            k: check_type(f"{path}.{k}", v, hints[k], error=ValueError) for k, v in values.items()
        }
        return self.options(**kwargs)

    def validate(self, dims: ModelDims, options: EncodingOptions, *, path: str) -> None:
        """Check ``options`` against the model's dims (ValueError naming ``path.<field>``)."""
        options.check(dims, path)

    # --------------------------------------------------------------- capabilities

    def build(self, cfg: Any, *, rngs: nnx.Rngs) -> PositionalEncoding:
        """The encoding module for a model config (a `ModelConfig`: its ``dims`` and
        ``positional_options``)."""
        if cfg.positional != self.name:
            raise ValueError(f"ModelConfig.positional={cfg.positional!r}; this is {self.name!r}")
        return self.factory(cfg.dims, cfg.positional_options, rngs=rngs)

    def build_with(
        self, dims: ModelDims, options: EncodingOptions, *, rngs: nnx.Rngs
    ) -> PositionalEncoding:
        """The encoding module for ``dims`` and ``options`` (a decoder layer's encoding in a
        `ModelConfig.layer_pattern`, `ModelConfig.layer_kinds`)."""
        options = self.make_options(options, path=f"{self.name} options")
        return self.factory(dims, options, rngs=rngs)

    def capacity(self, options: EncodingOptions) -> int | None:
        """How many positions ``0..n-1`` the encoding can encode; None for any number."""
        return None if self.max_positions is None else self.max_positions(options)

    @property
    def rope_scaling(self) -> bool:
        """Whether an evaluation-time variant applies to this encoding (a RoPE scaling, or
        ALiBi's position interpolation): it has an ``eval_variant``."""
        return self.eval_variant is not None

    def evaluation_variants(self, requested: Sequence[str]) -> tuple[str, ...]:
        """The requested evaluation-time variants (``EvalConfig.rope_scalings``) that apply:
        those in ``eval_variants``; each adds result rows."""
        return tuple(v for v in requested if v in self.eval_variants)

    def variant_options(
        self, options: EncodingOptions, variant: str, eval_length: int
    ) -> EncodingOptions:
        """The options that evaluate trained parameters under ``variant`` at ``eval_length``."""
        if self.eval_variant is None:
            raise ValueError(
                f"positional={self.name!r} has no evaluation-time variant {variant!r} (RoPE "
                f"scaling applies to {[s.name for s in _REGISTRY.values() if s.rope_scaling]})"
            )
        return self.eval_variant(options, variant, eval_length)

    def variant_is_identity(self, options: EncodingOptions, variant: str, eval_length: int) -> bool:
        """Whether ``variant`` at ``eval_length`` leaves a model with ``options`` exactly as it
        is (see ``eval_identity``)."""
        return self.eval_identity is not None and self.eval_identity(options, variant, eval_length)

    def label(self, options: EncodingOptions) -> str:
        """The encoding's name in results rows, e.g. ``"rope"`` or ``"rope+pi"``."""
        suffix = "" if self.label_suffix is None else self.label_suffix(options)
        return self.name + suffix

    def scores_incrementally(self, options: EncodingOptions) -> bool:
        """Whether a model with these options must be scored token by token (see
        ``incremental``)."""
        return self.incremental is not None and bool(self.incremental(options))

    def settings(self, options: EncodingOptions) -> dict[str, Any]:
        """The exact variant as a plain dict: ``{"positional": name, **options}``."""
        return {"positional": self.name} | dataclasses.asdict(options)


_REGISTRY: dict[str, EncodingSpec] = {}


def register(spec: EncodingSpec) -> EncodingSpec:
    """Add an encoding to the registry (names are unique; options must be a frozen dataclass)."""
    if spec.hook not in HOOKS:
        raise ValueError(f"EncodingSpec.hook={spec.hook!r}; allowed: {list(HOOKS)}")
    if spec.name in _REGISTRY:
        raise ValueError(f"positional encoding {spec.name!r} is already registered")
    if spec.per_layer and spec.hook == "add":
        raise ValueError(
            f"EncodingSpec.per_layer=True with hook 'add' ({spec.name!r}): an encoding that adds "
            "to the embeddings acts once per stack"
        )
    if not (
        isinstance(spec.options, type)
        and issubclass(spec.options, EncodingOptions)
        and dataclasses.is_dataclass(spec.options)
        and spec.options.__dataclass_params__.frozen
    ):
        raise ValueError(
            f"EncodingSpec.options={spec.options!r}: must be a frozen dataclass subclassing "
            "EncodingOptions"
        )
    _REGISTRY[spec.name] = spec
    return spec


def positional_encoding_names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(_REGISTRY)


def get_positional_encoding(name: str) -> EncodingSpec:
    """The registry entry for ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"ModelConfig.positional={name!r} is not a known positional encoding; "
            f"allowed: {list(_REGISTRY)}"
        ) from None


def default_options_by_name() -> dict[str, dict[str, Any]]:
    """``{encoding: {option: default}}`` for every registered encoding (empty dicts included)."""
    return {name: dataclasses.asdict(spec.options()) for name, spec in _REGISTRY.items()}
