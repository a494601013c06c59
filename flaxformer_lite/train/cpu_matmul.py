"""Which library runs the matrix products of a training step on CPU: XLA's default or oneDNN.

XLA:CPU hands a compiled step's products to YNNPACK or Eigen. jaxlib can instead run each
product alone as a oneDNN primitive (oneDNN is the library PyTorch's CPU products use), with
the two compile options of `ONEDNN_PRODUCTS`. The rule: float32 products go to oneDNN on CPU,
because a float32 train step runs faster that way (docs/performance.md §Products on CPU).

A bfloat16 model's products are ``bf16 x bf16 -> f32`` (`flaxformer_lite.core.mixed_precision`)
except its attention core and tied logits, which run in float32 on CPU. Some jaxlibs hand the
mixed products to oneDNN too, as float32 products of converted operands, which is slower than
XLA's own; others leave them to XLA and give oneDNN only the float32 ones, which is faster. So
a bfloat16 model uses oneDNN by default only where `onednn_takes_bf16_products` says this
jaxlib leaves its mixed products alone (it reads the compiled program, not a version number).

Only the *individual* oneDNN mode (``LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``: the product alone,
the element-wise work after it left to XLA) is ever used. The other mode,
``LIBRARY_FUSION_TYPE_DOT``, fuses the element-wise ops that follow a product into its oneDNN
call and has computed ``(x @ w) * 0.3 + 1.0`` as ``x @ w + 1.0``. Because a jaxlib can get a
fused product wrong, this module checks that exact case and three like it on the running
jaxlib before a step is compiled with oneDNN (`onednn_problem`).

``config.train.cpu_matmul`` (`resolve`):

* ``"auto"`` (default): oneDNN when the step runs on CPU, the model computes in float32 (or in
  bfloat16 on a jaxlib whose oneDNN mode leaves ``bf16 x bf16 -> f32`` products to XLA) and
  this jaxlib passes the check; XLA's default otherwise (a failed check is logged once).
* ``"onednn"``: oneDNN on CPU whatever the compute dtype; an error if this jaxlib fails the
  check. Off CPU (GPU, TPU) the options do not apply and XLA's default is used.
* ``"xla"``: XLA's default.

The choice changes float32 rounding of the products only (equal to float32 tolerance, like
``model.attention_impl``), so it is not part of a run's identity; the resolved value is
recorded in the run's ``provenance.json`` (``train_matmul``; ``eval_matmul`` for its
evaluation, where ``"auto"`` takes oneDNN for float32 models on jaxlib 0.10.x only).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from flaxformer_lite.base.checks import fail

log = logging.getLogger(__name__)

CHOICES = ("auto", "onednn", "xla")
ONEDNN_PRODUCTS = {
    "xla_cpu_use_onednn": True,
    "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
}

# jaxlib versions (prefixes) whose oneDNN products make a float32 forward pass faster: 0.10.2
# (SmolLM2-135M's scoring step 1.0-1.2x, the quick model's at 512-1024 tokens 1.2-1.6x);
# 0.12.0.1's made the quick model's slower (0.8-0.9x), so "auto" keeps XLA's elsewhere
EVALUATION_ONEDNN_JAXLIBS = ("0.10.",)


def check_choice(choice: str) -> None:
    """Raise `ConfigError` naming ``config.train.cpu_matmul`` unless ``choice`` is in `CHOICES`."""
    if choice not in CHOICES:
        fail("config.train.cpu_matmul", choice, f"must be one of {CHOICES}")


def resolve(
    choice: str, *, compute_dtype: Any, platform: str | None = None, evaluation: bool = False
) -> str:
    """``"onednn"`` or ``"xla"``: the products a training (or evaluation) step uses for
    ``choice``.

    Args:
      choice: ``config.train.cpu_matmul``, one of `CHOICES`.
      compute_dtype: the model's compute dtype (``ModelConfig.compute_dtype``).
      platform: the backend the step runs on; default ``jax.default_backend()``.
      evaluation: for a forward pass alone (scoring): ``"auto"`` takes oneDNN for float32
        models on the jaxlibs of `EVALUATION_ONEDNN_JAXLIBS` only (measured faster there,
        slower on a later one; a bfloat16 forward pass never gained: docs/performance.md
        §Products on CPU).

    Raises:
      ConfigError: ``choice`` is not one of `CHOICES`.
      RuntimeError: ``choice="onednn"`` on CPU and this jaxlib fails `onednn_problem`'s check.
    """
    check_choice(choice)
    platform = jax.default_backend() if platform is None else platform
    if choice == "xla" or platform != "cpu":
        return "xla"
    if choice == "onednn":
        problem = onednn_problem()
        if problem is not None:
            raise RuntimeError(
                f"config.train.cpu_matmul='onednn': jax {jax.__version__} cannot be used with "
                f"{ONEDNN_PRODUCTS}: {problem}. Use config.train.cpu_matmul='xla' (or 'auto')."
            )
        return "onednn"
    dtype = jnp.dtype(compute_dtype)
    if evaluation and not jaxlib.__version__.startswith(EVALUATION_ONEDNN_JAXLIBS):
        return "xla"
    if dtype == jnp.bfloat16:
        if evaluation or onednn_takes_bf16_products():
            return "xla"  # mixed products made float32, or a forward pass that did not gain
    elif dtype != jnp.float32:
        return "xla"  # float16: no evidence that oneDNN helps
    problem = onednn_problem()  # only where oneDNN would be used: the check compiles
    if problem is not None:
        _warn_once(problem)
        return "xla"
    return "onednn"


def compiler_options(resolved: str) -> dict[str, Any] | None:
    """The ``jax.jit(..., compiler_options=...)`` of a `resolve` result (None: XLA's default)."""
    return dict(ONEDNN_PRODUCTS) if resolved == "onednn" else None


@functools.cache
def onednn_problem() -> str | None:
    """None if this jaxlib compiles products with `ONEDNN_PRODUCTS` and computes them right,
    else what went wrong. Checked once per process, on small float32 products against
    float64 numpy: a 2-D product followed by a scale and a shift (the case the fused oneDNN
    mode gets wrong), with its left operand transposed, a batched product, and a product
    under ``tanh``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    a = rng.standard_normal((4, 16, 32)).astype(np.float32)
    b = rng.standard_normal((4, 32, 24)).astype(np.float32)
    x64, w64, a64, b64 = (v.astype(np.float64) for v in (x, w, a, b))
    cases = (
        ("(x @ w) * 0.3 + 1.0", lambda p, q: (p @ q) * 0.3 + 1.0, (x, w), (x64 @ w64) * 0.3 + 1.0),
        (
            "(x.T @ x) * 0.5 - 2.0",
            lambda p, q: (p.T @ q) * 0.5 - 2.0,
            (x, x),
            (x64.T @ x64) * 0.5 - 2.0,
        ),
        (
            "batched (a @ b) * 0.125 + 3.0",
            lambda p, q: jnp.matmul(p, q) * 0.125 + 3.0,
            (a, b),
            np.matmul(a64, b64) * 0.125 + 3.0,
        ),
        (
            "tanh((x @ w) * 0.1) * 2.0 + 0.5",
            lambda p, q: jnp.tanh((p @ q) * 0.1) * 2.0 + 0.5,
            (x, w),
            np.tanh((x64 @ w64) * 0.1) * 2.0 + 0.5,
        ),
    )
    cpu = jax.devices("cpu")[0]
    for name, fn, args, want in cases:
        try:
            args = jax.device_put(args, cpu)
            got = np.asarray(jax.jit(fn, compiler_options=ONEDNN_PRODUCTS)(*args), np.float64)
        except Exception as e:  # any failure to compile or run is the answer
            return f"{name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        err = float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
        if not err < 1e-4:  # float32 products of 32 terms: ~1e-6
            return f"{name} is wrong: max relative error {err:.3g} against float64"
    return None


@functools.cache
def onednn_takes_bf16_products() -> bool:
    """Whether this jaxlib, compiling with `ONEDNN_PRODUCTS`, gives a ``bf16 x bf16 -> f32``
    product (the kind `mixed_precision.dense` emits) to oneDNN.

    Read off the compiled HLO of one such product: an ``__onednn_fusion`` in it means yes (the
    jaxlib converts the operands to float32 first); none means XLA keeps it. A product that
    fails to compile counts as yes: XLA's products.
    """
    a = jnp.ones((64, 32), jnp.bfloat16)
    b = jnp.ones((32, 48), jnp.bfloat16)

    def mixed(p, q):
        return jax.lax.dot_general(
            p, q, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    cpu = jax.devices("cpu")[0]
    try:
        a, b = jax.device_put((a, b), cpu)
        compiled = jax.jit(mixed, compiler_options=ONEDNN_PRODUCTS).lower(a, b).compile()
        return "__onednn_fusion" in compiled.as_text()
    except Exception:  # any failure: XLA's products (onednn_problem names such failures)
        return True


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning(
        "config.train.cpu_matmul='auto': XLA's default CPU products, not oneDNN's: %s", problem
    )
