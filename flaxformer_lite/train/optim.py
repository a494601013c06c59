"""AdamW with linear warm-up, cosine decay, global-norm clipping and selective weight decay."""

from __future__ import annotations

import jax
import optax

from flaxformer_lite.train.run_config import OptimConfig


def learning_rate_schedule(cfg: OptimConfig, num_steps: int) -> optax.Schedule:
    """Linear warm-up from 0 to ``cfg.learning_rate`` over ``warmup_steps``, then cosine decay
    to ``learning_rate * final_lr_ratio`` at ``num_steps`` (Loshchilov & Hutter 2017)."""
    warmup = min(cfg.warmup_steps, max(num_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(num_steps, warmup + 1),
        end_value=cfg.learning_rate * cfg.final_lr_ratio,
    )


def decay_mask(params):
    """True for matrices (kernels, embedding and position tables), False for vectors (norm
    scales and biases, per-head scalars), which are conventionally not decayed."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimConfig, num_steps: int) -> optax.GradientTransformation:
    """The optimizer of every run; clipping happens before the Adam moments are updated."""
    adamw = optax.adamw(
        learning_rate_schedule(cfg, num_steps),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    if cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
    return adamw
