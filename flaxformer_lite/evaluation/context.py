"""The context-controlled protocol: the same target bytes scored at every context length.

With non-overlapping windows a byte's offset and its amount of context rise together, so a
longer window lowers the average loss even for a model that uses no distant context (the
"early token curse", Press et al. 2022, Appendix B). Here the targets are fixed -- blocks of
``S`` consecutive bytes evenly spaced over the split (`data.windows.context_block_starts`) --
and each context length ``c`` scores them from windows that start ``c`` bytes before each
block: target ``k`` of a block has exactly ``c + k`` bytes before it (``c .. c + S - 1``).
The curve of loss against ``c`` on the same bytes answers "does this encoding use more
context, or only survive it?".
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.evaluation.blocks import DEFAULT_BLOCK_TOKENS, BlockSums
from flaxformer_lite.evaluation.corpus import PositionFn, arange_positions
from flaxformer_lite.evaluation.metrics import summarize
from flaxformer_lite.evaluation.step import Evaluator


def evaluate_context(
    model: nnx.Module,
    split: Any,
    context: int,
    *,
    starts: np.ndarray,
    block: int,
    batch_size: int = 8,
    positions_fn: PositionFn = arange_positions,
    incremental: bool = False,
    progress: bool = False,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> dict[str, Any]:
    """Score the target blocks at ``starts`` (int ``[n]``, `ByteSplit.context_starts`) of a byte
    ``split``, each with ``context`` bytes before its first target.

    Returns `summarize` 's metrics (``loss_by_position[k]``: targets with ``context + k`` bytes
    of context) plus ``eval_length`` (= ``context``), ``protocol`` "context",
    ``context_block`` (``S``), ``windows``, ``num_scored_tokens`` and ``blocks`` (statistics
    blocks of ``block_tokens // S`` consecutive target blocks, each with the file of its first
    target).
    """
    evaluator = Evaluator(model, incremental=incremental)
    length = context + block - 1
    starts = np.asarray(starts, np.int64)
    per_stat = max(1, block_tokens // block)
    sums = {k: np.zeros(block, np.float64) for k in ("loss_sum", "correct_sum", "count")}
    stats = BlockSums(per_stat * block, f"targets ({per_stat} context blocks of {block})")
    bar = tqdm(
        total=len(starts),
        desc=f"context c={context}",
        unit="win",
        disable=not progress,
        leave=False,
    )
    batches = split.context_batches(starts, context, block, batch_size)
    with bar:  # closed also when interrupted
        for index, batch in enumerate(batches):
            target_bytes = batch.pop("target_bytes", None)  # a token split's
            batch.pop("target_offset", None)
            batch = dict(batch, positions=positions_fn(index, batch_size, length))
            out = evaluator(batch)
            for k in ("loss_sum", "correct_sum", "count"):
                sums[k] += out[k][context - 1 :]
            ids = np.repeat(
                ((index * batch_size + np.arange(batch_size)) // per_stat)[:, None], length, 1
            )
            mask = batch["loss_mask"] > 0
            # window w's targets start at starts[w] (a padded row has no target)
            rows = starts[index * batch_size : (index + 1) * batch_size]
            stats.note_positions(ids[: rows.shape[0], 0], rows)
            stats.add("loss", ids[mask], out["token_loss"][mask])
            stats.add("correct", ids[mask], out["token_correct"][mask])
            stats.add("count", ids[mask], np.ones(int(mask.sum())))
            if target_bytes is not None:
                scored = (target_bytes * mask).sum(axis=0)[context - 1 :]
                sums["bytes"] = sums.get("bytes", 0.0) + scored
                stats.add("bytes", ids[mask], target_bytes[mask])
            bar.update(min(batch_size, len(starts) - index * batch_size))
    byte_sum = sums.pop("bytes", None)
    result = summarize(**sums, byte_sum=byte_sum)
    result.update(
        eval_length=context,
        protocol="context",
        stride=None,
        context_block=block,
        windows=len(starts),
        num_scored_tokens=result["tokens"],
        blocks=stats.to_dict(getattr(split, "document_of", None)),
    )
    return result
