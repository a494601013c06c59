"""Box constraints on parameters, kept by projection after every optimizer update.

A parameter declares its box in its metadata: ``nnx.Param(value, bounds=(low, high))``
(``None`` for an open side). `project` clips every such parameter of a state into its box;
the training step applies it after each update, so a stored parameter never leaves its box.
This is what KERPLE's reference does by clamping its parameters in place before each forward
pass (chijames/KERPLE): the value used is ``clamp(p)`` and the next update starts from it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def bounds_of(variable: Any) -> tuple[float | None, float | None] | None:
    """The ``bounds`` metadata of an ``nnx.Variable`` (None if it has none)."""
    if not isinstance(variable, nnx.Variable):
        return None
    return variable.get_metadata().get("bounds")


def project(state: Any) -> Any:
    """``state`` (a pytree of ``nnx.Variable`` s, e.g. the parameters) with every bounded
    variable clipped into its box; other leaves are returned unchanged."""

    def one(x: Any) -> Any:
        box = bounds_of(x)
        if box is None:
            return x
        low, high = box
        return jax.tree.map(lambda a: jnp.clip(a, low, high).astype(a.dtype), x)

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
