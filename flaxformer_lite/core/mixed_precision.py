"""Dense layers: float32 accumulation in low precision, fast float32 kernel gradients (pure).

``dense(x, kernel, bias)`` computes ``x @ kernel + bias`` for ``x`` in bfloat16 (or float16)
and float32 parameters the way mixed-precision training wants it (Micikevicius et al. 2018,
"Mixed Precision Training"):

* every matmul takes low-precision operands and accumulates in float32
  (``preferred_element_type=float32``), in the forward pass and in both backward products;
* the bias is added in float32 before the result is rounded to ``x.dtype``;
* the kernel and bias gradients are float32 sums, never rounded to bfloat16.

Why not ``nnx.Linear(dtype=bfloat16)``: it casts the kernel and computes
``bf16 x bf16 -> bf16`` products. On XLA:CPU that output type takes a slow path (the
product runs at float32 speed or worse, while ``bf16 x bf16 -> f32`` uses the CPU's bf16
instructions where it has them), the backward products see float32 cotangents and fall back
to float32, and the bf16 bias-gradient sums are lowered to slow windowed reductions
(docs/performance.md §Dense layers).

Float32 ``x`` goes through the same custom gradient for one reason, the kernel gradient
``dW = xᵀ g`` (Rumelhart et al. 1986): plain autodiff of ``x @ kernel`` writes it as a product
whose result is ``[d_out, d_in]`` followed by a transpose, and XLA:CPU lays that out by copying
``g`` into a transposed buffer and running Eigen's slowest form of the product (both operands
transposed). Here the leading axes are flattened and ``dW`` is one 2-D product contracting the
first axis of both operands with the result already ``[d_in, d_out]``: no copy of ``g``
(docs/performance.md §Dense layers). On CPU a layer with ``d_in > d_out`` takes the product
the other way round and transposes its small result (`_kernel_gradient`). The forward
pass and ``dx`` are the same operations as autodiff's; ``dW`` sums the same products in another
order, so float32 training is not bit-identical to the plain product's (differences ~1e-6
after a few steps). Low precision keeps the form below: there the 2-D form is slower, as XLA
then cannot hand the product to YNNPACK.

Shapes: ``x`` ``[..., d_in]``, ``kernel`` ``[d_in, d_out]``, ``bias`` ``[d_out]`` or None;
returns ``[..., d_out]`` in ``x.dtype``. For float32 ``x`` the value is exactly
``x @ kernel + bias``.
"""

from __future__ import annotations

from collections.abc import Callable

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
    if x.dtype == jnp.float32:
        dkernel = _kernel_gradient(x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]))
    else:
        dims = ((lead, lead), ((), ()))
        dkernel = jax.lax.dot_general(x, g, dims, preferred_element_type=jnp.float32)
    dkernel = dkernel.astype(kernel.dtype)
    dbias = None
    if bias is not None:
        dbias = jnp.sum(g.astype(jnp.float32), axis=lead).astype(bias.dtype)
    return dx, dkernel, dbias


_dense.defvjp(_dense_fwd, _dense_bwd)


def _kernel_gradient(x2: Array, g2: Array) -> Array:
    """``x2ᵀ g2`` for ``x2`` ``[n, d_in]`` and ``g2`` ``[n, d_out]``: ``[d_in, d_out]`` float32,
    one product contracting the first axis of both.

    On CPU, when ``d_in > d_out`` (a feed-forward output layer), it is computed as
    ``(g2ᵀ x2)ᵀ``: Eigen runs this transposed-operand product faster with the narrower operand
    on the left, with equal results (docs/performance.md §Dense layers). The optimization
    barrier keeps XLA's algebraic simplifier from folding the transpose back into the
    product. Elsewhere (GPU, TPU) the BLAS takes any operand order and the plain product is
    kept.
    """
    dims = (((0,), (0,)), ((), ()))

    def plain(x2, g2):
        return jax.lax.dot_general(x2, g2, dims, preferred_element_type=jnp.float32)

    if x2.shape[1] <= g2.shape[1]:
        return plain(x2, g2)

    def swapped(x2, g2):
        return jax.lax.optimization_barrier(plain(g2, x2)).T

    return jax.lax.platform_dependent(x2, g2, cpu=swapped, default=plain)


def dense(x: Array, kernel: Array, bias: Array | None = None) -> Array:
    """``x @ kernel + bias`` with float32 accumulation; see the module docstring."""
    if x.ndim < 1 or kernel.ndim != 2 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"dense needs x [..., d_in] and kernel [d_in, d_out]; got {x.shape}, {kernel.shape}"
        )
    if bias is not None and bias.shape != kernel.shape[1:]:
        raise ValueError(f"bias shape {bias.shape} does not match kernel {kernel.shape}")
    return _dense(x, kernel, bias)


def is_low_precision(dtype) -> bool:
    """True for floating dtypes narrower than float32 (bfloat16, float16, float8 ...)."""
    return bool(jnp.issubdtype(dtype, jnp.floating)) and jnp.dtype(dtype).itemsize < 4


def elementwise_in_float32(fn: Callable[[Array], Array], x: Array) -> Array:
    """``fn(x)`` evaluated in float32 and rounded to ``x.dtype`` once; for float32 (or wider)
    ``x`` just ``fn(x)``.

    For a bfloat16 / float16 activation such as GELU's chain of multiplies, adds and a tanh:
    XLA:CPU evaluates it in the low precision op by op, rounding after each, which is both
    less accurate and slower than one pass in float32 (docs/performance.md §Dense layers).
    On accelerators the float32 chain costs the same inside one fused kernel. Gradients flow
    through the casts (float32 inside, ``x.dtype`` outside).
    """
    if not is_low_precision(x.dtype):
        return fn(x)
    return fn(x.astype(jnp.float32)).astype(x.dtype)
