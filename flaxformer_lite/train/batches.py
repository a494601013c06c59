"""What a run trains and evaluates on: a byte corpus (language modelling) or a synthetic task.

A source gives the training batch of step ``t`` (a pure function of the seed and ``t``, so
resuming is exact), a quick validation metric, the final evaluation at every length, and
the data's provenance. Positions are made here, explicitly: ``0..L-1``, or sorted random
positions when the model config asks for randomized positions (Ruoss et al. 2023).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_lite import data
from flaxformer_lite.core import attention
from flaxformer_lite.core.positions import randomized_positions
from flaxformer_lite.evaluation import engine as evaluate
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.train.run_config import ConfigError, RunConfig

QUICK_EVAL_TOKENS = 16384


def build(run: RunConfig) -> _Source:
    """The source for ``run.data`` (raises `ConfigError` for a bad corpus/task/length)."""
    try:
        source = TaskSource(run) if run.data.source == "task" else CorpusSource(run)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"config.data: {e}") from None
    longest = max(run.eval_lengths)
    if isinstance(source, TaskSource):
        longest = source.task.sequence_length(longest)
    if source.randomized and run.model.max_position < longest:
        # checked here, not when evaluation reaches that length after the whole training
        raise ConfigError(
            f"config.model.max_position={run.model.max_position}: randomized positions need "
            f"max_position >= the longest evaluation sequence ({longest} tokens)"
        )
    return source


class _Source:
    def __init__(self, run: RunConfig):
        self.run = run
        self.randomized = bool(getattr(run.model, "randomized_positions", False))

    def positions(self, key_parts: tuple[int, ...], batch: int, length: int) -> jax.Array:
        """int32 ``[batch, length]``: ``0..length-1`` or sorted random positions."""
        if not self.randomized:
            return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (batch, length))
        max_position = self.run.model.max_position
        if length > max_position:
            raise ConfigError(
                f"config.model.max_position={max_position}: randomized positions need "
                f"max_position >= the sequence length {length}"
            )
        key = jax.random.key(self.run.seed)
        for part in key_parts:
            key = jax.random.fold_in(key, part)
        return randomized_positions(key, batch, length, max_position=max_position)

    def _eval_positions(self, tag: int):
        return lambda index, batch, length: self.positions((tag, length, index), batch, length)

    def variant(self, scaling: str | None):
        """Per-length config: chunked attention above the threshold, optional RoPE scaling."""
        threshold = self.run.eval.chunked_threshold

        def fn(cfg: ModelConfig, length: int) -> ModelConfig:
            impl = attention.choose_implementation(
                cfg.attention_impl, length, length, threshold=threshold
            )
            cfg = cfg.replace(attention_impl=impl)
            if scaling is not None:
                from flaxformer_lite.nn.encodings import rope_scaling_variant

                cfg = rope_scaling_variant(cfg, length, scaling)
            return cfg

        return fn

    def variants(self) -> list[tuple[str, Any]]:
        """``(label, variant fn)``: the base model, plus RoPE scalings when asked for.

        Scalings are skipped for randomized positions: such a model was trained on positions
        spread over ``[0, max_position)`` already, so there is nothing to interpolate.
        """
        out = [("base", self.variant(None))]
        if self.run.model.positional == "rope" and not self.randomized:
            out += [(s, self.variant(s)) for s in self.run.eval.rope_scalings]
        return out


class CorpusSource(_Source):
    """Byte-level language modelling on a corpus from `flaxformer_lite.data`."""

    def __init__(self, run: RunConfig):
        super().__init__(run)
        d = run.data
        if d.corpus == "path":
            kwargs = {"path": d.path}
        else:
            kwargs = {"cache_dir": d.cache_dir} if d.cache_dir else {}
        self.corpus = data.get_corpus(d.corpus, **kwargs)
        self.train_split = self.corpus.split("train")
        self.eval_split = self.corpus.split(run.eval.split)
        self.train_split.require(d.train_length, what="a training window")
        self.eval_split.require(max(run.eval_lengths), what="an evaluation window")
        if run.model.vocab_size < data.VOCAB_SIZE:
            raise ConfigError(
                f"config.model.vocab_size={run.model.vocab_size}: byte corpora need >= 256"
            )

    def train_batch(self, step: int) -> dict[str, jax.Array]:
        d = self.run.data
        rng = np.random.default_rng([self.run.seed, step])
        batch = self.train_split.sample_batch(rng, d.batch_size, d.train_length)
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        batch["positions"] = self.positions((0, step), d.batch_size, d.train_length)
        return batch

    def quick_eval(self, model: nnx.Module) -> dict[str, float]:
        r = evaluate.evaluate_length(
            model,
            self.eval_split,
            self.run.data.train_length,
            max_tokens=min(self.run.eval.max_tokens, QUICK_EVAL_TOKENS),
            batch_size=self.run.eval.batch_size,
            positions_fn=self._eval_positions(1),
        )
        return {k: r[k] for k in ("loss", "bits_per_byte", "accuracy")}

    def evaluate(self, model: nnx.Module, *, progress: bool = False) -> list[dict[str, Any]]:
        e = self.run.eval
        rows = []
        for label, variant in self.variants():
            for protocol in e.protocols:
                for r in evaluate.evaluate_lengths(
                    model,
                    self.eval_split,
                    self.run.eval_lengths,
                    protocol=protocol,
                    stride_fraction=e.stride_fraction,
                    variant=variant,
                    max_tokens=e.max_tokens,
                    batch_size=e.batch_size,
                    train_length=self.run.data.train_length,
                    positions_fn=self._eval_positions(2),
                    progress=progress,
                ):
                    rows.append(r | {"variant": label})
        return rows

    def provenance(self) -> dict[str, Any]:
        return self.corpus.provenance()


class TaskSource(_Source):
    """A synthetic length-generalisation task from `flaxformer_lite.data.tasks`."""

    def __init__(self, run: RunConfig):
        super().__init__(run)
        self.task = data.get_task(run.data.task)
        for length in (run.data.train_length, *run.eval_lengths):
            self.task.check_length(length, arg="config.data.train_length x eval multiple")
        longest = self.task.sequence_length(max(run.eval_lengths))
        if run.model.positional == "learned" and run.model.max_length < longest:
            raise ConfigError(
                f"config.model.max_length={run.model.max_length}: the learned table must cover "
                f"the longest evaluation sequence ({longest} tokens)"
            )

    def train_batch(self, step: int) -> dict[str, jax.Array]:
        """A batch at a task length drawn uniformly from ``[task.min_length, L]``, padded to
        the sequence length of ``L`` (one compiled step serves every training length)."""
        d = self.run.data
        rng = np.random.default_rng([self.run.seed, step])
        length = int(rng.integers(self.task.min_length, d.train_length + 1))
        pad_to = self.task.sequence_length(d.train_length)
        sample = self.task.sample(rng, d.batch_size, length, pad_to=pad_to)
        batch = {k: jnp.asarray(v) for k, v in sample.items()}
        t = batch["inputs"].shape[1]
        batch["positions"] = self.positions((0, step), d.batch_size, t)
        return batch

    def quick_eval(self, model: nnx.Module) -> dict[str, float]:
        (r,) = self._task_eval(model, [self.run.data.train_length], "base", self.variant(None))
        return {"exact_match": r["exact_match"], "accuracy": r["accuracy"]}

    def _task_eval(self, model, lengths, label, variant):
        rows = evaluate.evaluate_task(
            model,
            self.task,
            lengths,
            num_examples=self.run.eval.num_examples,
            batch_size=self.run.eval.batch_size,
            seed=self.run.seed,
            positions_fn=self._eval_positions(3),
            variant=variant,
        )
        return [r | {"variant": label} for r in rows]

    def evaluate(self, model: nnx.Module, *, progress: bool = False) -> list[dict[str, Any]]:
        del progress
        rows = []
        for label, variant in self.variants():
            rows += self._task_eval(model, self.run.eval_lengths, label, variant)
        return rows

    def provenance(self) -> dict[str, Any]:
        return {"task": self.run.data.task}
