"""Per-layer attention schedules: which positional encoding and attention span each layer has.

Production long-context models mix layer kinds: Gemma 3 runs five sliding-window layers then
one global layer, each kind with its own RoPE base; Cohere2 (Command A) three sliding-window
RoPE layers then one global layer without positions; Llama 4 puts a global NoPE layer every
fourth layer and gives the others RoPE and block-local ("chunked") attention. A
`ModelConfig.layer_pattern` is a tuple of `LayerKind` s, cycled over the decoder layers
(layer ``i`` is ``pattern[i % len(pattern)]``, as Gemma 3's ``sliding_window_pattern``);
every field a kind leaves None is the model's (``attention_window``, ``positional``,
``positional_options``). `resolve` is the one place that inheritance is decided, producing a
`ResolvedLayer` per layer (`ModelConfig.layer_kinds`).

The named patterns are functions returning such tuples, each citing its source::

    c.model.positional = "rope"
    c.model.layer_pattern = schedules.gemma3(window=16)

To give `LayerKind` a new field (attention sinks, a temperature): add it here with a
comment, one line in `resolve` (and `ResolvedLayer`), and its check in `check_kind`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from flaxformer_lite.base.checks import ConfigError, check_positive_int, fail, is_int
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims

PATTERN_PATH = "ModelConfig.layer_pattern"
# the query factors of `flaxformer_lite.core.temperature` ("none": no factor)
TEMPERATURES = ("none", "logn", "ssmax", "llama4")


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One kind of decoder layer in a `ModelConfig.layer_pattern`; None inherits the model's.

    Attributes:
      window: sliding window W: query ``i`` sees keys ``i - W < j <= i``. With ``chunk``
        also None, the layer inherits ``ModelConfig.attention_window`` (None there: global).
      chunk: block-local causal attention (Llama 4's ``attention_chunk_size``): query ``i``
        sees keys ``j <= i`` with ``floor(j / C) == floor(i / C)``. At most one of window
        and chunk.
      positional: a registry name (``"rope"``, ``"none"``, ...); None: ``ModelConfig.positional``.
        An encoding that adds to the embeddings (hook "add") acts once per stack, so no kind
        may name one.
      positional_options: that encoding's options (its dataclass or a mapping of its fields);
        None: the model's ``positional_options`` when ``positional`` is None, else the named
        encoding's defaults. Stored as the dataclass once the config is validated.
      name: a label (``"gemma3.local"``); the named patterns set it, and results rows name a
        pattern whose kinds share a prefix by it (``"gemma3"``). Changes no number.
      sinks: a learned attention-sink logit per head (gpt-oss; `core.attention`'s ``sinks``);
        None: ``ModelConfig.attention_sinks``.
      temperature: the length-dependent query factor of the layer, one of
        `TEMPERATURES` (``"none"``, ``"logn"``, ``"ssmax"``, ``"llama4"``; `core.temperature`);
        None: ``ModelConfig.attention_temperature`` (Llama 4 tunes its NoPE layers only).
    """

    window: int | None = None
    chunk: int | None = None
    positional: str | None = None
    positional_options: EncodingOptions | Mapping[str, Any] | None = None
    name: str = ""
    sinks: bool | None = None
    temperature: str | None = None


@dataclasses.dataclass(frozen=True)
class ResolvedLayer:
    """One decoder layer with nothing left to inherit (`resolve`).

    Attributes:
      window, chunk: the layer's attention span (both None: global causal attention).
      positional: the registry name of its encoding; positional_options: its options.
      sinks: whether its self-attention has a learned sink logit per head (gpt-oss).
      temperature: its query factor (`TEMPERATURES`; ``"none"``: none).
    """

    window: int | None
    chunk: int | None
    positional: str
    positional_options: EncodingOptions
    sinks: bool = False
    temperature: str = "none"

    @property
    def encoding(self) -> registry.EncodingSpec:
        return registry.get_positional_encoding(self.positional)

    @property
    def span(self) -> int | None:
        """The most recent positions a query can see (W or C), None for a global layer: the
        number of KV-cache slots the layer needs (`core.kv_cache.ring_capacity`)."""
        return self.window if self.window is not None else self.chunk

    @property
    def is_global(self) -> bool:
        """No window and no chunk: the layer sees every earlier position."""
        return self.span is None


def resolve(
    kind: LayerKind,
    *,
    window: int | None,
    positional: str,
    positional_options: EncodingOptions,
    sinks: bool = False,
    temperature: str = "none",
) -> ResolvedLayer:
    """``kind`` with the model's ``window``, ``positional`` and ``positional_options`` (its
    ``attention_window``, ``positional``, ``positional_options``), ``sinks``
    (``attention_sinks``) and ``temperature`` (``attention_temperature``) filled in where it
    says None.

    The span is one decision: a kind that sets ``window`` or ``chunk`` replaces the model's
    window; otherwise it has the model's. ``kind.positional_options`` must already be the
    dataclass (`check_kind` makes it so).
    """
    if kind.window is None and kind.chunk is None:
        span = {"window": window, "chunk": None}
    else:
        span = {"window": kind.window, "chunk": kind.chunk}
    if kind.positional is None:
        name = positional
        options = positional_options if kind.positional_options is None else kind.positional_options
    else:
        name = kind.positional
        options = kind.positional_options
        if options is None:
            options = registry.get_positional_encoding(name).options()
    return ResolvedLayer(
        positional=name,
        positional_options=options,
        sinks=sinks if kind.sinks is None else kind.sinks,
        temperature=temperature if kind.temperature is None else kind.temperature,
        **span,
    )


def check_kind(
    kind: Any, index: int, *, positional: str, dims: ModelDims, path: str = PATTERN_PATH
) -> LayerKind:
    """``kind`` (a `LayerKind` or a mapping of its fields) checked and normalised: its
    options as the dataclass of the encoding it resolves to. Errors (`ConfigError`) name
    ``ModelConfig.layer_pattern[i].<field>``; ``positional`` is the model's encoding."""
    where = f"{path}[{index}]"
    if isinstance(kind, Mapping):
        kind = dict(kind.items())
        known = [f.name for f in dataclasses.fields(LayerKind)]
        unknown = sorted(set(kind) - set(known))
        if unknown:
            raise ConfigError(f"{where} has no field(s) {unknown}; allowed fields: {known}")
        kind = LayerKind(**kind)
    if not isinstance(kind, LayerKind):
        fail(where, kind, "must be a LayerKind or a mapping of its fields")
    for field in ("window", "chunk"):
        value = getattr(kind, field)
        if value is not None:
            check_positive_int(f"{where}.{field}", value, error=ConfigError)
    if kind.window is not None and kind.chunk is not None:
        fail(
            f"{where}.chunk",
            kind.chunk,
            f"give a window (={kind.window}) or a chunk, not both: a layer's attention is "
            "sliding-window or block-local",
        )
    if not isinstance(kind.name, str):
        fail(f"{where}.name", kind.name, "must be a string")
    if kind.sinks is not None and not isinstance(kind.sinks, bool):
        fail(f"{where}.sinks", kind.sinks, "must be a bool or None (None: the model's)")
    if kind.temperature is not None and kind.temperature not in TEMPERATURES:
        fail(
            f"{where}.temperature",
            kind.temperature,
            f"allowed: None (the model's) or one of {list(TEMPERATURES)}",
        )
    name = positional if kind.positional is None else kind.positional
    try:
        spec = registry.get_positional_encoding(name)
    except ValueError:
        fail(
            f"{where}.positional",
            kind.positional,
            f"allowed: None (the model's) or one of {list(registry.positional_encoding_names())}",
        )
    if kind.positional is not None and spec.hook == "add":
        fail(
            f"{where}.positional",
            kind.positional,
            "an encoding with hook 'add' adds to the token embeddings once per stack, not per "
            "layer: set it as ModelConfig.positional instead",
        )
    options = kind.positional_options
    if options is not None or kind.positional is not None:
        opt_path = f"{where}.positional_options"
        try:
            options = spec.make_options(options, path=opt_path)
            spec.validate(dims, options, path=opt_path)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return dataclasses.replace(kind, positional_options=options)


def check_pattern(
    pattern: Any, *, positional: str, dims: ModelDims, hook: str
) -> tuple[LayerKind, ...]:
    """``pattern`` as a tuple of checked `LayerKind` s (`check_kind`). ``hook`` is the model
    encoding's: when it adds to the embeddings ("add"), every layer sees those positions, so
    no kind may name another encoding (that would add one silently)."""
    if isinstance(pattern, str | bytes | Mapping) or not isinstance(pattern, Sequence):
        fail(PATTERN_PATH, pattern, "must be a tuple of LayerKind (or of mappings of its fields)")
    kinds = tuple(check_kind(k, i, positional=positional, dims=dims) for i, k in enumerate(pattern))
    if hook == "add":
        for i, kind in enumerate(kinds):
            if kind.positional is not None or kind.positional_options is not None:
                field = "positional" if kind.positional is not None else "positional_options"
                fail(
                    f"{PATTERN_PATH}[{i}].{field}",
                    getattr(kind, field),
                    f"ModelConfig.positional={positional!r} adds positions to the embeddings "
                    "that every layer sees; per-layer encodings need a model-wide encoding "
                    "that acts inside attention (e.g. positional='rope' or 'none')",
                )
    return kinds


# LayerKind fields added after patterns were recorded: left out of `kind_dict` while None,
# so a pattern without them keeps its recorded dict (a run's identity, its rows' settings)
OPTIONAL_KIND_FIELDS = ("sinks", "temperature")


def kind_dict(kind: LayerKind) -> dict[str, Any]:
    """``kind`` as a plain dict (``dataclasses.asdict``) without the `OPTIONAL_KIND_FIELDS`
    that are None; `check_kind` reads it back to an equal kind."""
    out = dataclasses.asdict(kind)
    for name in OPTIONAL_KIND_FIELDS:
        if out[name] is None:
            del out[name]
    return out


def pattern_name(pattern: Sequence[LayerKind]) -> str:
    """What results rows call a pattern: the shared prefix of its kinds' names before the
    first ``"."`` (``"gemma3"``), or ``"[...]"`` listing each kind: its name, or its
    encoding and span (``"[rope/w16,none]"``, ``"global"`` for a kind that changes nothing)."""
    prefixes = {k.name.split(".", 1)[0] for k in pattern}
    if len(prefixes) == 1 and all(k.name for k in pattern):
        return prefixes.pop()

    def token(kind: LayerKind) -> str:
        if kind.name:
            return kind.name
        parts = [] if kind.positional is None else [kind.positional]
        if kind.window is not None:
            parts.append(f"w{kind.window}")
        if kind.chunk is not None:
            parts.append(f"c{kind.chunk}")
        return "/".join(parts) or "global"

    return "[" + ",".join(token(k) for k in pattern) + "]"


# ------------------------------------------------------------------------- named patterns


def _rope(base: float, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"base": float(base)} | dict(options or {})


def gemma3(
    window: int,
    *,
    local_base: float = 1e4,
    global_base: float = 1e6,
    local_per_global: int = 5,
    global_options: Mapping[str, Any] | None = None,
) -> tuple[LayerKind, ...]:
    """Gemma 3: ``local_per_global`` sliding-window RoPE layers (window W, base
    ``local_base``) then one global RoPE layer (base ``global_base``; ``global_options``
    adds RoPE options to it, e.g. a scaling, which Gemma 3 applies to its global layers
    only).

    Source: Gemma Team 2025, "Gemma 3 Technical Report" (arXiv 2503.19786), "Model
    Architecture" (5:1 interleaving, window 1024, bases 10k / 1M); transformers
    ``Gemma3TextConfig``
    (``layer_types``: layer i slides unless ``(i + 1) % sliding_window_pattern == 0``,
    ``rope_local_base_freq``, ``rope_theta``; Gemma 3 270M: window 512).
    """
    window = check_positive_int("window", window)
    n = check_positive_int("local_per_global", local_per_global)
    local = LayerKind(
        window=window, positional="rope", positional_options=_rope(local_base), name="gemma3.local"
    )
    full = LayerKind(
        positional="rope",
        positional_options=_rope(global_base, global_options),
        name="gemma3.global",
    )
    return (local,) * n + (full,)


def cohere2(window: int, *, ratio: int = 3) -> tuple[LayerKind, ...]:
    """Cohere2 / Command A: ``ratio`` sliding-window layers with the model's encoding
    (RoPE) then one global layer without positions (NoPE).

    Source: transformers ``Cohere2Config`` (``sliding_window_pattern=4``: layer i slides
    unless ``(i + 1) % 4 == 0``) and ``Cohere2Attention`` (RoPE only where
    ``sliding_window`` is set); Cohere 2025, "Command A" technical report (3:1 interleaving).
    """
    window = check_positive_int("window", window)
    n = check_positive_int("ratio", ratio)
    local = LayerKind(window=window, name="cohere2.local")
    return (local,) * n + (LayerKind(positional="none", name="cohere2.global"),)


def llama4_irope(chunk: int, *, nope_interval: int = 4) -> tuple[LayerKind, ...]:
    """Llama 4's iRoPE: ``nope_interval - 1`` layers with the model's encoding (RoPE) and
    block-local attention in chunks of C, then one global layer without positions.

    Source: transformers ``Llama4TextConfig`` (``no_rope_layers``: layer i uses RoPE unless
    ``(i + 1) % no_rope_layer_interval == 0``; RoPE layers are ``chunked_attention`` with
    ``attention_chunk_size`` 8192) and ``Llama4TextAttention``; maxtext
    ``nope_layer_interval``. Llama 4 also scales the NoPE layers' queries with the position
    (``attn_temperature_tuning``), which is not part of this pattern.
    """
    chunk = check_positive_int("chunk", chunk)
    n = check_positive_int("nope_interval", nope_interval)
    if n < 2:
        fail("nope_interval", nope_interval, "must be >= 2 (one NoPE layer per interval)")
    local = LayerKind(chunk=chunk, name="llama4_irope.chunked")
    return (local,) * (n - 1) + (LayerKind(positional="none", name="llama4_irope.nope"),)


def gpt_oss(window: int = 128, *, sinks: bool | None = None) -> tuple[LayerKind, ...]:
    """gpt-oss: sliding-window layers (128 tokens) alternating with global layers, both
    with the model's encoding (RoPE with YaRN there); ``sinks=True`` gives every layer its
    learned attention sinks as gpt-oss has (None: ``ModelConfig.attention_sinks``).

    Source: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925;
    alternating banded window of 128 tokens and dense layers, a learned sink logit per
    head); transformers ``GptOssConfig`` (``layer_types``: layer i slides when ``(i + 1) %
    2``) and ``GptOssAttention.sinks``.
    """
    window = check_positive_int("window", window)
    if sinks is not None and not isinstance(sinks, bool):
        fail("sinks", sinks, "must be a bool or None (None: the model's)")
    return (
        LayerKind(window=window, name="gpt_oss.sliding", sinks=sinks),
        LayerKind(name="gpt_oss.full", sinks=sinks),
    )


def swan(window: int, *, local_per_global: int = 3) -> tuple[LayerKind, ...]:
    """SWAN-GPT: sliding-window layers with the model's encoding (SWA-RoPE) interleaved with
    global layers without positions (NoPE); here ``local_per_global`` sliding layers then
    one global layer.

    Source: Puvvada et al. 2025, "SWAN-GPT: An Efficient and Scalable Approach for
    Long-Context Language Modeling" (arXiv 2504.08719). Its inference-time scaling of the
    attention logits is not part of the pattern; the ratio and order are parameters.
    """
    window = check_positive_int("window", window)
    n = check_positive_int("local_per_global", local_per_global)
    local = LayerKind(window=window, name="swan.local")
    return (local,) * n + (LayerKind(positional="none", name="swan.global"),)


PATTERNS = {
    "gemma3": gemma3,
    "cohere2": cohere2,
    "llama4_irope": llama4_irope,
    "gpt_oss": gpt_oss,
    "swan": swan,
}


def cycle(pattern: Sequence[Any], num_layers: int) -> tuple[Any, ...]:
    """``pattern[i % len(pattern)]`` for layers ``i = 0..num_layers-1`` (empty pattern: ())."""
    if not pattern:
        return ()
    if not is_int(num_layers) or num_layers < 0:
        fail("num_layers", num_layers, "must be an int >= 0")
    return tuple(pattern[i % len(pattern)] for i in range(num_layers))
