"""The evaluation plan: every cell a run will be evaluated at, decided once from its config.

`EvalPlan.build` turns the model, data and evaluation sections of a run config into a frozen
list of `EvalCell` s -- one per (variant, protocol, length) -- each with the exact model
config the trained parameters are evaluated under (attention implementation for that length,
RoPE scaling) and a structured `EvalLabel`. Everything that can be wrong with the plan is
found here, before training: an encoding that cannot encode the longest sequence, randomized
positions that do not reach it, an unknown RoPE scaling, a task length out of range.
`flaxformer_lite.evaluation.run.evaluate_plan` executes a plan; results rows carry the
label's fields as separate columns, so tables never parse a label string.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flaxformer_lite.base.checks import ConfigError, fail
from flaxformer_lite.core.positions import PositionScheme
from flaxformer_lite.data.data_config import DataConfig
from flaxformer_lite.evaluation.corpus import attention_config, sliding_stride
from flaxformer_lite.evaluation.eval_config import PROTOCOLS, EvalConfig
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.model_config import ModelConfig, check_encodable

BASE = "base"  # the variant name of the trained model evaluated as it is
WINDOW = "window"  # the variant: windowed causal attention (config.eval.local_window keys)
RANDOMIZED_SUFFIX = "+randomized"  # label suffix of a model trained on randomized positions
# label suffix of an encoding whose table has rows past the training length (never trained)
UNTRAINED_SUFFIX = "+untrained_rows"
QUICK_EVAL_TOKENS = 16384  # validation during training scores at most this many tokens
# Where each use of positions draws its randomized positions from (`PositionScheme` key parts).
TRAIN_POSITIONS, QUICK_POSITIONS, CORPUS_POSITIONS, TASK_POSITIONS = 0, 1, 2, 3
CONTEXT_POSITIONS = 4


@dataclasses.dataclass(frozen=True)
class EvalLabel:
    """What a results row is about, as separate fields.

    Attributes:
      encoding: the display label, e.g. ``"rope"``, ``"rope+pi"``, ``"sinusoidal+randomized"``.
      positional: the registry name of the trained model's encoding (``"rope"``).
      variant: ``"base"`` for the trained model as it is, or the evaluation-time variant
        (a RoPE scaling name).
      randomized: the model was trained (and is evaluated) on randomized positions.
    """

    encoding: str
    positional: str
    variant: str
    randomized: bool

    def fields(self) -> dict[str, Any]:
        """The row columns: ``encoding``, ``positional``, ``variant``, ``randomized_positions``."""
        return {
            "encoding": self.encoding,
            "positional": self.positional,
            "variant": self.variant,
            "randomized_positions": self.randomized,
        }


@dataclasses.dataclass(frozen=True)
class EvalCell:
    """One evaluation: a model config, a length and a protocol.

    Attributes:
      label: what the rows of this cell are about.
      model: the config the trained parameters are evaluated under (same parameter shapes:
        only the attention implementation and an evaluation-time variant differ).
      length: corpus: the window length in tokens; task: the task length.
      protocol: ``"nonoverlapping"``, ``"sliding"`` or ``"task"``.
      stride: the sliding-window stride (None for non-overlapping windows and tasks).
      sequence_length: tokens per evaluated sequence (the window, or the task's sequence).
      incremental: score token by token through the KV cache, so that each target sees
        exactly its prefix (the registry says when: dynamic NTK reads the current length).
      na: why the model cannot be evaluated here (None: it can), e.g. a learned table with no
        row past the training length; such a cell is reported as "n/a", never as a number.
    """

    label: EvalLabel
    model: ModelConfig
    length: int
    protocol: str
    stride: int | None
    sequence_length: int
    incremental: bool = False
    na: str | None = None

    def encoding_options(self) -> dict[str, Any]:
        """The exact encoding settings of this cell, recorded in every results row."""
        m = self.model
        out = m.encoding_settings()
        out["randomized_positions"] = m.randomized_positions
        if m.randomized_positions:
            out["max_position"] = m.max_position
        if m.attention_window is not None:
            out["attention_window"] = m.attention_window
        return out


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """Every evaluation of one run, in execution order, and how to draw its data.

    Attributes:
      cells: the final evaluation, ordered variant x protocol x length.
      quick: validation during training (training length, trained model as it is).
      kind: ``"corpus"`` or ``"task"``.
      positions: the positions the run feeds its model (``0..L-1`` or randomized).
      train_length: L (tokens for a corpus, the task length for a task).
      split, max_tokens, batch_size: corpus evaluation: which split, how many targets per
        length (the same first targets at every length), windows per batch.
      task, num_examples, seed: task evaluation: the task, examples per length, and the
        seed of their generator.
      context_block, context_targets: the context protocol's scored block S and number of
        targets (the cells' lengths are its context lengths).
    """

    cells: tuple[EvalCell, ...]
    quick: EvalCell
    kind: str
    positions: PositionScheme
    train_length: int
    split: str
    max_tokens: int
    batch_size: int
    task: str
    num_examples: int
    seed: int
    context_block: int = 0
    context_targets: int = 0

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(c.length for c in self.cells))

    @property
    def longest_sequence(self) -> int:
        return max(c.sequence_length for c in self.cells)

    @classmethod
    def build(
        cls,
        model: ModelConfig,
        data: DataConfig,
        eval: EvalConfig,
        *,
        seed: int,
        name: str | None = None,
    ) -> EvalPlan:
        """The plan of a run; raises `ConfigError` naming the field to change.

        ``name``: the subject's name in the labels in place of the encoding's (a pretrained
        model's, e.g. ``"pythia-160m"``, so rows read ``pythia-160m`` and
        ``pythia-160m+yarn``); None: the encoding's label (``rope``, ``rope+yarn``)."""
        spec = model.encoding
        known = {v for n in registry.positional_encoding_names() for v in _variants_of(n)}
        unknown = [v for v in eval.rope_scalings if v not in known]
        if unknown:
            fail(
                "config.eval.rope_scalings",
                eval.rope_scalings,
                f"unknown {unknown}; allowed: {sorted(known)}",
            )
        task = data.open_task() if data.is_task else None
        lengths = tuple(data.train_length * m for m in eval.length_multiples)
        train_seq = data.train_length if task is None else task.sequence_length(data.train_length)
        capacity = None if model.randomized_positions else spec.capacity(model.positional_options)
        if task is not None:
            for length in (data.train_length, *lengths):
                try:
                    task.check_length(length, arg="config.data.train_length x eval multiple")
                except ValueError as e:
                    raise ConfigError(str(e)) from None
        # Randomized positions already span [0, max_position): nothing to interpolate.
        variants = (
            () if model.randomized_positions else model.evaluation_variants(eval.rope_scalings)
        )
        if eval.local_window:
            variants = (*variants, WINDOW)
        protocols = ("task",) if task is not None else eval.protocols
        if "sliding" in protocols and eval.sliding_stride > min(lengths):
            fail(
                "config.eval.sliding_stride",
                eval.sliding_stride,
                f"must be at most the shortest evaluation length {min(lengths)} (0: "
                "stride_fraction x the length)",
            )

        block = eval.context_block or max(1, data.train_length // 2)
        contexts = tuple(
            dict.fromkeys(max(1, round(data.train_length * m)) for m in eval.context_multiples)
        )

        def cell(variant: str, protocol: str, length: int) -> EvalCell:
            if task is not None:
                seq = task.sequence_length(length)
            else:
                seq = length + block - 1 if protocol == "context" else length
            cfg = attention_config(model, seq)
            if variant == WINDOW:
                cfg = cfg.replace(attention_window=eval.local_window)
            elif variant != BASE:
                cfg = cfg.with_rope_scaling(variant, length)
            suffix = RANDOMIZED_SUFFIX if model.randomized_positions else ""
            if capacity is not None and capacity > train_seq and name is None:
                suffix += UNTRAINED_SUFFIX  # positions past L were never trained here
            if variant == WINDOW:
                suffix += "+window"
            encoding = cfg.encoding_label(name)
            label = EvalLabel(
                encoding=encoding + suffix,
                positional=model.positional,
                variant=variant,
                randomized=model.randomized_positions,
            )
            stride = None
            if protocol == "sliding":
                stride = eval.sliding_stride or sliding_stride(length, eval.stride_fraction)
            incremental = cfg.scores_incrementally()
            na = None
            if capacity is not None and seq > capacity:
                na = f"no position embedding past {capacity} (the table has {capacity} rows)"
            return EvalCell(label, cfg, length, protocol, stride, seq, incremental, na)

        def lengths_of(protocol: str) -> tuple[int, ...]:
            return contexts if protocol == "context" else lengths

        cells = tuple(
            cell(v, p, n) for v in (BASE, *variants) for p in protocols for n in lengths_of(p)
        )
        plan = cls(
            cells=cells,
            quick=cell(BASE, protocols[0] if task is not None else PROTOCOLS[0], data.train_length),
            kind="task" if task is not None else "corpus",
            positions=PositionScheme(model.randomized_positions, model.max_position, seed),
            train_length=data.train_length,
            split=eval.split,
            max_tokens=eval.max_tokens,
            batch_size=eval.batch_size,
            task=data.task if task is not None else "",
            num_examples=eval.num_examples,
            seed=seed,
            context_block=block if "context" in protocols else 0,
            context_targets=eval.context_targets if "context" in protocols else 0,
        )
        plan._check_positions(model, train_seq)
        plan._check_max_tokens()
        return plan

    def _check_max_tokens(self) -> None:
        """``max_tokens`` caps the targets of the window protocols (and of validation at L):
        below the longest window it would leave a length without one full window."""
        if self.kind != "corpus" or not self.max_tokens:
            return
        windows = [c for c in (self.quick, *self.cells) if c.protocol in PROTOCOLS[:2]]
        longest = max((c for c in windows if c.na is None), key=lambda c: c.sequence_length)
        if self.max_tokens < longest.sequence_length:
            fail(
                "config.eval.max_tokens",
                self.max_tokens,
                f"must be 0 (every target of the split) or >= the longest evaluation window "
                f"({longest.sequence_length} tokens, protocol {longest.protocol!r})",
            )

    def _check_positions(self, model: ModelConfig, train_seq: int) -> None:
        longest = self.longest_sequence
        check_encodable(model, train_seq, what="the training sequence")
        if model.randomized_positions and model.max_position < longest:
            fail(
                "config.model.max_position",
                model.max_position,
                f"randomized positions need max_position >= the longest evaluation sequence "
                f"({longest} tokens)",
            )

    def check_data(self, dataset: Any) -> None:
        """Raise `ConfigError` if ``dataset`` (the opened corpus) cannot serve the plan."""
        if self.kind != "corpus":
            return
        try:
            dataset.split(self.split).require(self.longest_sequence, what="an evaluation window")
            if self.context_block:
                self.context_starts(dataset.split(self.split))
        except ValueError as e:
            raise ConfigError(f"config.data / config.eval.context_targets: {e}") from None

    @property
    def max_context(self) -> int:
        return max((c.length for c in self.cells if c.protocol == "context"), default=0)

    def context_starts(self, split: Any) -> Any:
        """The context protocol's target blocks in ``split`` (the same for every context)."""
        return split.context_starts(
            max_context=self.max_context,
            block=self.context_block,
            blocks=max(1, self.context_targets // self.context_block),
        )


def _variants_of(name: str) -> tuple[str, ...]:
    return registry.get_positional_encoding(name).eval_variants
