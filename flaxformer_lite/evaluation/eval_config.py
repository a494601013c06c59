"""How a run is evaluated: the ``config.eval`` section as a frozen dataclass."""

from __future__ import annotations

import dataclasses

from flaxformer_lite.base.checks import fail

PROTOCOLS = ("nonoverlapping", "sliding")
SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    length_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)  # eval lengths = L x these
    protocols: tuple[str, ...] = ("nonoverlapping",)  # "nonoverlapping" and/or "sliding"
    stride_fraction: float = 0.5  # sliding window stride S = eval_length * this (>= 1 token)
    max_tokens: int = 65536  # score this many tokens of the split at every length
    batch_size: int = 8  # windows per evaluation batch
    split: str = "validation"  # "validation" or "test"
    num_examples: int = 256  # task sequences scored per length
    rope_scalings: tuple[str, ...] = ()  # extra rows where RoPE scaling applies: "pi", ...
    # > 0: every encoding is also evaluated with windowed causal attention (each query sees at
    # most its last local_window keys; rows "+window"): xPos's blockwise-causal setting
    # (Sun et al. 2022) and what a sliding window alone buys. 0: no such rows.
    local_window: int = 0

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
        if any(p not in PROTOCOLS for p in self.protocols):
            bad("protocols", f"each must be one of {list(PROTOCOLS)}")
        if not 0 < self.stride_fraction <= 1:
            bad("stride_fraction", "must be in (0, 1]")
        for name in ("max_tokens", "batch_size", "num_examples"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        if self.local_window < 0:
            bad("local_window", "must be >= 0 (0: no windowed rows)")
        if self.split not in SPLITS:
            bad("split", f"allowed: {list(SPLITS)}")
