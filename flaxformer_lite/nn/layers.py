"""Thin Flax NNX layers over the pure core: embeddings, attention, feed-forward, blocks.

Shapes: token ids ``[batch, length]``; activations ``[batch, length, d_model]``; positions
int ``[batch, length]`` or ``[length]`` (shared by the batch). Parameters carry logical axis
names in their ``logical_axes`` metadata (``vocab``, ``embed``, ``heads``, ``mlp``,
``position``) for sharding.

Blocks follow Vaswani et al. 2017, §3.1: every sub-layer is wrapped in a residual
connection and layer normalisation ("Add & Norm"), post-LN ``LN(x + Dropout(f(x)))`` as in
the paper, or pre-LN ``x + Dropout(f(LN(x)))`` (Xiong et al. 2020) as an option.

The options of pretrained families (`ModelConfig`): RMSNorm (Zhang & Sennrich 2019) instead
of LayerNorm, exact-erf GELU or SiLU, a gated feed-forward (Shazeer 2020), grouped-query
attention (Ainslie et al. 2023: ``num_kv_heads`` key/value heads, query head ``h`` uses
key/value head ``h // (num_heads / num_kv_heads)`` as HF transformers' ``repeat_kv``),
per-projection biases, and the parallel residual ``x + attn(norm1 x) + ffn(norm2 x)`` of
GPT-J / GPT-NeoX. Gemma 3's: Gemma's RMSNorm ``x / sqrt(mean(x^2) + eps) * (1 + w)``
(`OffsetRMSNorm`), query / key norms over ``head_dim``, "sandwich" norms around each
sub-layer, the attention scale ``query_pre_attn_scalar ** -0.5`` and a head width other than
``d_model / num_heads``.

Each decoder layer has its own attention span and encoding (`ModelConfig.layer_kinds`): a
`MultiHeadAttention` built for a `schedules.ResolvedLayer` applies its sliding window or
chunk in the full pass and caches its keys in a ring buffer of that many slots.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.core import attention, forgetting, kv_cache, mixed_precision, temperature
from flaxformer_lite.core.kv_cache import CrossKVCache, KVCache
from flaxformer_lite.core.positions import as_batched_positions
from flaxformer_lite.nn.encodings.base import PositionalEncoding
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.schedules import ResolvedLayer

Array = jax.Array


class _Dense(nnx.Linear):
    """``nnx.Linear`` (same parameters and metadata) computed by `mixed_precision.dense`.

    Float32 compute: the same forward value as ``nnx.Linear``; the kernel gradient is one 2-D
    product XLA:CPU runs without transposing copies, so the training step is faster
    (docs/performance.md §Dense layers).
    Lower precision: fast ``bf16 x bf16 -> f32`` products forward and backward, float32 bias
    add and parameter gradients. ``nnx.Linear`` itself runs only when asked for an
    ``out_sharding`` or when no compute dtype is set (it then follows the input's).
    """

    def __call__(self, inputs: Array, out_sharding=None) -> Array:
        if self.dtype is None or out_sharding is not None or jnp.dtype(self.dtype).itemsize > 4:
            return super().__call__(inputs, out_sharding)
        bias = None if self.bias is None else self.bias[...]
        return mixed_precision.dense(inputs.astype(self.dtype), self.kernel[...], bias)


def _dense(
    cfg: ModelConfig,
    d_in: int,
    d_out: int,
    axes: tuple[str, str],
    *,
    use_bias: bool | None = None,
    rngs: nnx.Rngs,
) -> nnx.Linear:
    """A `_Dense` ``[d_in, d_out]`` with logical ``axes``; ``use_bias`` None: ``cfg.use_bias``."""
    return _Dense(
        d_in,
        d_out,
        use_bias=cfg.use_bias if use_bias is None else use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        kernel_metadata={"logical_axes": axes},
        bias_metadata={"logical_axes": axes[1:]},
        rngs=rngs,
    )


class OffsetRMSNorm(nnx.Module):
    """Gemma's RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (1 + scale)``,
    computed in float32 and cast to the compute dtype, ``scale`` ``[dim]`` initialised to 0
    (so the norm starts as a plain RMS normalisation).

    Reference: transformers ``Gemma3RMSNorm`` (``models/gemma3/modeling_gemma3.py``), which
    computes ``x.float()`` and multiplies by ``1.0 + weight.float()`` before casting back.
    """

    def __init__(self, dim: int, *, epsilon: float, dtype, param_dtype, axis: str, rngs: nnx.Rngs):
        del rngs
        self.epsilon = float(epsilon)
        self.dtype = dtype
        self.scale = nnx.Param(jnp.zeros((dim,), param_dtype), logical_axes=(axis,))

    def __call__(self, x: Array) -> Array:
        """``[..., dim]`` -> ``[..., dim]`` in the compute dtype."""
        x_f32 = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(x_f32), axis=-1, keepdims=True)
        y_f32 = x_f32 * jax.lax.rsqrt(mean_square + jnp.float32(self.epsilon))
        scale_f32 = 1.0 + self.scale[...].astype(jnp.float32)
        y_f32 = y_f32 * scale_f32.reshape((1,) * (x.ndim - 1) + scale_f32.shape)
        return y_f32.astype(self.dtype)


def _norm(
    cfg: ModelConfig, *, rngs: nnx.Rngs, dim: int | None = None, axis: str = "embed"
) -> nnx.Module:
    """The model's norm over ``dim`` (default ``d_model``; ``cfg.norm_type``,
    ``cfg.norm_epsilon``), its parameters named with the logical ``axis``.

    "layer": LayerNorm (Ba et al. 2016), ``(x - mean) / sqrt(var + eps) * scale + bias``,
    without the bias when ``cfg.norm_bias`` is False (MPT). "rms": RMSNorm (Zhang & Sennrich
    2019; Llama), ``x / sqrt(mean(x^2) + eps) * scale``, which has no bias. "gemma_rms":
    `OffsetRMSNorm`. Parameters ``scale`` (and ``bias``) ``[dim]``.
    """
    dim = cfg.d_model if dim is None else dim
    if cfg.norm_type == "gemma_rms":
        return OffsetRMSNorm(
            dim,
            epsilon=cfg.norm_epsilon,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype,
            axis=axis,
            rngs=rngs,
        )
    common = {
        "epsilon": cfg.norm_epsilon,
        "dtype": cfg.compute_dtype,
        "param_dtype": cfg.params_dtype,
        "scale_metadata": {"logical_axes": (axis,)},
        "rngs": rngs,
    }
    if cfg.norm_type == "rms":
        return nnx.RMSNorm(dim, **common)
    return nnx.LayerNorm(
        dim,
        use_bias=cfg.norm_bias,
        bias_metadata={"logical_axes": (axis,)},
        **common,
    )


# "gelu" is the tanh approximation (jax.nn.gelu's default; HF "gelu_new"), "gelu_exact" the
# erf form x * Phi(x) (Hendrycks & Gimpel 2016; HF "gelu"), "silu" x * sigmoid(x)
ACTIVATION_FNS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "silu": jax.nn.silu,
}


class TokenEmbedding(nnx.Module):
    """Token ids -> vectors, optionally scaled by sqrt(d_model) (paper §3.4), and back.

    ``decode`` gives float32 logits ``[batch, length, vocab]`` through the transposed table
    (weight tying, Press & Wolf 2017) when ``cfg.tie_embeddings``, else a separate head.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.scale = cfg.d_model**0.5 if cfg.scale_embeddings else 1.0
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype,
            embedding_init=nnx.initializers.normal(stddev=cfg.d_model**-0.5),
            embedding_metadata={"logical_axes": ("vocab", "embed")},
            rngs=rngs,
        )
        self.head = (
            None
            if cfg.tie_embeddings
            else _dense(
                cfg,
                cfg.d_model,
                cfg.vocab_size,
                ("embed", "vocab"),
                use_bias=cfg.bias_of("head"),
                rngs=rngs,
            )
        )

    def encode(self, tokens: Array) -> Array:
        """``[batch, length]`` int -> ``[batch, length, d_model]`` in the compute dtype."""
        x_BTD = self.embed(tokens)
        return x_BTD * jnp.asarray(self.scale, x_BTD.dtype)

    def decode(self, x: Array) -> Array:
        """``[batch, length, d_model]`` -> float32 logits ``[batch, length, vocab]``."""
        if self.head is None and x.dtype != jnp.float32:
            # Tied logits of a low-precision model: low-precision operands, float32
            # accumulation and result (what the loss wants), contracting the table's embedding
            # axis in place: XLA:CPU runs this form on the CPU's bf16 instructions, twice the
            # rate of a float32 product, while ``x @ table.T`` first copies the transposed
            # table and runs at float32 speed (docs/performance.md, "Evaluating long windows").
            table_VD = self.embed.embedding[...].astype(x.dtype)
            return jax.lax.dot_general(
                x, table_VD, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )
        logits_BTV = self.embed.attend(x) if self.head is None else self.head(x)
        return logits_BTV.astype(jnp.float32)


class _Prepared(NamedTuple):
    """One attention call's inputs after projection and the positional hooks."""

    q_BTNH: Array
    k_BSKH: Array
    v_BSKH: Array
    q_positions: Array
    kv_positions: Array
    bias_fn: Callable | None
    window: int | None
    chunk: int | None
    forget_prefix: tuple[Array, Array] | None = None  # FoX: (c_q, c_k) [batch, len, heads]
    keep_first: int | None = None  # StreamingLLM's first keys (with a window)


class MultiHeadAttention(nnx.Module):
    """Multi-head attention (paper §3.2.2): project, split heads, attend, merge, project.

    Self-attention when ``kv`` is None, cross-attention otherwise. The positional encoding
    (if any) rotates q/k or supplies a logit bias; the attention itself is the pure
    `attention.attend`.

    With ``cfg.num_kv_heads`` = KV < H (grouped-query attention, Ainslie et al. 2023; KV = 1
    is multi-query attention, Shazeer 2019) the key and value projections have ``KV *
    head_dim`` outputs, caches hold KV heads, and `attention.attend` shares each key/value
    head among ``H / KV`` consecutive query heads.

    ``layer`` (a decoder layer's `schedules.ResolvedLayer`) gives causal self-attention its
    sliding window or chunk; without it, ``cfg.attention_window``. ``cfg.qk_norm`` adds
    ``q_norm`` / ``k_norm`` over ``head_dim`` (after the projection, before the rotate hook,
    as Gemma 3); ``cfg.query_pre_attn_scalar`` sets the logit scale.

    ``sinks`` (``layer.sinks`` for a decoder layer): a learned logit ``s_h`` per query head,
    ``sinks`` ``[heads]`` initialised to 0, joins every softmax row as one more column that
    carries no value (gpt-oss; OpenAI 2025, arXiv 2508.10925; transformers
    ``GptOssAttention.sinks``): ``p_ij = exp(l_ij) / (exp(s_h) + sum_j' exp(l_ij'))``. Every
    attention implementation and the cached path honour it (`core.attention.attend`).

    ``layer.temperature`` multiplies each query, after the rotate hook, by a factor of its
    position (`core.temperature`; the keys and the cache are untouched): ``"logn"``
    ``max(1, log(p + 1) / log L)`` (Qwen), ``"llama4"`` ``log(floor((p + 1) / f) + 1) * a +
    1`` (Llama 4), ``"ssmax"`` ``s_h log n`` with ``n`` the keys the query sees (``min(p + 1,
    W)`` with a window; positions counted from 0) and ``ssmax_s`` ``[heads]`` learned,
    initialised to ``1 / log L`` (Scalable-Softmax, arXiv 2501.19399). ``L`` is
    ``cfg.temperature_length``.

    A forget-hook encoding (FoX) sees the layer's input: ``pe.log_forget(x)`` gives log
    forget gates ``[batch, length, heads]``, their prefix sums ``c`` go to
    `core.attention.attend` as ``forget_prefix`` (logit ``(i, j)`` gets ``c_i - c_j``, per
    block in the chunked path), and the KV cache keeps ``c`` per key (``forget_heads``).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        layer: ResolvedLayer | None = None,
        sinks: bool = False,
        rngs: nnx.Rngs,
    ):
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.implementation = cfg.attention_impl
        self.chunked_threshold = cfg.chunked_threshold
        # causal self-attention only: a sliding window W or a chunk C (at most one)
        self.window = cfg.attention_window if layer is None else layer.window
        self.chunk = None if layer is None else layer.chunk
        # StreamingLLM's first keys, beside a window only
        self.keep_first = None if self.window is None else cfg.attention_keep_first
        scalar = cfg.query_pre_attn_scalar
        self.scale = None if scalar is None else float(scalar) ** -0.5  # None: head_dim^-0.5
        d, hd, kvd = cfg.d_model, cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        qkv_bias, out_bias = cfg.bias_of("qkv"), cfg.bias_of("out")
        self.query = _dense(cfg, d, hd, ("embed", "heads"), use_bias=qkv_bias, rngs=rngs)
        self.key = _dense(cfg, d, kvd, ("embed", "heads"), use_bias=qkv_bias, rngs=rngs)
        self.value = _dense(cfg, d, kvd, ("embed", "heads"), use_bias=qkv_bias, rngs=rngs)
        self.out = _dense(cfg, hd, d, ("heads", "embed"), use_bias=out_bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = _norm(cfg, dim=cfg.head_dim, axis="head_dim", rngs=rngs)
            self.k_norm = _norm(cfg, dim=cfg.head_dim, axis="head_dim", rngs=rngs)
        else:
            self.q_norm = self.k_norm = None
        self.temperature = "none" if layer is None else layer.temperature
        self.temperature_length = cfg.temperature_length
        self.floor_scale = cfg.temperature_floor_scale
        self.attn_scale = cfg.temperature_attn_scale
        if self.temperature in ("logn", "ssmax") and cfg.temperature_length is None:
            raise ValueError(
                f"ModelConfig.temperature_length=None: attention_temperature "
                f"{self.temperature!r} needs the training length L (log L); set it, or build "
                "the model from a RunConfig, which fills it with data.train_length"
            )
        self.ssmax_s = (  # SSMax's s_h, initialised to 1 / log L
            nnx.Param(
                jnp.full((cfg.num_heads,), 1 / math.log(cfg.temperature_length), cfg.params_dtype),
                logical_axes=("heads",),
            )
            if self.temperature == "ssmax"
            else None
        )
        # FoX keeps the prefix sums of its log forget gates per cached key
        forgets = layer is not None and layer.encoding.hook == "forget"
        self.forget_heads = cfg.num_heads if forgets else None
        if layer is not None:
            sinks = layer.sinks
        self.sinks = (
            nnx.Param(jnp.zeros((cfg.num_heads,), cfg.params_dtype), logical_axes=("heads",))
            if sinks
            else None
        )

    @property
    def span(self) -> int | None:
        """The most recent positions causal self-attention sees (window W or chunk C), None
        for global attention: its KV cache is a ring buffer of that many slots."""
        return self.window if self.window is not None else self.chunk

    def _queries(self, x: Array) -> Array:
        """``[b, l, d_model]`` -> query heads ``[b, l, heads, head_dim]`` (+ ``q_norm``)."""
        q_BTNH = self._split(self.query(x))
        return q_BTNH if self.q_norm is None else self.q_norm(q_BTNH)

    def _keys_values(self, kv: Array) -> tuple[Array, Array]:
        """``[b, s, d_model]`` -> key (+ ``k_norm``) and value heads ``[b, s, kv_heads,
        head_dim]``."""
        k_BSKH = self._split(self.key(kv))
        if self.k_norm is not None:
            k_BSKH = self.k_norm(k_BSKH)
        return k_BSKH, self._split(self.value(kv))

    def _sinks(self) -> Array | None:
        """The sink logits float32 ``[heads]``, or None without sinks."""
        return None if self.sinks is None else self.sinks[...].astype(jnp.float32)

    def _temper(self, q_BTNH: Array, q_positions: Array) -> Array:
        """The queries times the layer's temperature factor at their positions (unchanged
        without one); ``q_positions`` int ``[batch or 1, l]``."""
        if self.temperature == "logn":
            tau = temperature.logn_scale(q_positions, train_length=self.temperature_length)
        elif self.temperature == "llama4":
            tau = temperature.llama4_scale(
                q_positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale
            )
        elif self.temperature == "ssmax":
            tau = temperature.ssmax_scale(
                q_positions, self.ssmax_s[...], window=self.window, keep_first=self.keep_first
            )
        else:
            return q_BTNH
        return temperature.scale_queries(q_BTNH, tau)

    def _split(self, x: Array) -> Array:
        """``[b, l, heads * head_dim]`` -> ``[b, l, heads, head_dim]`` (query or key/value
        heads, from the width)."""
        return x.reshape((*x.shape[:2], x.shape[-1] // self.head_dim, self.head_dim))

    def _merge(self, out_BTNH: Array) -> Array:
        """``[b, l, heads, head_dim]`` -> the output projection ``[b, l, d_model]``."""
        return self.out(out_BTNH.reshape((*out_BTNH.shape[:2], -1)))

    def _prepare(
        self,
        x_BTD: Array,
        kv_BSD: Array | None,
        q_positions: Array,
        kv_positions: Array | None,
        pe: PositionalEncoding | None,
        causal: bool,
    ) -> _Prepared:
        """What `__call__` and `weights` share: positions as int32 ``[batch or 1, len]``
        (from ``[len]`` or ``[batch, len]``; kv defaults to q), the projected heads with the
        rotate hook applied, the bias hook as a function of positions, and the window
        (causal self-attention only)."""
        kv_BSD = x_BTD if kv_BSD is None else kv_BSD
        kv_positions = q_positions if kv_positions is None else kv_positions
        batch = x_BTD.shape[0]
        q_positions = as_batched_positions(
            q_positions, name="q_positions", length=x_BTD.shape[1], batch=batch
        )
        kv_positions = as_batched_positions(
            kv_positions, name="kv_positions", length=kv_BSD.shape[1], batch=batch
        )
        q_BTNH = self._queries(x_BTD)
        k_BSKH, v_BSKH = self._keys_values(kv_BSD)
        if pe is not None:
            q_BTNH, k_BSKH = pe.rotate(q_BTNH, k_BSKH, q_positions, kv_positions)
        q_BTNH = self._temper(q_BTNH, q_positions)
        forget = None
        if pe is not None and pe.hook == "forget":
            c_BTN = forgetting.forget_prefix(pe.log_forget(x_BTD))  # self-attention: kv is x
            forget = (c_BTN, c_BTN)
        return _Prepared(
            q_BTNH,
            k_BSKH,
            v_BSKH,
            q_positions,
            kv_positions,
            bias_fn=self._bias_fn(pe, causal),
            window=self.window if causal else None,
            chunk=self.chunk if causal else None,
            forget_prefix=forget,
            keep_first=self.keep_first if causal else None,
        )

    @staticmethod
    def _bias_fn(pe: PositionalEncoding | None, causal: bool) -> Callable | None:
        if pe is None or pe.hook != "bias":
            return None
        return functools.partial(pe.bias, causal=causal)

    def __call__(
        self,
        x: Array,
        kv: Array | None = None,
        *,
        q_positions: Array,
        kv_positions: Array | None = None,
        pe: PositionalEncoding | None = None,
        mask: Array | None = None,
        causal: bool = False,
    ) -> Array:
        """Attend from ``x`` ``[b, q_len, d]`` to ``kv`` ``[b, kv_len, d]`` (default ``x``).

        Args:
          q_positions / kv_positions: int ``[len]`` or ``[batch, len]`` (kv defaults to q).
          pe: positional encoding applied inside attention (None for cross-attention).
          mask: bool, broadcastable to ``[batch, heads, q_len, kv_len]``; True = attend.
          causal: query i sees only keys j <= i.
        """
        p = self._prepare(x, kv, q_positions, kv_positions, pe, causal)
        out_BTNH = attention.attend(
            p.q_BTNH,
            p.k_BSKH,
            p.v_BSKH,
            q_positions=p.q_positions,
            k_positions=p.kv_positions,
            bias_fn=p.bias_fn,
            mask=mask,
            causal=causal,
            window=p.window,
            chunk=p.chunk,
            scale=self.scale,
            implementation=self.implementation,
            chunked_threshold=self.chunked_threshold,
            sinks=self._sinks(),
            keep_first=p.keep_first,
            forget_prefix=p.forget_prefix,
        )
        return self._merge(out_BTNH)

    def weights(
        self,
        x: Array,
        kv: Array | None = None,
        *,
        q_positions: Array,
        kv_positions: Array | None = None,
        pe: PositionalEncoding | None = None,
        mask: Array | None = None,
        causal: bool = False,
    ) -> Array:
        """Attention probabilities ``[batch, heads, q_len, kv_len]`` (for plots)."""
        p = self._prepare(x, kv, q_positions, kv_positions, pe, causal)
        bias_BNTS = attention.materialised_bias(
            p.q_positions, p.kv_positions, p.bias_fn, p.forget_prefix
        )
        return attention.attention_weights(
            p.q_BTNH,
            p.k_BSKH,
            mask=mask,
            bias=bias_BNTS,
            causal=causal,
            window=p.window,
            chunk=p.chunk,
            scale=self.scale,
            sinks=self._sinks(),
            keep_first=p.keep_first,
        )

    # ------------------------------------------------------------------ cached decoding

    def init_cache(
        self, batch: int, capacity: int, *, positions: Array | None = None, dtype=jnp.float32
    ) -> KVCache:
        """An empty self-attention `KVCache` ``[batch, slots, kv_heads, head_dim]``
        (``kv_heads`` = ``cfg.num_kv_heads`` or ``num_heads``) for ``capacity`` tokens at the
        planned ``positions`` (int ``[batch, capacity]`` or ``[capacity]``): ``slots =
        capacity`` for global attention, ``min(W or C, capacity)`` for a sliding window or
        chunk (a ring buffer, `core.kv_cache.ring_capacity`)."""
        slots = kv_cache.ring_capacity(capacity, self.span)
        positions = kv_cache.slot_positions(batch, capacity, positions)[:, :slots]
        return kv_cache.init_kv_cache(
            batch,
            slots,
            self.num_kv_heads,
            self.head_dim,
            dtype=dtype,
            positions=positions,
            forget_heads=self.forget_heads,
        )

    def decode_step(
        self,
        x: Array,
        positions: Array,
        cache: KVCache,
        *,
        pe: PositionalEncoding | None = None,
    ) -> tuple[Array, KVCache]:
        """Causal self-attention of ``l`` new tokens through a key-value cache.

        Writes the new keys/values into the cache, then attends from the new queries to
        every filled slot whose position is <= the query's; the bias hook gets
        ``pe.bias(positions, cache.positions, causal=True)``. The rotate hook, by the
        encoding's ``caches_rotated_keys``:

        * False (xPos, whose key scale depends on all key positions): keys are cached
          unrotated, and ``pe.rotate`` gets the new queries and the whole cache with their
          positions, the call a full forward pass makes;
        * True (RoPE and its scalings): ``pe.rotate(q, k_new, positions, positions)``
          rotates the new queries and keys, and the rotated keys are cached, as Hugging
          Face transformers' cached generation does. Each key keeps the rotation of the
          step that wrote it; for dynamic NTK past the original length that differs from a
          full forward pass, exactly as in HF.

        Otherwise equal to `__call__` with ``causal=True`` over all tokens written so far
        (see `flaxformer_lite.core.kv_cache`). A layer with a sliding window or chunk keeps a
        ring buffer (`init_cache`): its new queries attend to the ring's keys followed by the
        new keys (`core.kv_cache.visible_mask`), then the new keys overwrite the oldest slots
        (`core.kv_cache.write_ring`), so prefills of any length fit it.

        Args:
          x: ``[batch, l, d_model]`` (``l = prompt length`` to prefill, 1 per step).
          positions: int ``[batch, l]`` or ``[l]``, the tokens' absolute positions.
          cache: this layer's `KVCache` with at least ``l`` free slots.
          pe: the stack's positional encoding (rotate / bias hooks).

        Returns:
          ``([batch, l, d_model], updated cache)``.

        Raises:
          ValueError: the layer keeps StreamingLLM's first keys (``attention_keep_first``),
            which its ring buffer of the last W keys does not hold.
        """
        if self.keep_first is not None:
            raise ValueError(
                f"ModelConfig.attention_keep_first={self.keep_first}: StreamingLLM's first keys "
                "are an evaluation variant of the parallel pass; cached decoding keeps a "
                "windowed layer's last W keys only (set it to None to decode)"
            )
        positions = as_batched_positions(
            positions, name="q_positions", length=x.shape[1], batch=x.shape[0]
        )
        positions = jnp.broadcast_to(positions, x.shape[:2])
        q_BTNH = self._queries(x)
        k_new_BTKH, v_new_BTKH = self._keys_values(x)
        rotate_new = pe is not None and pe.caches_rotated_keys
        if rotate_new:
            q_BTNH, k_new_BTKH = pe.rotate(q_BTNH, k_new_BTKH, positions, positions)
        c_new_BTN = None  # FoX: the new tokens' prefix sums, continued from the cache's
        if pe is not None and pe.hook == "forget":
            c_new_BTN = kv_cache.continue_prefix(cache, pe.log_forget(x))
        if self.span is None:
            cache = kv_cache.write(
                cache, k_new_BTKH, v_new_BTKH, positions, forget_prefix=c_new_BTN
            )
            k_BSKH, v_BSKH = cache.key, cache.value
            k_positions, k_valid = cache.positions, cache.valid
            c_k_BSN = cache.forget_prefix
        else:  # ring buffer: attend over the ring and the new keys, then overwrite the oldest
            dtype = cache.key.dtype
            k_BSKH = jnp.concatenate([cache.key, k_new_BTKH.astype(dtype)], axis=1)
            v_BSKH = jnp.concatenate([cache.value, v_new_BTKH.astype(dtype)], axis=1)
            k_positions = jnp.concatenate([cache.positions, positions.astype(jnp.int32)], axis=1)
            k_valid = jnp.concatenate([cache.valid, jnp.ones(positions.shape, bool)], axis=1)
            c_k_BSN = None
            if c_new_BTN is not None:
                c_k_BSN = jnp.concatenate([cache.forget_prefix, c_new_BTN], axis=1)
            cache = kv_cache.write_ring(
                cache, k_new_BTKH, v_new_BTKH, positions, forget_prefix=c_new_BTN
            )
        if pe is not None and not rotate_new:
            q_BTNH, k_BSKH = pe.rotate(q_BTNH, k_BSKH, positions, k_positions)
        q_BTNH = self._temper(q_BTNH, positions)
        mask_B1TS = kv_cache.visible_mask(
            positions, k_positions, k_valid, window=self.window, chunk=self.chunk
        )
        out_BTNH = attention.attend(
            q_BTNH,
            k_BSKH,
            v_BSKH,
            q_positions=positions,
            k_positions=k_positions,
            bias_fn=self._bias_fn(pe, True),
            mask=mask_B1TS,
            causal=False,  # the causal mask is built from positions above, not from indices
            scale=self.scale,
            implementation=self.implementation,
            chunked_threshold=self.chunked_threshold,
            sinks=self._sinks(),
            forget_prefix=None if c_new_BTN is None else (c_new_BTN, c_k_BSN),
        )
        return self._merge(out_BTNH), cache

    def cross_cache(
        self, kv: Array, kv_positions: Array, kv_valid: Array | None = None
    ) -> CrossKVCache:
        """Project the encoder output ``kv`` ``[batch, s, d_model]`` once for cross-attention.

        ``kv_positions`` int ``[batch, s]`` or ``[s]``; ``kv_valid`` bool ``[batch, s]``
        (default all).
        """
        kv_positions = as_batched_positions(
            kv_positions, name="kv_positions", length=kv.shape[1], batch=kv.shape[0]
        )
        valid = jnp.ones(kv.shape[:2], bool) if kv_valid is None else jnp.asarray(kv_valid, bool)
        key_BSKH, value_BSKH = self._keys_values(kv)
        return CrossKVCache(
            key=key_BSKH,
            value=value_BSKH,
            positions=jnp.broadcast_to(kv_positions, kv.shape[:2]).astype(jnp.int32),
            valid=valid,
        )

    def cross_decode_step(self, x: Array, positions: Array, cache: CrossKVCache) -> Array:
        """Cross-attention of ``x`` ``[batch, l, d_model]`` to cached encoder keys/values.

        Equals `__call__` ``(x, encoded, kv_positions=..., mask=padding_mask(...))`` (no
        positional encoding, as in cross-attention); returns ``[batch, l, d_model]``.
        """
        out_BTNH = attention.attend(
            self._queries(x),
            cache.key,
            cache.value,
            q_positions=positions,
            k_positions=cache.positions,
            mask=cache.valid[:, None, None, :],
            scale=self.scale,
            implementation=self.implementation,
            chunked_threshold=self.chunked_threshold,
        )
        return self._merge(out_BTNH)


class FeedForward(nnx.Module):
    """Position-wise feed-forward ``wo(act(wi x))`` (paper §3.3, ReLU; `ACTIVATION_FNS`).

    Gated (``cfg.ffn_gated``, Shazeer 2020, "GLU Variants Improve Transformer"):
    ``wo(act(wi x) * wu x)``, SwiGLU with "silu" (Llama: ``wi`` = gate_proj, ``wu`` =
    up_proj, ``wo`` = down_proj), GeGLU with a GELU. Kernels ``wi``/``wu`` ``[d_model, d_ff]``,
    ``wo`` ``[d_ff, d_model]``; biases when ``cfg.ffn_bias`` (None: ``use_bias``).

    In a bfloat16 / float16 model the activation is evaluated in float32 and rounded once
    (`mixed_precision.elementwise_in_float32`): more accurate, and on CPU faster than the
    op-by-op low-precision chain.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        bias = cfg.bias_of("ffn")
        self.wi = _dense(cfg, cfg.d_model, cfg.d_ff, ("embed", "mlp"), use_bias=bias, rngs=rngs)
        self.wo = _dense(cfg, cfg.d_ff, cfg.d_model, ("mlp", "embed"), use_bias=bias, rngs=rngs)
        self.wu = (
            _dense(cfg, cfg.d_model, cfg.d_ff, ("embed", "mlp"), use_bias=bias, rngs=rngs)
            if cfg.ffn_gated
            else None
        )
        self.activation = cfg.activation

    def __call__(self, x: Array) -> Array:
        act = ACTIVATION_FNS[self.activation]
        # low-precision compute: the activation in float32, rounded once
        h_BTF = mixed_precision.elementwise_in_float32(act, self.wi(x))
        if self.wu is not None:
            h_BTF = h_BTF * self.wu(x)
        return self.wo(h_BTF)


class AddNorm(nnx.Module):
    """Residual connection + norm around one sub-layer, post-LN or pre-LN (`_norm`).

    With ``cfg.sandwich_norm`` (pre-LN only) a second norm ``post_norm`` normalises the
    sub-layer's output before the residual add, ``x + Dropout(post_norm(f(norm(x))))``
    (Gemma 2/3's ``post_attention_layernorm`` / ``post_feedforward_layernorm``).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.pre = cfg.norm == "pre"
        self.norm = _norm(cfg, rngs=rngs)
        self.post_norm = _norm(cfg, rngs=rngs) if cfg.sandwich_norm else None
        self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=True, rngs=rngs)

    def branch(self, x: Array, sublayer: Callable[[Array], Array], *, deterministic: bool | None):
        """The residual branch of pre-LN alone, ``Dropout(f(norm(x)))`` (parallel residual;
        ``Dropout(post_norm(f(norm(x))))`` with sandwich norms)."""
        y = sublayer(self.norm(x))
        if self.post_norm is not None:
            y = self.post_norm(y)
        return self.dropout(y, deterministic=deterministic)

    def __call__(self, x: Array, sublayer: Callable[[Array], Array], *, deterministic: bool | None):
        if self.pre:
            return x + self.branch(x, sublayer, deterministic=deterministic)
        return self.norm(x + self.dropout(sublayer(x), deterministic=deterministic))


class EncoderBlock(nnx.Module):
    """Bidirectional self-attention then feed-forward, each with Add & Norm (paper Fig. 1)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.residual != "sequential":
            raise ValueError(
                f"ModelConfig.residual={cfg.residual!r}: the parallel residual is defined for "
                "decoder blocks without cross-attention (GPT-NeoX); an EncoderBlock is "
                "sequential"
            )
        self.attention = MultiHeadAttention(cfg, sinks=cfg.attention_sinks, rngs=rngs)
        self.attention_norm = AddNorm(cfg, rngs=rngs)
        self.ffn = FeedForward(cfg, rngs=rngs)
        self.ffn_norm = AddNorm(cfg, rngs=rngs)

    def __call__(
        self,
        x: Array,
        positions: Array,
        *,
        pe: PositionalEncoding,
        mask: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """``x`` ``[b, l, d]``, positions ``[b, l]``, mask ``[b, 1, l, l]`` -> ``[b, l, d]``."""
        attend = lambda h: self.attention(h, q_positions=positions, pe=pe, mask=mask)
        x = self.attention_norm(x, attend, deterministic=deterministic)
        return self.ffn_norm(x, self.ffn, deterministic=deterministic)


class DecoderBlock(nnx.Module):
    """Causal self-attention, optional cross-attention to the encoder, feed-forward.

    ``cfg.residual="parallel"`` (GPT-J; GPT-NeoX / Pythia ``use_parallel_residual``): ``x +
    Dropout(attn(norm1 x)) + Dropout(ffn(norm2 x))``, norm1 = ``self_attention_norm.norm``,
    norm2 = ``ffn_norm.norm``; pre-LN and no cross-attention only.

    ``layer``: this layer's `schedules.ResolvedLayer` (its self-attention's window or
    chunk); when its encoding is built per layer (`EncodingSpec.per_layer`), the block owns
    it as ``pe`` and the stack hands it back to the block's calls.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        cross_attention: bool,
        layer: ResolvedLayer | None = None,
        rngs: nnx.Rngs,
    ):
        self.parallel = cfg.residual == "parallel"
        if self.parallel and cross_attention:
            raise ValueError(
                "ModelConfig.residual='parallel': the parallel residual is defined for "
                "decoder blocks without cross-attention (DecoderOnlyLM); use "
                "residual='sequential' with cross-attention"
            )
        self.self_attention = MultiHeadAttention(cfg, layer=layer, rngs=rngs)
        self.self_attention_norm = AddNorm(cfg, rngs=rngs)
        if layer is not None and layer.encoding.per_layer:
            self.pe = layer.encoding.build_with(cfg.dims, layer.positional_options, rngs=rngs)
        if cross_attention:
            self.cross_attention = MultiHeadAttention(cfg, rngs=rngs)
            self.cross_attention_norm = AddNorm(cfg, rngs=rngs)
        else:
            self.cross_attention = None
            self.cross_attention_norm = None
        self.ffn = FeedForward(cfg, rngs=rngs)
        self.ffn_norm = AddNorm(cfg, rngs=rngs)

    def __call__(
        self,
        x: Array,
        positions: Array,
        *,
        pe: PositionalEncoding,
        mask: Array | None = None,
        encoded: Array | None = None,
        encoded_positions: Array | None = None,
        cross_mask: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """``x`` ``[b, l, d]``; ``encoded`` ``[b, s, d]`` for cross-attention -> ``[b, l, d]``.

        ``mask`` (e.g. padding) is combined with the causal mask; ``cross_mask`` is
        ``[b, 1, l, s]``.
        """
        attend = lambda h: self.self_attention(
            h, q_positions=positions, pe=pe, mask=mask, causal=True
        )
        if self.parallel:
            return self._parallel(x, attend, deterministic)
        x = self.self_attention_norm(x, attend, deterministic=deterministic)
        if self.cross_attention is not None:
            if encoded is None or encoded_positions is None:
                raise ValueError(
                    "this DecoderBlock has cross-attention: pass `encoded` and `encoded_positions`"
                )
            cross = lambda h: self.cross_attention(
                h,
                encoded,
                q_positions=positions,
                kv_positions=encoded_positions,
                mask=cross_mask,
            )
            x = self.cross_attention_norm(x, cross, deterministic=deterministic)
        return self.ffn_norm(x, self.ffn, deterministic=deterministic)

    def decode_step(
        self,
        x: Array,
        positions: Array,
        cache: KVCache,
        *,
        pe: PositionalEncoding,
        cross: CrossKVCache | None = None,
    ) -> tuple[Array, KVCache]:
        """`__call__` for ``l`` new tokens through caches (inference: no dropout).

        ``x`` ``[b, l, d]``, positions int32 ``[b, l]``, ``cache`` this block's self-attention
        `KVCache`, ``cross`` its `CrossKVCache` (required with cross-attention). Returns
        ``([b, l, d], updated cache)``.
        """
        new_cache = cache

        def attend(h: Array) -> Array:
            nonlocal new_cache
            out, new_cache = self.self_attention.decode_step(h, positions, cache, pe=pe)
            return out

        if self.parallel:
            return self._parallel(x, attend, True), new_cache
        x = self.self_attention_norm(x, attend, deterministic=True)
        if self.cross_attention is not None:
            if cross is None:
                raise ValueError("this DecoderBlock has cross-attention: pass `cross`")
            cross_attend = lambda h: self.cross_attention.cross_decode_step(h, positions, cross)
            x = self.cross_attention_norm(x, cross_attend, deterministic=True)
        return self.ffn_norm(x, self.ffn, deterministic=True), new_cache

    def _parallel(
        self, x: Array, attend: Callable[[Array], Array], deterministic: bool | None
    ) -> Array:
        """``x + Dropout(attend(norm1 x)) + Dropout(ffn(norm2 x))`` (GPT-NeoX)."""
        a = self.self_attention_norm.branch(x, attend, deterministic=deterministic)
        f = self.ffn_norm.branch(x, self.ffn, deterministic=deterministic)
        return x + a + f
