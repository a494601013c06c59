"""Training batches: the batch of step ``t`` is a pure function of the seed and ``t``.

Drawn from ``np.random.default_rng([seed, t])`` so that resuming is exact: a resumed run sees
the batches an uninterrupted one would have seen. Positions come from the run's evaluation
plan (`EvalPlan.positions`: ``0..L-1``, or sorted random positions when the model config
asks for them, Ruoss et al. 2023), so training and evaluation draw them the same way.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_lite import pretrained as hf
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.data import VOCAB_SIZE
from flaxformer_lite.data.data_config import open_dataset
from flaxformer_lite.evaluation.plan import TRAIN_POSITIONS, EvalPlan
from flaxformer_lite.train.run_config import RunConfig


def open_run_data(run: RunConfig, plan: EvalPlan | None = None) -> Any:
    """The data the run trains on and scores, checked against what training and evaluation
    need from it (`ConfigError` naming ``config.data`` or ``config.model``); opens files,
    writes nothing. A corpus, a task, or -- for a pretrained model -- the corpus as that model
    scores it (`pretrained.Checkpoint.scored_text`: tokenized by its tokenizer), so the
    pre-flight checks the split that will be scored."""
    plan = run.eval_plan() if plan is None else plan
    dataset = open_dataset(run.data)
    if run.pretrained.source:
        try:
            checkpoint = run.pretrained.checkpoint()
            dataset = checkpoint.scored_text(dataset, max_bytes=run.eval.max_bytes or None)
        except hf.PretrainedError as e:
            raise ConfigError(f"config.pretrained.source={run.pretrained.source!r}: {e}") from None
    elif not run.data.is_task:
        try:
            dataset.split("train").require(run.data.train_length, what="a training window")
        except ValueError as e:
            raise ConfigError(f"config.data: {e}") from None
        if run.model.vocab_size < VOCAB_SIZE:
            raise ConfigError(
                f"config.model.vocab_size={run.model.vocab_size}: byte corpora need >= {VOCAB_SIZE}"
            )
    plan.check_data(dataset)
    return dataset


class TrainBatches:
    """``batch(step)``: the training batch of a step, for a corpus or a synthetic task."""

    def __init__(self, run: RunConfig, dataset: Any, plan: EvalPlan):
        self.run = run
        self.positions = plan.positions
        if run.data.is_task:
            self.task = dataset
            self.split = None
        else:
            self.task = None
            self.split = dataset.split("train")

    def __call__(self, step: int) -> dict[str, jax.Array]:
        d = self.run.data
        rng = np.random.default_rng([self.run.seed, step])
        if self.task is None:
            sample = self.split.sample_batch(rng, d.batch_size, d.train_length)
        else:
            # A task length drawn uniformly from [task.min_length, L], padded to the sequence
            # length of L (one compiled step serves every training length).
            length = int(rng.integers(self.task.min_length, d.train_length + 1))
            pad_to = self.task.sequence_length(d.train_length)
            sample = self.task.sample(rng, d.batch_size, length, pad_to=pad_to)
        batch = {k: jnp.asarray(v) for k, v in sample.items()}
        t = batch["inputs"].shape[1]
        batch["positions"] = self.positions.positions((TRAIN_POSITIONS, step), d.batch_size, t)
        return batch
