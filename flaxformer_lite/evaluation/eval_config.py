"""How a run is evaluated: the ``config.eval`` section as a frozen dataclass."""

from __future__ import annotations

import dataclasses

from flaxformer_lite.base.checks import fail
from flaxformer_lite.nn.model_config import TEMPERATURE_VARIANTS

PROTOCOLS = ("nonoverlapping", "sliding", "context")
SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    length_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)  # eval lengths = L x these
    # and L / these (each >= 2, dividing L): lengths below a pretrained model's training
    # context, its in-distribution curve (a trained run's say nothing about extrapolation)
    length_divisors: tuple[int, ...] = ()
    # "nonoverlapping", "sliding" (windows advance by stride_fraction x length) and/or
    # "context" (the same targets at every context length: evaluation.protocols.Context)
    protocols: tuple[str, ...] = ("nonoverlapping",)
    stride_fraction: float = 0.5  # sliding window stride = eval_length * this (>= 1 token)
    # > 0: the sliding stride in tokens at every length instead (1: every target with a full
    # window of context, the ALiBi paper's stride-1 analysis; costs eval_length x the
    # non-overlapping protocol)
    sliding_stride: int = 0
    context_multiples: tuple[float, ...] = (0.5, 1, 2, 4, 8, 16)  # context c = L x these
    context_block: int = 0  # S scored targets per context window; 0: L / 2
    context_targets: int = 65536  # targets of the context protocol (blocks of S bytes)
    # 0: every target of the split; N: only the targets within its first N + 1 bytes of text
    # (N targets of a byte-level model; the same text for every tokenizer): smoke presets, and
    # models with different tokenizers scored on the same bytes
    max_bytes: int = 0
    batch_size: int = 8  # windows per evaluation batch
    split: str = "validation"  # "validation" or "test"
    num_examples: int = 256  # task sequences scored per length
    rope_scalings: tuple[str, ...] = ()  # extra rows where RoPE scaling applies: "pi", ...
    # extra rows with a training-free query temperature (ModelConfig.with_temperature): "logn"
    # (Qwen), "llama4"; rows "rope+logn". Not for a model with a learned one (SSMax)
    temperatures: tuple[str, ...] = ()
    # > 0: every encoding is also evaluated with windowed causal attention (each query sees at
    # most its last local_window keys; rows "+window"): xPos's blockwise-causal setting
    # (Sun et al. 2022) and what a sliding window alone buys. 0: no such rows.
    local_window: int = 0
    # > 0 (with local_window): also rows with StreamingLLM's attention (Xiao et al. 2023, arXiv
    # 2309.17453), the local_window last keys plus the first streaming_first keys of the window
    # (rows "+streaming"). 0: no such rows.
    streaming_first: int = 0
    # the report's paired-differences table: every encoding against this one (its row label),
    # or every pair with paired_all
    paired_reference: str = "alibi"
    paired_all: bool = False

    def validate(self) -> None:
        """Static checks; raises `ConfigError` naming ``config.eval.*``."""

        def bad(name: str, allowed: str) -> None:
            fail(f"config.eval.{name}", getattr(self, name), allowed)

        if not self.length_multiples:
            bad("length_multiples", "must list at least one")
        if any(m < 1 for m in self.length_multiples):
            bad(
                "length_multiples",
                "each multiple must be >= 1 (an eval length shorter than the training length "
                "says nothing about extrapolation)",
            )
        if any(d < 2 for d in self.length_divisors):
            bad("length_divisors", "each must be >= 2 (evaluation lengths L / d; () for none)")
        names = ("length_multiples", "length_divisors", "protocols", "context_multiples")
        for name in (*names, "rope_scalings", "temperatures"):
            values = getattr(self, name)
            if len(set(values)) != len(values):  # each would be evaluated, and its rows, twice
                repeated = next(v for i, v in enumerate(values) if v in values[:i])
                bad(name, f"lists {repeated!r} twice; each value at most once")
        if any(p not in PROTOCOLS for p in self.protocols):
            bad("protocols", f"each must be one of {list(PROTOCOLS)}")
        if not 0 < self.stride_fraction <= 1:
            bad("stride_fraction", "must be in (0, 1]")
        if self.sliding_stride < 0:
            bad("sliding_stride", "must be >= 0 (0: stride_fraction x the evaluation length)")
        if "context" in self.protocols:
            if not self.context_multiples or any(m <= 0 for m in self.context_multiples):
                bad("context_multiples", "must list context lengths as positive multiples of L")
            if self.context_block < 0:
                bad("context_block", "must be >= 0 (0: L / 2)")
            if self.context_targets <= 0:
                bad("context_targets", "must be > 0")
        for name in ("batch_size", "num_examples"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        if self.max_bytes < 0:
            bad("max_bytes", "must be >= 0 (0: the whole split)")
        if self.local_window < 0:
            bad("local_window", "must be >= 0 (0: no windowed rows)")
        if self.streaming_first < 0 or (self.streaming_first and not self.local_window):
            bad(
                "streaming_first",
                "must be >= 0, and > 0 only with config.eval.local_window > 0 (the first keys "
                "are kept beside that window; 0: no StreamingLLM rows)",
            )
        if any(t not in TEMPERATURE_VARIANTS for t in self.temperatures):
            bad("temperatures", f"each must be one of {list(TEMPERATURE_VARIANTS)}")
        if self.split not in SPLITS:
            bad("split", f"allowed: {list(SPLITS)}")


def evaluation_lengths(train_length: int, eval: EvalConfig) -> list[int]:
    """The evaluation lengths of a run, ascending: ``L / d`` for ``eval.length_divisors``
    (`ConfigError` unless ``d`` divides ``L``), then ``L x m`` for ``eval.length_multiples``."""
    for d in eval.length_divisors:
        if train_length % d:
            fail(
                "config.eval.length_divisors",
                eval.length_divisors,
                f"each must divide the training length {train_length} (evaluation lengths L / d "
                "are whole tokens)",
            )
    shorter = [train_length // d for d in sorted(eval.length_divisors, reverse=True)]
    return shorter + [train_length * m for m in eval.length_multiples]
