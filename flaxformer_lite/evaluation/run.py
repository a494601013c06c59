"""Executing an `EvalPlan`: the trained model at every cell, results as rows of fields.

Each cell's model shares the trained parameters (`step.rebuild_model`) and differs only in
what the plan decided for that cell (attention implementation, RoPE scaling). Every result
carries the cell's label fields (``encoding``, ``positional``, ``variant``,
``randomized_positions``) and its exact ``encoding_options``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.evaluation.context import evaluate_context
from flaxformer_lite.evaluation.corpus import evaluate_length
from flaxformer_lite.evaluation.plan import (
    CONTEXT_POSITIONS,
    CORPUS_POSITIONS,
    QUICK_EVAL_TOKENS,
    QUICK_POSITIONS,
    TASK_POSITIONS,
    EvalCell,
    EvalPlan,
)
from flaxformer_lite.evaluation.step import rebuild_model
from flaxformer_lite.evaluation.tasks import evaluate_task_length


def _positions_fn(plan: EvalPlan, tag: int):
    """``(index, batch, length) -> positions`` for the plan's position scheme."""

    def fn(index: int, batch: int, length: int) -> np.ndarray:
        return plan.positions.positions((tag, length, index), batch, length)

    return fn


def evaluate_cell(
    model: nnx.Module,
    plan: EvalPlan,
    cell: EvalCell,
    dataset: Any,
    *,
    max_tokens: int | None = None,
    positions_tag: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """The result of one cell: metrics plus the cell's label fields and encoding options
    (for a cell the model cannot be evaluated at, ``na`` with the reason and no metrics)."""
    scoring = "incremental" if cell.incremental else "parallel"
    fields = cell.label.fields() | {"encoding_options": cell.encoding_options()}
    fields["scoring"] = scoring
    if cell.na is not None:
        return fields | {
            "eval_length": cell.length,
            "protocol": cell.protocol,
            "stride": cell.stride or cell.length,
            "na": cell.na,
        }
    m = rebuild_model(model, cell.model)
    if plan.kind == "task":
        tag = TASK_POSITIONS if positions_tag is None else positions_tag
        result = evaluate_task_length(
            m,
            dataset,
            cell.length,
            num_examples=plan.num_examples,
            batch_size=plan.batch_size,
            seed=plan.seed,
            positions_fn=_positions_fn(plan, tag),
            incremental=cell.incremental,
        )
    elif cell.protocol == "context":
        split = dataset.split(plan.split)
        result = evaluate_context(
            m,
            split,
            cell.length,
            starts=plan.context_starts(split),
            block=plan.context_block,
            batch_size=plan.batch_size,
            positions_fn=_positions_fn(plan, CONTEXT_POSITIONS),
            incremental=cell.incremental,
            progress=progress,
        )
    else:
        tag = CORPUS_POSITIONS if positions_tag is None else positions_tag
        result = evaluate_length(
            m,
            dataset.split(plan.split),
            cell.length,
            stride=cell.stride,
            max_tokens=plan.max_tokens if max_tokens is None else max_tokens,
            batch_size=plan.batch_size,
            train_length=plan.train_length,
            positions_fn=_positions_fn(plan, tag),
            progress=progress,
            incremental=cell.incremental,
        )
    return result | fields


def evaluate_plan(
    model: nnx.Module, plan: EvalPlan, dataset: Any, *, progress: bool = False
) -> list[dict[str, Any]]:
    """Every cell of ``plan``, in order (``dataset``: the opened corpus or task).

    ``progress``: a bar of the cells (with the ETA), above the window bar of the current
    length (`evaluate_length`, `evaluate_context`)."""
    results = []
    with tqdm(
        total=len(plan.cells),
        desc="evaluate",
        unit="cell",
        disable=not progress,
        leave=False,  # the results follow; in a study, each cell's bars would pile up
        dynamic_ncols=True,
    ) as bar:
        for cell in plan.cells:
            bar.set_postfix_str(f"{cell.label.encoding} {cell.protocol} L'={cell.length}")
            results.append(evaluate_cell(model, plan, cell, dataset, progress=progress))
            bar.update(1)
    return results


def quick_evaluate(model: nnx.Module, plan: EvalPlan, dataset: Any) -> dict[str, float]:
    """Validation during training: the training length, at most `QUICK_EVAL_TOKENS` tokens."""
    r = evaluate_cell(
        model,
        plan,
        plan.quick,
        dataset,
        max_tokens=min(plan.max_tokens or QUICK_EVAL_TOKENS, QUICK_EVAL_TOKENS),
        positions_tag=QUICK_POSITIONS if plan.kind == "corpus" else TASK_POSITIONS,
    )
    keys = (
        ("exact_match", "accuracy")
        if plan.kind == "task"
        else ("loss", "bits_per_byte", "accuracy")
    )
    return {k: r[k] for k in keys}
