"""The model configuration: a frozen, hashable dataclass validated once on construction.

Defaults are the base Transformer of Vaswani et al. 2017 (Table 3, "base"): 6 encoder and
6 decoder layers, ``d_model`` 512, 8 heads, ``d_ff`` 2048, dropout 0.1, post-LN, ReLU,
sinusoidal positions. The vocabulary defaults to 256 bytes (this library is byte-level; the
paper used a shared 37k BPE vocabulary).

The architectural differences of the pretrained families people study (GPT-2, OPT, XGLM,
GPT-NeoX/Pythia, Llama, Qwen2, BLOOM, MPT, Gemma 3) are options here too (DESIGN.md §8): the
norm's kind, epsilon and bias, the activation, a gated feed-forward, grouped-query attention,
an explicit head width, per-projection biases, a parallel residual, an embedding norm, query /
key norms, "sandwich" norms around each sub-layer and the attention scale. Their defaults
keep the base Transformer.

The positional encoding is chosen by name (``positional``) from the registry; its own
settings are ``positional_options``, the frozen options dataclass its registry entry declares
(`RopeOptions`, `T5Options`, ...), so adding an encoding never edits this class::

    ModelConfig(positional="rope", positional_options={"base": 500000.0, "fraction": 0.5})

Decoder layers may differ in their encoding and attention span: ``layer_pattern`` is a tuple
of `flaxformer_lite.nn.schedules.LayerKind` cycled over the layers, each field None meaning
"the model's" (`ModelConfig.layer_kinds` resolves them)::

    ModelConfig(positional="rope", layer_pattern=schedules.gemma3(window=512))

Every error names the field, the value and what is allowed, e.g.::

    ModelConfig.num_heads=3: d_model=512 must be divisible by num_heads
    ModelConfig.positional_options.base=1.0: must be a number > 1
    ModelConfig.layer_pattern[2].window=0: must be a positive int
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from flaxformer_lite.base.checks import ConfigError, check_positive_int, fail, is_int, is_number
from flaxformer_lite.core import attention
from flaxformer_lite.nn import schedules
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims
from flaxformer_lite.nn.schedules import LayerKind, ResolvedLayer

NORM_POSITIONS = ("post", "pre")
# "layer": LayerNorm; "rms": RMSNorm x / sqrt(mean(x^2) + eps) * w; "gemma_rms": Gemma's
# RMSNorm x / sqrt(mean(x^2) + eps) * (1 + w), computed in float32, w initialised to 0
NORM_TYPES = ("layer", "rms", "gemma_rms")
# "gelu" is the tanh approximation (Hendrycks & Gimpel 2016; HF "gelu_new" /
# "gelu_pytorch_tanh"), "gelu_exact" the erf form (HF "gelu"), "silu" x * sigmoid(x)
# (Elfwing et al. 2018; HF "silu" / "swish")
ACTIVATIONS = ("relu", "gelu", "gelu_exact", "silu")
RESIDUALS = ("sequential", "parallel")
DTYPES = ("float32", "bfloat16", "float16")
OPTIONS_PATH = "ModelConfig.positional_options"
# the query temperatures an evaluation can add to a trained model (no parameters)
TEMPERATURE_VARIANTS = ("logn", "llama4")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of every model in `flaxformer_lite.nn.models`."""

    vocab_size: int = 256  # output classes / input tokens (256 = raw bytes)
    d_model: int = 512  # residual stream width
    num_heads: int = 8  # attention heads; head_dim = head_size or d_model // num_heads
    # width of each attention head when it is not d_model // num_heads (Gemma 3 270M: d_model
    # 640, 4 heads of 256; HF head_dim); None: d_model // num_heads
    head_size: int | None = None
    d_ff: int = 2048  # hidden width of the position-wise feed-forward block
    num_encoder_layers: int = 6  # blocks in the Encoder (EncoderDecoder, Encoder)
    num_decoder_layers: int = 6  # blocks in the Decoder (EncoderDecoder, DecoderOnlyLM)
    dropout_rate: float = 0.1  # residual and embedding dropout (0 disables)
    norm: str = "post"  # "post": LN(x + f(x)) as in the paper; "pre": x + f(LN(x))
    # "layer": LayerNorm (Ba et al. 2016); "rms": RMSNorm (Zhang & Sennrich 2019; Llama, Qwen2);
    # "gemma_rms": x / sqrt(mean(x^2) + eps) * (1 + w) in float32, w initialised 0 (Gemma)
    norm_type: str = "layer"
    norm_epsilon: float = 1e-6  # epsilon of every norm (GPT-2/OPT/NeoX 1e-5, Llama 1e-5/1e-6)
    norm_bias: bool = True  # LayerNorm has a bias (MPT: False); RMSNorm never has one
    # feed-forward non-linearity, one of ACTIVATIONS: "relu" (paper), "gelu" (tanh form),
    # "gelu_exact" (erf form), "silu"
    activation: str = "relu"
    ffn_gated: bool = False  # gated feed-forward wo(act(wi x) * wu x) (Shazeer 2020; SwiGLU)
    # key/value heads of grouped-query attention (Ainslie et al. 2023; Llama 2 70B, Qwen2),
    # 1 = multi-query attention (Shazeer 2019); None = num_heads; must divide num_heads
    num_kv_heads: int | None = None
    use_bias: bool = True  # biases in the attention and feed-forward projections
    qkv_bias: bool | None = None  # query/key/value projection biases; None -> use_bias (Qwen2)
    out_bias: bool | None = None  # attention output projection bias; None -> use_bias
    ffn_bias: bool | None = None  # feed-forward projection biases; None -> use_bias
    head_bias: bool | None = None  # untied output head bias; None -> use_bias
    # "sequential": attention then feed-forward; "parallel": x + attn(norm1 x) + ffn(norm2 x)
    # (GPT-J, GPT-NeoX / Pythia; pre-LN, blocks without cross-attention)
    residual: str = "sequential"
    embedding_norm: bool = False  # a norm on the embeddings before the first block (BLOOM)
    # a norm (norm_type) over head_dim on queries and keys after their projection, before the
    # positional rotation (Gemma 3 q_norm / k_norm; Qwen3)
    qk_norm: bool = False
    # pre-LN plus a norm on each sub-layer's output before the residual add, x + n2(f(n1(x)))
    # ("sandwich" norms: Gemma 2/3 post_attention_layernorm and post_feedforward_layernorm)
    sandwich_norm: bool = False
    # attention logits scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5
    # (Gemma 2/3); None: head_dim ** -0.5
    query_pre_attn_scalar: float | None = None
    tie_embeddings: bool = True  # output logits use the transposed token embedding
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper §3.4)
    positional: str = "sinusoidal"  # registry name, see encodings.positional_encoding_names()
    # The encoding's options: its registry entry's dataclass, a mapping of its fields, one
    # such mapping per encoding name ({"rope": {...}, "t5": {...}}: the chosen one is used,
    # the others are checked), or None for the defaults; always stored as the dataclass.
    positional_options: EncodingOptions | Mapping[str, Any] | None = None
    randomized_positions: bool = False  # train/evaluate on sorted random positions (Ruoss et al.)
    max_position: int = 2048  # randomized positions are drawn from [0, max_position)
    attention_impl: str = "xla"  # attention implementation, see core.attention.IMPLEMENTATIONS
    # causal self-attention sees at most the last W keys (sliding window); None: all of them
    attention_window: int | None = None
    # StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): every layer with a sliding window also
    # sees the first k keys of the sequence ("attention sinks" by position); None: its window
    # only. An evaluation variant of the parallel pass (config.eval.streaming_first); cached
    # decoding, whose windowed layers keep a ring buffer of their last W keys, refuses it
    attention_keep_first: int | None = None
    # per-layer encodings and spans (`schedules.LayerKind`), cycled over the decoder layers:
    # layer i is layer_pattern[i % len]; a kind's None fields are the model's (positional,
    # positional_options, attention_window). (): every layer is the model-wide one. Decoder
    # stacks only (an Encoder refuses it); named patterns: schedules.gemma3, cohere2, ...
    layer_pattern: tuple[LayerKind, ...] = ()
    # a learned logit per head in every decoder self-attention softmax that takes probability
    # and gives no value (gpt-oss; OpenAI 2025, arXiv 2508.10925); per layer: LayerKind.sinks
    attention_sinks: bool = False
    # a length-dependent factor on every decoder self-attention query (core.temperature), one
    # of schedules.TEMPERATURES: "logn" (Qwen: max(1, log(p+1) / log L)), "ssmax"
    # (Scalable-Softmax, arXiv 2501.19399: s_h log n, s_h learned per head), "llama4" (Llama
    # 4's attn_temperature_tuning); per layer: LayerKind.temperature
    attention_temperature: str = "none"
    # L of "logn" (its training length) and of "ssmax" (s_h starts at 1 / log L); None: the
    # training length (RunConfig fills it, `with_original_length`)
    temperature_length: int | None = None
    temperature_floor_scale: float = 8192.0  # "llama4": log(floor((p+1)/f) + 1) * a + 1, f
    temperature_attn_scale: float = 0.1  # "llama4": its a
    chunked_threshold: int = attention.DEFAULT_CHUNKED_THRESHOLD  # chunked attention above
    # this many keys: "auto" in training and inference; evaluation also above 768
    # (`core.attention.FORWARD_CHUNKED_THRESHOLD`)
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``head_size``, or ``d_model // num_heads``."""
        return self.d_model // self.num_heads if self.head_size is None else self.head_size

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``num_kv_heads``, or ``num_heads`` when None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def bias_of(self, projection: str) -> bool:
        """Whether ``projection`` ("qkv", "out", "ffn" or "head") has a bias: its own field
        (``qkv_bias``, ...) or ``use_bias`` when that is None."""
        value = getattr(self, f"{projection}_bias")
        return self.use_bias if value is None else value

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def dims(self) -> ModelDims:
        """What the positional encoding may know about the model."""
        return ModelDims(self.d_model, self.num_heads, self.head_dim, self.params_dtype)

    @property
    def encoding(self) -> registry.EncodingSpec:
        """The registry entry of ``positional``."""
        return registry.get_positional_encoding(self.positional)

    def layer_kinds(self) -> tuple[ResolvedLayer, ...]:
        """One `schedules.ResolvedLayer` per decoder layer: its window, chunk, encoding name
        and options, with ``layer_pattern`` cycled and its None fields filled from the model
        (`schedules.resolve`, the one place inheritance is decided). Without a pattern every
        layer is ``(attention_window, None, positional, positional_options)``."""
        return schedules.cycle(self.pattern_kinds(), self.num_decoder_layers)

    def pattern_kinds(self) -> tuple[ResolvedLayer, ...]:
        """One `schedules.ResolvedLayer` per kind of ``layer_pattern`` (one cycle of it; the
        model-wide layer alone without a pattern), its None fields inherited from the model
        (`schedules.resolve`)."""
        model = {
            "window": self.attention_window,
            "positional": self.positional,
            "positional_options": self.positional_options,
            "sinks": self.attention_sinks,
            "temperature": self.attention_temperature,
        }
        return tuple(schedules.resolve(k, **model) for k in (self.layer_pattern or (LayerKind(),)))

    def kv_cache_slots(self, capacity: int) -> int:
        """Key/value slots the decoder's cache holds for ``capacity`` tokens, summed over its
        layers: ``capacity`` per global layer, ``min(W or C, capacity)`` per layer with a
        sliding window or chunk (a ring buffer, `core.kv_cache.ring_capacity`)."""
        kinds, n = self.pattern_kinds(), self.num_decoder_layers
        return sum(
            (n // len(kinds) + (j < n % len(kinds)))  # the layers cycling to kind j
            * (capacity if kind.span is None else min(kind.span, capacity))
            for j, kind in enumerate(kinds)
        )

    def evaluation_variants(self, requested: Sequence[str]) -> tuple[str, ...]:
        """The requested evaluation-time variants (``EvalConfig.rope_scalings``) that apply to
        this model: those some global layer's encoding takes (`EncodingSpec.eval_variants`:
        RoPE's scalings, ALiBi's ``"alibi_pi"``; every layer of a model without a pattern is
        global), in the requested order."""
        layers = [k for k in self._scalable_layers() if k.encoding.rope_scaling]
        return tuple(v for v in requested if any(v in k.encoding.eval_variants for k in layers))

    def _scalable_layers(self) -> tuple[ResolvedLayer, ...]:
        """The layers an evaluation-time RoPE scaling applies to: the global ones of a
        pattern whose encoding takes one (a window or chunk never sees a distance past W or
        C: Gemma 3 scales its global layers only); the model-wide layer without a pattern."""
        if not self.layer_pattern:
            return self.pattern_kinds()
        return tuple(k for k in self.pattern_kinds() if k.is_global and k.encoding.rope_scaling)

    def with_rope_scaling(self, scaling: str, eval_length: int) -> ModelConfig:
        """The config that evaluates trained parameters at ``eval_length`` under the RoPE
        scaling ``scaling`` (`EncodingSpec.variant_options`, e.g.
        `encodings.rotary.rope_at_length`).

        Without a pattern: the model's ``positional_options`` (an encoding without RoPE
        scaling raises). With one: the global layers whose encoding takes a scaling
        (`evaluation_variants`); the sliding-window and block-local layers keep theirs, as
        Gemma 3 does (only its global layers carry ``rope_scaling``). The scaled kinds of
        the returned pattern name their encoding and options explicitly.
        """
        if not self.layer_pattern:
            options = self.encoding.variant_options(self.positional_options, scaling, eval_length)
            return self.replace(positional_options=options)
        scaled = self._scalable_layers()
        if not scaled:
            raise ValueError(
                f"ModelConfig.layer_pattern has no global layer whose encoding takes a RoPE "
                f"scaling ({scaling!r} applies to global layers only)"
            )
        kinds = []
        layers = self.pattern_kinds()
        for i, (kind, layer) in enumerate(zip(self.layer_pattern, layers, strict=True)):
            if layer in scaled and scaling in layer.encoding.eval_variants:
                try:
                    options = layer.encoding.variant_options(
                        layer.positional_options, scaling, eval_length
                    )
                except ValueError as e:  # name the kind's options, not the model's
                    path = f"{schedules.PATTERN_PATH}[{i}].positional_options"
                    raise ConfigError(str(e).replace(OPTIONS_PATH, path)) from None
                kind = dataclasses.replace(
                    kind, positional=layer.positional, positional_options=options
                )
            kinds.append(kind)
        return self.replace(layer_pattern=tuple(kinds))

    def variant_is_identity(self, variant: str, eval_length: int) -> bool:
        """Whether `with_rope_scaling` (``variant`` at sequences of at most ``eval_length``
        tokens) changes no number of this model: every layer it applies to is left exactly as
        it is (`EncodingSpec.variant_is_identity`, e.g. a RoPE scaling at ``s = 1``)."""
        layers = [k for k in self._scalable_layers() if variant in k.encoding.eval_variants]
        return bool(layers) and all(
            k.encoding.variant_is_identity(k.positional_options, variant, eval_length)
            for k in layers
        )

    def with_original_length(self, length: int) -> ModelConfig:
        """A copy whose RoPE-scalable options (`EncodingSpec.rope_scaling`: the model-wide
        ones and each pattern kind's) that have ``original_length`` None get ``length``:
        the training length evaluation-time scalings extend from. Changes no number of the
        model as it is."""

        def fill(spec: registry.EncodingSpec, options: Any) -> Any:
            if spec.rope_scaling and getattr(options, "original_length", 0) is None:
                return dataclasses.replace(options, original_length=length)
            return options

        kinds = []
        for kind in self.layer_pattern:  # validated: options are set where a kind names any
            if kind.positional_options is not None:
                spec = registry.get_positional_encoding(kind.positional or self.positional)
                options = fill(spec, kind.positional_options)
                kind = dataclasses.replace(kind, positional_options=options)
            kinds.append(kind)
        return self.replace(
            positional_options=fill(self.encoding, self.positional_options),
            layer_pattern=tuple(kinds),
        ).with_temperature_length(length)

    def with_temperature_length(self, length: int) -> ModelConfig:
        """A copy whose ``temperature_length`` is ``length`` where it is None and some
        layer's temperature takes it ("logn", "ssmax"): a run's training length L, the L of
        ``log L``. Unchanged otherwise."""
        if self.temperature_length is not None or not self._uses_temperature_length():
            return self
        return self.replace(temperature_length=length)

    def _uses_temperature_length(self) -> bool:
        """Some layer's temperature is "logn" or "ssmax" (which take ``temperature_length``)."""
        return any(k.temperature in ("logn", "ssmax") for k in self.pattern_kinds())

    def current_rope_scaling(self) -> str:
        """The RoPE scaling the model has (``"none"`` when none; with a pattern, that of its
        first layer where scalings apply)."""
        layers = self._scalable_layers()
        options = layers[0].positional_options if layers else self.positional_options
        return getattr(options, "scaling", "none")

    def encoding_label(self, name: str | None = None) -> str:
        """The encoding's name in results rows.

        Without a pattern: the registry label (``"rope"``, ``"rope+pi"`` for RoPE with
        ``scaling="pi"``). With one: the pattern's name (`schedules.pattern_name`,
        ``"gemma3"``), after the model's encoding when some kind inherits it
        (``"rope+gpt_oss"``), then the distinct suffixes of the layers' options
        (``"gemma3+yarn"``). ``name`` replaces everything before the suffixes (a pretrained
        model's row name: ``"gemma-3-270m+yarn"``). Attention options follow: ``"+sinks"``
        when some layer has attention sinks.
        """
        layers = self.pattern_kinds()
        suffixes = []
        for layer in layers:
            suffix = layer.encoding.label(layer.positional_options)[len(layer.positional) :]
            if suffix and suffix not in suffixes:
                suffixes.append(suffix)
        suffixes += self._attention_suffixes(layers)
        if not self.layer_pattern:
            base = self.positional
        else:
            base = schedules.pattern_name(self.layer_pattern)
            if any(k.positional is None for k in self.layer_pattern):
                base = f"{self.positional}+{base}"
        return (base if name is None else name) + "".join(suffixes)

    @staticmethod
    def _attention_suffixes(layers: Sequence[ResolvedLayer]) -> list[str]:
        """The label suffixes of the layers' attention options: ``"+sinks"``, then each
        query temperature (``"+logn"``)."""
        out = ["+sinks"] if any(layer.sinks for layer in layers) else []
        for layer in layers:
            if layer.temperature != "none" and f"+{layer.temperature}" not in out:
                out.append(f"+{layer.temperature}")
        return out

    def evaluation_temperatures(self, requested: Sequence[str]) -> tuple[str, ...]:
        """The requested training-free temperature variants (``EvalConfig.temperatures``,
        `TEMPERATURE_VARIANTS`) that apply to this model: all of them, unless some layer
        already has a learned temperature ("ssmax", whose parameters a variant would drop):
        then none."""
        if any(layer.temperature == "ssmax" for layer in self.pattern_kinds()):
            return ()
        return tuple(requested)

    def with_temperature(self, temperature: str, train_length: int) -> ModelConfig:
        """The config that evaluates trained parameters with the training-free query factor
        ``temperature`` (one of `TEMPERATURE_VARIANTS`) on every decoder layer that inherits
        the model's (``LayerKind.temperature`` None), with ``temperature_length``
        ``train_length`` when it is None. Neither factor has parameters: reuse the trained
        state."""
        if temperature not in TEMPERATURE_VARIANTS:
            fail(
                "temperature",
                temperature,
                f"allowed training-free variants: {list(TEMPERATURE_VARIANTS)} (SSMax learns "
                "its s per head)",
            )
        length = train_length if self.temperature_length is None else self.temperature_length
        return self.replace(attention_temperature=temperature, temperature_length=length)

    def scores_incrementally(self) -> bool:
        """Whether some layer's encoding must be scored token by token
        (`EncodingSpec.scores_incrementally`: dynamic NTK, LongRoPE)."""
        return any(
            k.encoding.scores_incrementally(k.positional_options) for k in self.pattern_kinds()
        )

    def encoding_settings(self) -> dict[str, Any]:
        """The exact encoding as a plain dict for results rows: ``{"positional": name,
        **options}`` (`EncodingSpec.settings`), plus ``layer_pattern`` (each kind as a dict)
        when there is one."""
        out = self.encoding.settings(self.positional_options)
        if self.layer_pattern:
            out["layer_pattern"] = [schedules.kind_dict(k) for k in self.layer_pattern]
        return out

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (validated again).

        Changing ``positional`` without ``positional_options`` resets the options to the new
        encoding's defaults.
        """
        if "positional" in changes and "positional_options" not in changes:
            if changes["positional"] != self.positional:
                changes["positional_options"] = None
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict or ``ml_collections.ConfigDict``; unknown keys are an error.

        ``positional_options`` is either the chosen encoding's options (``{"base": 10000.0}``,
        as `to_dict` writes it) or one mapping per registered encoding (``{"rope": {...},
        "t5": {...}}``, as a study config holds them so that a sweep can switch encodings).
        """
        values = _to_plain(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"ModelConfig has no field(s) {unknown}; allowed fields: {sorted(known)}"
            )
        try:
            spec = registry.get_positional_encoding(values.get("positional", "sinusoidal"))
            options = _chosen_options(spec, values.get("positional_options"))
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(str(e)) from None
        values["positional_options"] = options
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain values; a pattern's kinds as `schedules.kind_dict`."""
        out = dataclasses.asdict(self)
        out["layer_pattern"] = tuple(schedules.kind_dict(k) for k in self.layer_pattern)
        return out


def options_template() -> dict[str, dict[str, Any]]:
    """``{encoding: {option: default}}`` for every registered encoding: the
    ``positional_options`` section of a study config, so a sweep can switch encodings and
    any option can be overridden from the command line."""
    return registry.default_options_by_name()


def rope_scaling_variant(
    cfg: ModelConfig, eval_length: int, scaling: str | None = None
) -> ModelConfig:
    """The config that evaluates a trained model at ``eval_length`` under a RoPE context
    extension ``scaling`` (default: the one it has), for an encoding where RoPE scaling
    applies (`EncodingSpec.rope_scaling`); with a ``layer_pattern``, its global layers only
    (`ModelConfig.with_rope_scaling`).

    ``s = max(1, eval_length / original_length)`` for ``"pi"``, ``"ntk"`` and ``"yarn"``;
    ``"none"`` and ``"dynamic_ntk"`` keep ``scale = 1``. RoPE has no parameters: build the
    model from the returned config and reuse the trained state. Name the results row with
    `encoding_row_name`.
    """
    if scaling is None:
        scaling = cfg.current_rope_scaling()
    return cfg.with_rope_scaling(scaling, eval_length)


def encoding_row_name(cfg: ModelConfig) -> str:
    """The encoding's name in results rows: ``cfg.positional``, plus what its options select
    (``"rope+pi"`` for RoPE with ``scaling="pi"``), or the layer pattern's name
    (`ModelConfig.encoding_label`). The exact settings are ``cfg.encoding_settings()``."""
    return cfg.encoding_label()


def _to_plain(values: Mapping[str, Any]) -> dict[str, Any]:
    if hasattr(values, "to_dict"):
        values = values.to_dict()
    return dict(values.items())


def _chosen_options(spec: registry.EncodingSpec, value: Any) -> dict[str, Any]:
    """The chosen encoding's options as a plain dict, from either form of
    ``positional_options`` (see `ModelConfig.from_mapping`)."""
    if value is None:
        return {}
    if isinstance(value, EncodingOptions):
        return dataclasses.asdict(spec.make_options(value, path=OPTIONS_PATH))
    if not isinstance(value, Mapping):
        fail(OPTIONS_PATH, value, "must be a mapping of options")
    value = _to_plain(value)
    names = set(registry.positional_encoding_names())
    if value and set(value) <= names and all(isinstance(v, Mapping) for v in value.values()):
        for other, options in value.items():  # every section must at least be well formed
            registry.get_positional_encoding(other).make_options(
                _to_plain(options), path=f"{OPTIONS_PATH}.{other}"
            )
        return _to_plain(value.get(spec.name, {}))
    return value


def _validate(cfg: ModelConfig) -> None:
    def bad(name: str, allowed: str) -> None:
        fail(f"ModelConfig.{name}", getattr(cfg, name), allowed)

    for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_position", "chunked_threshold"):
        check_positive_int(f"ModelConfig.{name}", getattr(cfg, name), error=ConfigError)
    for name in ("num_encoder_layers", "num_decoder_layers"):
        value = getattr(cfg, name)
        if not is_int(value) or value < 0:
            bad(name, "must be an int >= 0")
    if cfg.head_size is not None:
        check_positive_int("ModelConfig.head_size", cfg.head_size, error=ConfigError)
    elif cfg.d_model % cfg.num_heads:
        bad(
            "num_heads",
            f"d_model={cfg.d_model} must be divisible by num_heads (or set head_size)",
        )
    if not is_number(cfg.dropout_rate) or not 0.0 <= cfg.dropout_rate < 1.0:
        bad("dropout_rate", "must be in [0, 1)")
    for name, allowed in (
        ("norm", NORM_POSITIONS),
        ("norm_type", NORM_TYPES),
        ("activation", ACTIVATIONS),
        ("residual", RESIDUALS),
        ("dtype", DTYPES),
        ("param_dtype", DTYPES),
        ("attention_impl", attention.IMPLEMENTATIONS),
    ):
        if getattr(cfg, name) not in allowed:
            bad(name, f"allowed values: {list(allowed)}")
    for field in dataclasses.fields(cfg):  # the flags, by their annotation
        value = getattr(cfg, field.name)
        if field.type == "bool" and not isinstance(value, bool):
            bad(field.name, "must be a bool")
        if field.type == "bool | None" and not isinstance(value, bool | None):
            bad(field.name, "must be a bool or None (None: use_bias)")
    if cfg.sandwich_norm and cfg.norm != "pre":
        bad(
            "sandwich_norm",
            f"norms around each sub-layer, x + n2(f(n1(x))), need norm='pre'; got "
            f"norm={cfg.norm!r}",
        )
    scalar = cfg.query_pre_attn_scalar
    if scalar is not None and (not is_number(scalar) or not 0 < scalar < float("inf")):
        bad("query_pre_attn_scalar", "must be a finite number > 0 or None (None: head_dim)")
    if not is_number(cfg.norm_epsilon) or not 0.0 < cfg.norm_epsilon < 1.0:
        bad("norm_epsilon", "must be a number in (0, 1)")
    if cfg.num_kv_heads is not None:
        check_positive_int("ModelConfig.num_kv_heads", cfg.num_kv_heads, error=ConfigError)
        if cfg.num_heads % cfg.num_kv_heads:
            bad(
                "num_kv_heads",
                f"must divide num_heads={cfg.num_heads} (each key/value head serves "
                "num_heads / num_kv_heads query heads); None means num_heads",
            )
    if cfg.residual == "parallel" and cfg.norm != "pre":
        bad(
            "residual",
            f"the parallel residual x + attn(norm1 x) + ffn(norm2 x) needs norm='pre'; got "
            f"norm={cfg.norm!r}",
        )
    if cfg.attention_window is not None:
        check_positive_int("ModelConfig.attention_window", cfg.attention_window, error=ConfigError)
    try:
        spec = registry.get_positional_encoding(cfg.positional)  # raises, listing the names
        options = cfg.positional_options
        if isinstance(options, Mapping):
            options = _chosen_options(spec, options)
        options = spec.make_options(options, path=OPTIONS_PATH)
        spec.validate(cfg.dims, options, path=OPTIONS_PATH)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    object.__setattr__(cfg, "positional_options", options)  # normalised: the dataclass
    pattern = schedules.check_pattern(
        cfg.layer_pattern, positional=cfg.positional, dims=cfg.dims, hook=spec.hook
    )
    object.__setattr__(cfg, "layer_pattern", pattern)  # normalised: LayerKind, options dataclasses
    _validate_temperature(cfg)
    _validate_keep_first(cfg)
    capacity = spec.capacity(options)
    if cfg.randomized_positions and capacity is not None and cfg.max_position > capacity:
        value = getattr(options, spec.capacity_field, capacity)
        bad(
            "max_position",
            f"with randomized_positions, positions are drawn from [0, max_position), but "
            f"{cfg.positional!r} encodes only {capacity} ({OPTIONS_PATH}.{spec.capacity_field}"
            f"={value}); max_position must be <= {capacity}",
        )


def _validate_keep_first(cfg: ModelConfig) -> None:
    keep = cfg.attention_keep_first
    if keep is None:
        return
    check_positive_int("ModelConfig.attention_keep_first", keep, error=ConfigError)
    if not any(kind.window is not None for kind in cfg.layer_kinds()):
        fail(
            "ModelConfig.attention_keep_first",
            keep,
            "keeps the first keys beside a sliding window: it needs attention_window or a "
            "windowed decoder layer in layer_pattern (None: no kept keys)",
        )


def _validate_temperature(cfg: ModelConfig) -> None:
    if cfg.attention_temperature not in schedules.TEMPERATURES:
        fail(
            "ModelConfig.attention_temperature",
            cfg.attention_temperature,
            f"allowed values: {list(schedules.TEMPERATURES)}",
        )
    length = cfg.temperature_length
    if length is not None and (not is_int(length) or length < 2):
        fail("ModelConfig.temperature_length", length, "must be an int >= 2 (log L) or None")
    for name, low in (("temperature_floor_scale", "> 0"), ("temperature_attn_scale", ">= 0")):
        value = getattr(cfg, name)
        positive = is_number(value) and (value > 0 or (low == ">= 0" and value == 0))
        if not positive or value == float("inf"):
            fail(f"ModelConfig.{name}", value, f"must be a finite number {low}")
    for i, kind in enumerate(cfg.pattern_kinds()):
        if kind.temperature == "ssmax" and kind.chunk is not None:
            fail(
                f"{schedules.PATTERN_PATH}[{i}].temperature",
                "ssmax",
                "SSMax's log n counts the keys a query sees: global or sliding-window layers "
                "only, not a chunk",
            )


def check_encodable(cfg: ModelConfig, length: int, *, what: str) -> None:
    """Raise `ConfigError` if the encoding cannot encode positions ``0..length-1`` (or, with
    randomized positions, ``0..max_position-1``): the one check of "the encoding must cover
    the longest sequence it will see", naming the option to change. ``what`` names the
    sequence, e.g. ``"the longest evaluation sequence"``."""
    spec = cfg.encoding
    capacity = spec.capacity(cfg.positional_options)
    if capacity is None:
        return
    reason = f"{what} ({length} tokens)"
    needed = length
    if cfg.randomized_positions and cfg.max_position > length:
        reason = f"the randomized positions (config.model.max_position={cfg.max_position})"
        needed = cfg.max_position
    if needed > capacity:
        # the option may exceed the capacity (a learned table's offset rows)
        value = getattr(cfg.positional_options, spec.capacity_field, capacity)
        fail(
            f"config.model.positional_options.{cfg.positional}.{spec.capacity_field}",
            value,
            f"must be >= {needed + value - capacity}: the {cfg.positional!r} encoding must "
            f"encode every position of {reason}; rows past the training length stay untrained",
        )
