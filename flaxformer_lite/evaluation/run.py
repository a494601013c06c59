"""Executing an `EvalPlan`: the trained model at every cell, results as rows of fields.

Each cell's model shares the trained parameters (`step.rebuild_model`) and differs only in
what the plan decided for that cell (attention implementation, RoPE scaling); its protocol
value (`protocols`) is scored by the one loop, `score.score`. Every result carries the cell's
label fields (``encoding``, ``positional``, ``variant``, ``randomized_positions``) and its exact
``encoding_options``. A variant that changes no number at a cell's length (a RoPE scaling at
``s = 1``) repeats its base cell's result (``scoring: "repeat"``) instead of scoring it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.evaluation.plan import (
    CONTEXT_POSITIONS,
    CORPUS_POSITIONS,
    QUICK_POSITIONS,
    TASK_POSITIONS,
    EvalCell,
    EvalPlan,
)
from flaxformer_lite.evaluation.score import score
from flaxformer_lite.evaluation.step import rebuild_model

# rows' ``scoring`` for a cell whose variant is the model itself at its length (a RoPE scaling
# at s = 1, `EvalCell.same_as`): its numbers are its base cell's, not scored again
REPEAT = "repeat"
# where each protocol draws its randomized positions from (`PositionScheme` key parts)
_POSITIONS_TAG = {"context": CONTEXT_POSITIONS, "task": TASK_POSITIONS}
# what validation during training reports, per kind of plan
_QUICK_METRICS = {
    "corpus": ("loss", "bits_per_byte", "accuracy"),
    "task": ("exact_match", "accuracy"),
}


def _cell_fields(cell: EvalCell) -> dict[str, Any]:
    """What a cell's result says about the cell: its label fields and encoding options."""
    return cell.label.fields() | {"encoding_options": cell.encoding_options()}


def evaluate_cell(
    model: nnx.Module,
    plan: EvalPlan,
    cell: EvalCell,
    dataset: Any,
    *,
    positions_tag: int | None = None,
    progress: bool = False,
    compiler_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result of one cell: metrics plus the cell's label fields and encoding options
    (for a cell the model cannot be evaluated at, ``na`` with the reason and no metrics).
    ``dataset``: the corpus the plan scores (byte-level, or tokenized by the model's
    tokenizer) or the task; ``compiler_options``: of the scoring step (`score.score`)."""
    fields = _cell_fields(cell)
    fields["scoring"] = "incremental" if cell.incremental else "parallel"
    if cell.na is not None:
        return fields | {
            "eval_length": cell.length,
            "protocol": cell.protocol,
            "stride": cell.stride or cell.length,
            "na": cell.na,
        }
    if positions_tag is None:
        positions_tag = _POSITIONS_TAG.get(cell.protocol, CORPUS_POSITIONS)
    data = dataset if plan.kind == "task" else dataset.split(plan.split)

    def positions_fn(index: int, batch: int, length: int) -> np.ndarray:
        """The plan's positions for batch ``index``: int32 ``[batch, length]``."""
        return plan.positions.positions((positions_tag, length, index), batch, length)

    result = score(
        rebuild_model(model, cell.model),
        cell.scoring,
        data,
        batch_size=plan.batch_size,
        positions_fn=positions_fn,
        incremental=cell.incremental,
        progress=progress and plan.kind == "corpus",
        compiler_options=compiler_options,
    )
    return result | fields


def evaluate_plan(
    model: nnx.Module,
    plan: EvalPlan,
    dataset: Any,
    *,
    progress: bool = False,
    compiler_options: dict[str, Any] | None = None,
    done: Sequence[dict[str, Any]] = (),
    on_cell: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every cell of ``plan``, in order (``dataset``: the corpus or task it scores).

    ``progress``: a bar of the cells (with the ETA), above the window bar of the current
    cell; ``compiler_options``: of the scoring step (`score.score`). ``done``: the results
    of the plan's first cells from an evaluation that stopped (they are not scored again);
    ``on_cell(result)`` is called after each cell scored here. A cell with ``same_as`` takes
    that cell's metrics with its own label fields (``scoring: "repeat"``)."""
    results = list(done)
    with tqdm(
        total=len(plan.cells),
        desc="evaluate",
        unit="cell",
        disable=not progress,
        leave=False,  # the results follow; in a study, each cell's bars would pile up
        dynamic_ncols=True,
    ) as bar:
        bar.update(len(results))
        for cell in plan.cells[len(results) :]:
            bar.set_postfix_str(f"{cell.label.encoding} {cell.protocol} L'={cell.length}")
            if cell.same_as is not None:  # the variant is the model itself at this length
                result = results[cell.same_as] | _cell_fields(cell) | {"scoring": REPEAT}
            else:
                result = evaluate_cell(
                    model,
                    plan,
                    cell,
                    dataset,
                    progress=progress,
                    compiler_options=compiler_options,
                )
            results.append(result)
            if on_cell is not None:
                on_cell(result)
            bar.update(1)
    return results


def quick_evaluate(
    model: nnx.Module,
    plan: EvalPlan,
    dataset: Any,
    *,
    compiler_options: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Validation during training: the training length, at most `plan.QUICK_EVAL_TOKENS`
    targets."""
    tag = QUICK_POSITIONS if plan.kind == "corpus" else TASK_POSITIONS
    r = evaluate_cell(
        model, plan, plan.quick, dataset, positions_tag=tag, compiler_options=compiler_options
    )
    return {k: r[k] for k in _QUICK_METRICS[plan.kind]}
