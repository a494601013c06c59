"""From per-position sums to the reported metrics: loss, bits per byte, per-offset buckets."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

LN2 = math.log(2.0)


def summarize(
    loss_sum: np.ndarray,
    correct_sum: np.ndarray,
    count: np.ndarray,
    *,
    train_length: int | None = None,
    byte_sum: np.ndarray | None = None,
) -> dict[str, Any]:
    """Aggregate per-position sums (float ``[length]``) into the reported metrics.

    ``loss`` is mean nats per scored token and ``perplexity = exp(loss)`` (per token). Bits
    per byte: byte-level models, ``loss / ln 2`` (tokens are bytes); with ``byte_sum`` (the
    UTF-8 bytes the scored tokens cover, per position, from a tokenized split),
    ``sum(loss) / ln 2 / sum(bytes)`` -- total bits over total bytes, so models with
    different tokenizers are compared on the same text. ``loss_by_position[t]`` is the mean
    loss of targets at window offset ``t`` (``t + 1`` tokens of context; NaN where none were
    scored). With ``train_length`` L, ``bucket_loss`` averages the positions in ``[0, L),
    [L, 2L), [2L, 4L), ...`` (the buckets where the failure modes of extrapolation show).
    """
    tokens = float(count.sum())
    if tokens == 0:
        raise ValueError("no target was scored (empty evaluation)")
    loss = float(loss_sum.sum() / tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        by_pos = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)
    out: dict[str, Any] = {
        "loss": loss,
        "bits_per_byte": loss / LN2,
        "perplexity": math.exp(min(loss, 700.0)),
        "accuracy": float(correct_sum.sum() / tokens),
        "tokens": int(tokens),
        "loss_by_position": [None if math.isnan(v) else float(v) for v in by_pos],
    }
    if byte_sum is not None:
        scored_bytes = float(np.sum(byte_sum))
        if scored_bytes <= 0:
            raise ValueError("the scored tokens cover no bytes of text")
        out["bits_per_byte"] = float(loss_sum.sum()) / LN2 / scored_bytes
        out["scored_bytes"] = round(scored_bytes)
    if train_length:
        out["bucket_loss"] = bucket_losses(loss_sum, count, train_length)
    return out


def bucket_losses(loss_sum: np.ndarray, count: np.ndarray, train_length: int) -> dict[str, float]:
    """Mean loss over window offsets ``[0, L)``, ``[L, 2L)``, ``[2L, 4L)``, ... up to the length."""
    length = loss_sum.shape[0]
    edges = [0, train_length]
    while edges[-1] < length:
        edges.append(min(2 * edges[-1], length))
    buckets = {}
    for lo, hi in itertools.pairwise(edges):
        n = float(count[lo:hi].sum())
        if n > 0:
            buckets[f"[{lo},{hi})"] = float(loss_sum[lo:hi].sum() / n)
    return buckets
