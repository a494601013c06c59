"""Dense layers in low precision with float32 accumulation, forward and backward (pure, no Flax).

``dense(x, kernel, bias)`` computes ``x @ kernel + bias`` for ``x`` in bfloat16 (or float16)
and float32 parameters the way mixed-precision training wants it (Micikevicius et al. 2018,
"Mixed Precision Training"):

* every matmul takes low-precision operands and accumulates in float32
  (``preferred_element_type=float32``), in the forward pass and in both backward products;
* the bias is added in float32 before the result is rounded to ``x.dtype``;
* the kernel and bias gradients are float32 sums, never rounded to bfloat16.

Why not ``nnx.Linear(dtype=bfloat16)``: it casts the kernel and computes
``bf16 x bf16 -> bf16`` products. On XLA:CPU that output type takes a slow path (the
product runs at float32 speed or worse; ``bf16 x bf16 -> f32`` runs about twice as fast as
float32 on CPUs with AVX512-BF16), the backward products see float32 cotangents and fall back
to float32, and the bf16 bias-gradient sums are lowered to slow windowed reductions. The
reference model of docs/benchmarks.md trains about 1.6x faster with this function than with
the plain cast (docs/performance.md).

Shapes: ``x`` ``[..., d_in]``, ``kernel`` ``[d_in, d_out]``, ``bias`` ``[d_out]`` or None;
returns ``[..., d_out]`` in ``x.dtype``. For float32 ``x`` it is exactly ``x @ kernel + bias``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _product(x: Array, kernel: Array) -> Array:
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    return jax.lax.dot_general(x, kernel.astype(x.dtype), dims, preferred_element_type=jnp.float32)


def _forward(x: Array, kernel: Array, bias: Array | None) -> Array:
    y = _product(x, kernel)
    if bias is not None:
        y = y + _expand(bias.astype(jnp.float32), y.ndim)
    return y.astype(x.dtype)


def _expand(bias: Array, ndim: int) -> Array:
    return bias.reshape((1,) * (ndim - 1) + bias.shape)


@jax.custom_vjp
def _dense(x: Array, kernel: Array, bias: Array | None) -> Array:
    return _forward(x, kernel, bias)


def _dense_fwd(x, kernel, bias):
    return _forward(x, kernel, bias), (x, kernel, bias)


def _dense_bwd(res, g):
    x, kernel, bias = res
    g = g.astype(x.dtype)
    dx = jax.lax.dot_general(
        g,
        kernel.astype(x.dtype),
        (((g.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    ).astype(x.dtype)
    lead = tuple(range(x.ndim - 1))
    dkernel = jax.lax.dot_general(
        x, g, ((lead, lead), ((), ())), preferred_element_type=jnp.float32
    ).astype(kernel.dtype)
    dbias = None
    if bias is not None:
        dbias = jnp.sum(g.astype(jnp.float32), axis=lead).astype(bias.dtype)
    return dx, dkernel, dbias


_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x: Array, kernel: Array, bias: Array | None = None) -> Array:
    """``x @ kernel + bias`` with float32 accumulation; see the module docstring."""
    if x.ndim < 1 or kernel.ndim != 2 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"dense needs x [..., d_in] and kernel [d_in, d_out]; got {x.shape}, {kernel.shape}"
        )
    if bias is not None and bias.shape != kernel.shape[1:]:
        raise ValueError(f"bias shape {bias.shape} does not match kernel {kernel.shape}")
    if x.dtype == jnp.float32:
        y = jnp.dot(x, kernel.astype(jnp.float32))
        return y if bias is None else y + _expand(bias.astype(jnp.float32), y.ndim)
    return _dense(x, kernel, bias)
