"""The evaluation protocols as values: what one evaluation cell scores, and how its targets are
grouped into statistics blocks. `flaxformer_lite.evaluation.score.score` runs any of them.

* `Windows` -- the split cut into windows of ``length`` tokens (Press et al. 2022, "Train
  Short, Test Long", §4). Non-overlapping (``stride`` None): every target is scored once with
  ``1..length`` tokens of context, so early tokens of a window see little (the "early token
  curse"). Sliding (``stride`` S < length): windows advance by S and, after the first, score
  only their last S targets, each with at least ``length - S`` tokens of context. Both score
  the same targets at every length (the first ``max_bytes`` bytes of text, or all), so the
  numbers at different lengths are directly comparable.
* `Context` -- the context-controlled protocol: fixed target blocks of ``block`` tokens
  evenly spaced over the split, each scored from a window that starts ``context`` tokens
  before it, so target ``k`` of a block has exactly ``context + k`` tokens before it. The
  curve of loss against ``context`` on the same targets answers "does this model use more
  context, or only survive it?" (longer non-overlapping windows lower the loss even without
  using distant context: Press et al. 2022, Appendix B).
* `TaskLength` -- a synthetic task at one length: exact match of the answer (every answer
  token right), teacher-forced or decoded greedily from the prompt.

A protocol yields batches (`batches`: ``inputs``, ``targets``, ``loss_mask`` and what each
target is -- ``target_position``, ``target_offset``, ``target_bytes``, `data.corpus.Split`)
with the statistics block of every target (``block``: int ``[b, T]``), says which columns of
the per-position sums it reports (`columns`) and which fields its rows carry (`fields`).
Adding a protocol is one such class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from flaxformer_lite.evaluation.blocks import DEFAULT_BLOCK_EXAMPLES, DEFAULT_BLOCK_TOKENS

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Windows:
    """Windows of ``length`` tokens advancing by ``stride`` (None: non-overlapping).

    Attributes:
      length: the window length L' (tokens).
      stride: the sliding stride S (1..L'), None (or L') for non-overlapping windows.
      max_bytes: score only the targets of the split's first ``max_bytes`` bytes of text
        (`data.corpus.Split.tokens_within`: the same text for every tokenizer); None:
        every target of the split.
      train_length: the training length L, for ``bucket_loss`` (None: no buckets).
      block_tokens: statistics blocks are ranges of this many bytes of text.
    """

    length: int
    stride: int | None = None
    max_bytes: int | None = None
    train_length: int | None = None
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    columns = slice(None)
    block_unit: ClassVar[str] = "target bytes"

    @property
    def name(self) -> str:
        return "nonoverlapping" if self.stride in (None, self.length) else "sliding"

    @property
    def sequence_length(self) -> int:
        return self.length

    @property
    def block_size(self) -> int:
        return self.block_tokens

    def describe(self) -> str:
        return f"eval L'={self.length}"

    def count(self, data: Any) -> int:
        """The windows `batches` yields (before padding)."""
        return data.num_eval_windows(self.length, stride=self.stride, max_bytes=self.max_bytes)

    def batches(self, data: Any, batch_size: int) -> Iterator[Batch]:
        batches = data.eval_batches(
            self.length, batch_size, stride=self.stride, max_bytes=self.max_bytes, pad_batch=True
        )
        for batch in batches:
            yield dict(batch, block=batch["target_offset"] // self.block_tokens)

    def fields(self, data: Any) -> dict[str, Any]:
        return {
            "eval_length": self.length,
            "protocol": self.name,
            "stride": self.length if self.stride is None else self.stride,
            "windows": self.count(data),
        }


@dataclasses.dataclass(frozen=True)
class Context:
    """Fixed target blocks of ``block`` tokens, each after exactly ``context`` tokens.

    Attributes:
      context: the context c before each block's first target (tokens).
      block: S, the targets scored per window (its last S columns).
      max_context: the longest context of the study: the blocks are placed so that every
        context length scores the same targets (`data.corpus.Split.context_starts`).
      targets: how many targets in all (``targets // block`` blocks).
      block_tokens: statistics blocks group ``block_tokens // block`` consecutive windows.
      key_near: the training length L, to also score the key targets (batches' ``key``:
        targets that a copy from beyond L tokens before their block, within
        ``max_context``, predicts: `data.windows.copy_key_targets`); None: no key targets.
    """

    context: int
    block: int
    max_context: int
    targets: int
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    key_near: int | None = None

    name: ClassVar[str] = "context"

    @property
    def sequence_length(self) -> int:
        return self.context + self.block - 1

    @property
    def per_block(self) -> int:
        """Context windows per statistics block."""
        return max(1, self.block_tokens // self.block)

    @property
    def block_unit(self) -> str:
        return f"targets ({self.per_block} context blocks of {self.block})"

    @property
    def block_size(self) -> int:
        return self.per_block * self.block

    @property
    def columns(self) -> slice:
        return slice(self.context - 1, None)

    def describe(self) -> str:
        return f"context c={self.context}"

    def starts(self, data: Any) -> np.ndarray:
        """The first target of each block: the same for every context length."""
        return data.context_starts(
            max_context=self.max_context,
            block=self.block,
            blocks=max(1, self.targets // self.block),
        )

    def count(self, data: Any) -> int:
        return int(self.starts(data).shape[0])

    def batches(self, data: Any, batch_size: int) -> Iterator[Batch]:
        starts = self.starts(data)
        key = None
        if self.key_near is not None:
            key = data.context_key_targets(
                starts, block=self.block, near=self.key_near, far=self.max_context
            )
        batches = data.context_batches(starts, self.context, self.block, batch_size)
        for index, batch in enumerate(batches):
            rows = index * batch_size + np.arange(batch["inputs"].shape[0])
            block = np.repeat((rows // self.per_block)[:, None], self.sequence_length, axis=1)
            if key is None:
                yield dict(batch, block=block)
                continue
            targets = np.zeros(block.shape, np.float32)  # padded rows: no key target
            real = rows[rows < key.shape[0]]
            targets[: real.shape[0], self.context - 1 :] = key[real]
            yield dict(batch, block=block, key=targets)

    def fields(self, data: Any) -> dict[str, Any]:
        return {
            "eval_length": self.context,
            "protocol": self.name,
            "stride": None,
            "context_block": self.block,
            "windows": self.count(data),
        }


TASK_MODES = ("teacher_forced", "generate")


@dataclasses.dataclass(frozen=True)
class TaskLength:
    """A synthetic task at one length: ``num_examples`` examples drawn from
    ``np.random.default_rng([seed, length])`` (the same for every model).

    ``mode="teacher_forced"``: predictions are the argmax at each answer position given the
    true prefix. ``mode="generate"``: the answer is decoded greedily from the prompt alone
    (`flaxformer_lite.evaluation.score.generate_predictions`); the row then carries ``"mode":
    "generate"``. For one example the two agree on exact match (greedy decoding reproduces the
    answer iff every teacher-forced answer argmax is right); the per-token ``accuracy``
    differs after a first error.
    """

    length: int
    num_examples: int = 256
    seed: int = 0
    mode: str = "teacher_forced"
    block_examples: int = DEFAULT_BLOCK_EXAMPLES
    sequence: int = 0  # tokens per example sequence (the task's); 0: not known

    name: ClassVar[str] = "task"
    columns = slice(None)
    block_unit: ClassVar[str] = "examples"

    def __post_init__(self) -> None:
        if self.mode not in TASK_MODES:
            raise ValueError(f"mode={self.mode!r} is not known; allowed: {list(TASK_MODES)}")

    @property
    def block_size(self) -> int:
        return self.block_examples

    @property
    def sequence_length(self) -> int:
        return self.sequence

    def describe(self) -> str:
        return f"task length={self.length}"

    def count(self, data: Any) -> int:
        return self.num_examples

    def batches(self, data: Any, batch_size: int) -> Iterator[Batch]:
        """Batches of examples; ``rows`` says how many rows of each are examples (the last
        batch's surplus rows are drawn but not counted)."""
        rng = np.random.default_rng([self.seed, self.length])
        done = 0
        while done < self.num_examples:
            batch = data.sample(rng, batch_size, self.length)
            n = min(batch_size, self.num_examples - done)
            t = batch["inputs"].shape[1]
            example = done + np.arange(batch["inputs"].shape[0])
            counted = example < self.num_examples
            block = np.repeat((example // self.block_examples)[:, None], t, axis=1)
            yield dict(
                batch,
                loss_mask=batch["loss_mask"] * counted[:, None],
                block=block,
                rows=np.asarray(n),
            )
            done += n

    def fields(self, data: Any) -> dict[str, Any]:
        out = {"eval_length": self.length, "protocol": self.name, "examples": self.num_examples}
        return out if self.mode == "teacher_forced" else out | {"mode": self.mode}
