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
from flaxformer_lite.data.windows import KEY_NGRAM
from flaxformer_lite.evaluation.eval_config import PROTOCOLS, EvalConfig, evaluation_lengths
from flaxformer_lite.evaluation.protocols import Context, TaskLength, Windows
from flaxformer_lite.evaluation.score import attention_config, sliding_stride
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.model_config import TEMPERATURE_VARIANTS, ModelConfig, check_encodable

BASE = "base"  # the variant name of the trained model evaluated as it is
WINDOW = "window"  # the variant: windowed causal attention (config.eval.local_window keys)
# the variant: that window plus the first config.eval.streaming_first keys (StreamingLLM)
STREAMING = "streaming"
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
    """One evaluation: a model config and a protocol value.

    Attributes:
      label: what the rows of this cell are about.
      model: the config the trained parameters are evaluated under (same parameter shapes:
        only the attention implementation and an evaluation-time variant differ).
      scoring: the protocol (`protocols.Windows`, `protocols.Context`,
        `protocols.TaskLength`): what is scored and how its targets form blocks.
      incremental: score token by token through the KV cache, so that each target sees
        exactly its prefix (the registry says when: dynamic NTK reads the current length).
      na: why the model cannot be evaluated here (None: it can), e.g. a learned table with no
        row past the training length; such a cell is reported as "n/a", never as a number.
      same_as: the index in the plan of the base cell whose numbers this one repeats, when
        its variant changes no number of the model at this length (a RoPE scaling at ``s =
        1``: `ModelConfig.variant_is_identity`); None: it is scored.
    """

    label: EvalLabel
    model: ModelConfig
    scoring: Windows | Context | TaskLength
    incremental: bool = False
    na: str | None = None
    same_as: int | None = None

    @property
    def protocol(self) -> str:
        """``"nonoverlapping"``, ``"sliding"``, ``"context"`` or ``"task"``."""
        return self.scoring.name

    @property
    def length(self) -> int:
        """Windows: the window length; context: the context length; task: the task length."""
        return getattr(self.scoring, "context", None) or self.scoring.length

    @property
    def stride(self) -> int | None:
        """The sliding-window stride (None for non-overlapping windows, contexts and tasks)."""
        return self.scoring.stride if self.protocol == "sliding" else None

    @property
    def sequence_length(self) -> int:
        """Tokens per evaluated sequence (the window, or the task's sequence)."""
        return self.scoring.sequence_length

    def encoding_options(self) -> dict[str, Any]:
        """The exact encoding settings of this cell, recorded in every results row."""
        m = self.model
        out = m.encoding_settings()
        out["randomized_positions"] = m.randomized_positions
        if m.randomized_positions:
            out["max_position"] = m.max_position
        for field in ("attention_window", "attention_keep_first"):
            if getattr(m, field) is not None:
                out[field] = getattr(m, field)
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
      split: corpus evaluation: which split.
      batch_size: windows (examples) per batch.
    """

    cells: tuple[EvalCell, ...]
    quick: EvalCell
    kind: str
    positions: PositionScheme
    train_length: int
    split: str
    batch_size: int

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
        _check_rope_scalings(eval)
        task = data.open_task() if data.is_task else None
        if task is not None:
            scorings = _task_scorings(task, data, eval, seed)
            train_seq = task.sequence_length(data.train_length)
            quick = TaskLength(data.train_length, eval.num_examples, seed, sequence=train_seq)
        else:
            scorings = _corpus_scorings(data, eval)
            train_seq = data.train_length
            # validation during training: the training length, at most QUICK_EVAL_TOKENS
            cap = min(eval.max_bytes or QUICK_EVAL_TOKENS, QUICK_EVAL_TOKENS)
            quick = Windows(data.train_length, max_bytes=cap, train_length=data.train_length)
        # Randomized positions already span [0, max_position): nothing to interpolate.
        variants = (
            ()
            if model.randomized_positions
            else (
                *model.evaluation_variants(eval.rope_scalings),
                *model.evaluation_temperatures(eval.temperatures),
            )
        )
        if eval.local_window:
            variants = (*variants, WINDOW)
        if eval.streaming_first:
            variants = (*variants, STREAMING)
        cell = _CellMaker(model, eval, name, train_seq)
        plan = cls(
            # the base cells come first: a variant's cell repeating the base names its index
            cells=tuple(cell(v, s, i) for v in (BASE, *variants) for i, s in enumerate(scorings)),
            quick=cell(BASE, quick, None),
            kind="task" if task is not None else "corpus",
            positions=PositionScheme(model.randomized_positions, model.max_position, seed),
            train_length=data.train_length,
            split=eval.split,
            batch_size=eval.batch_size,
        )
        plan._check_positions(model, train_seq)
        plan._check_max_bytes(eval.max_bytes)
        return plan

    def _check_max_bytes(self, max_bytes: int) -> None:
        """``max_bytes`` caps the targets of the window protocols: below the longest window
        it would leave a length without one full window (of a byte-level model)."""
        if self.kind != "corpus" or not max_bytes:
            return
        windows = [c for c in self.cells if c.protocol in PROTOCOLS[:2] and c.na is None]
        longest = max(windows, key=lambda c: c.sequence_length, default=None)
        if longest is not None and max_bytes < longest.sequence_length:
            fail(
                "config.eval.max_bytes",
                max_bytes,
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
        """Raise `ConfigError` if ``dataset`` (the opened corpus, or its tokenized form: the
        one that will be scored) cannot serve the plan."""
        if self.kind != "corpus":
            return
        split = dataset.split(self.split)
        try:
            split.require(self.longest_sequence, what="an evaluation window")
            for cell in self.cells:
                if cell.protocol == "context":
                    cell.scoring.starts(split)
                elif cell.na is None and cell.scoring.max_bytes:  # a window within the cap
                    split.require(
                        cell.sequence_length,
                        limit=split.tokens_within(cell.scoring.max_bytes),
                        what="an evaluation window",
                    )
        except ValueError as e:
            raise ConfigError(f"config.data / config.eval.context_targets: {e}") from None


class _CellMaker:
    """``cell(variant, scoring)``: one `EvalCell` of a plan, its model config decided for
    its sequence length and variant, its label and whether it can be evaluated."""

    def __init__(self, model: ModelConfig, eval: EvalConfig, name: str | None, train_seq: int):
        self.model, self.eval, self.name, self.train_seq = model, eval, name, train_seq
        spec = model.encoding
        self.capacity = (
            None if model.randomized_positions else spec.capacity(model.positional_options)
        )

    def __call__(
        self, variant: str, scoring: Windows | Context | TaskLength, base: int | None
    ) -> EvalCell:
        """``base``: the index of the plan's base cell with this ``scoring``."""
        model = self.model
        seq = scoring.sequence_length
        length = getattr(scoring, "context", None) or scoring.length
        cfg = attention_config(model, seq)
        same_as = None
        if variant == WINDOW:
            cfg = cfg.replace(attention_window=self.eval.local_window)
        elif variant == STREAMING:
            cfg = cfg.replace(
                attention_window=self.eval.local_window,
                attention_keep_first=self.eval.streaming_first,
            )
        elif variant in TEMPERATURE_VARIANTS:  # a query temperature, tuned at the training length
            cfg = cfg.with_temperature(variant, self.train_seq)
        elif variant != BASE:
            cfg = cfg.with_rope_scaling(variant, length)
            if model.variant_is_identity(variant, max(length, seq)):
                same_as = base
        suffix = RANDOMIZED_SUFFIX if model.randomized_positions else ""
        if self.capacity is not None and self.capacity > self.train_seq and self.name is None:
            suffix += UNTRAINED_SUFFIX  # positions past L were never trained here
        if variant in (WINDOW, STREAMING):
            suffix += f"+{variant}"
        encoding = cfg.encoding_label(self.name)
        label = EvalLabel(encoding + suffix, model.positional, variant, model.randomized_positions)
        na = None
        if self.capacity is not None and seq > self.capacity:
            na = f"no position embedding past {self.capacity} (the table has {self.capacity} rows)"
        incremental = cfg.scores_incrementally()
        return EvalCell(label, cfg, scoring, incremental, na, same_as)


def _check_rope_scalings(eval: EvalConfig) -> None:
    known = {
        v
        for n in registry.positional_encoding_names()
        for v in registry.get_positional_encoding(n).eval_variants
    }
    unknown = [v for v in eval.rope_scalings if v not in known]
    if unknown:
        fail(
            "config.eval.rope_scalings",
            eval.rope_scalings,
            f"unknown {unknown}; allowed: {sorted(known)}",
        )


def _corpus_scorings(data: DataConfig, eval: EvalConfig) -> list[Windows | Context]:
    """The window and context protocols of a corpus run, protocol x length."""
    lengths = evaluation_lengths(data.train_length, eval)
    cap, L = eval.max_bytes or None, data.train_length
    out: list[Windows | Context] = []
    for protocol in eval.protocols:
        if protocol == "context":
            block = eval.context_block or max(1, L // 2)
            contexts = list(dict.fromkeys(max(1, round(L * m)) for m in eval.context_multiples))
            far = max(contexts)  # key targets: copied from beyond L, within the longest context
            near = L if KEY_NGRAM <= L < far else None
            out += [Context(c, block, far, eval.context_targets, key_near=near) for c in contexts]
            continue
        if protocol == "sliding" and eval.sliding_stride > min(lengths):
            fail(
                "config.eval.sliding_stride",
                eval.sliding_stride,
                f"must be at most the shortest evaluation length {min(lengths)} (0: "
                "stride_fraction x the length)",
            )
        for n in lengths:
            stride = None
            if protocol == "sliding":
                stride = eval.sliding_stride or sliding_stride(n, eval.stride_fraction)
            out.append(Windows(n, stride, max_bytes=cap, train_length=L))
    return out


def _task_scorings(task: Any, data: DataConfig, eval: EvalConfig, seed: int) -> list[TaskLength]:
    """One `TaskLength` per evaluation length of a task run (lengths checked against it)."""
    lengths = [data.train_length * m for m in eval.length_multiples]
    for length in (data.train_length, *lengths):
        try:
            task.check_length(length, arg="config.data.train_length x eval multiple")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return [
        TaskLength(n, eval.num_examples, seed, sequence=task.sequence_length(n)) for n in lengths
    ]
