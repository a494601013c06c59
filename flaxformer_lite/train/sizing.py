"""Encoding options sized to the training length L, and resized when L is overridden.

Several options are set relative to L, as their sources use them (docs/encodings.md, "Sized to
the training length"): a learned table's rows, the range of randomized positions, RoPE's
``original_length``, T5's ``max_distance`` and bucket count, FIRE's threshold and xPos's scale.
`size_to_training_length` sets them in a config and records, under ``config.sizing``, the
lengths it sized them for. `resize` is applied by `RunConfig.from_config`: when the config's
lengths (``data.train_length``, the evaluation multiples, the tasks) differ from the recorded
ones -- an override such as ``--config.data.train_length=128`` -- every sized option that
still holds its value for the recorded lengths is set to its value for the new ones; an option
set by hand to another value is kept. Without randomized positions ``max_position`` changes no
number, so it scales with L but not with new evaluation lengths (those keep the training and its
identity). The resized values are model options, so they are part of the run's identity.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from flaxformer_lite.data.registry import get_task, task_names

# the option paths `sized_values` sets, below config.model
SIZED_OPTIONS = (
    "max_position",
    "positional_options.learned.max_length",
    "positional_options.rope.original_length",
    "positional_options.p_rope.original_length",
    "positional_options.t5.max_distance",
    "positional_options.t5.num_buckets",
    "positional_options.fire.threshold_init",
    "positional_options.xpos.scale_base",
)

# what ``config.sizing`` records (`sizing_lengths`): set with the preset, not an override
RECORDED_LENGTHS = {
    "train_length": "L the sized options were set for (recorded: an override of L resizes them)",
    "length": "tokens per training sequence the sized options were set for (recorded)",
    "longest": "tokens of the longest evaluation sequence they were set for (recorded)",
}


def sizing_lengths(config: Mapping[str, Any]) -> dict[str, int] | None:
    """The lengths the sized options follow: ``train_length`` (L), ``length`` (tokens per
    training sequence: L, or a task's sequence length at L) and ``longest`` (tokens of the
    longest evaluation sequence, a context-protocol window included); None for a task config
    that names no known task (its validation says so)."""
    data, evaluation = config["data"], config["eval"]
    train_length = int(data["train_length"])
    longest = train_length * max(evaluation["length_multiples"])
    if _randomized(config) and "context" in tuple(evaluation.get("protocols", ())):
        # randomized positions must reach a context window too: c bytes of context and S
        # scored targets, c + S - 1 tokens (max_position matters only with randomized positions)
        block = int(evaluation.get("context_block") or 0) or train_length // 2
        context = int(train_length * max(evaluation.get("context_multiples") or (0,)))
        longest = max(longest, context + block - 1)
    if data.get("source") == "task":
        names = tuple(config.get("sweep", {}).get("tasks", ())) or (data.get("task"),)
        known = set(task_names())
        if not all(name in known for name in names):
            return None  # the data config's validation names the task
        tasks = [get_task(name) for name in names]
        return {
            "train_length": train_length,
            "length": max(t.sequence_length(train_length) for t in tasks),
            "longest": max(t.sequence_length(longest) for t in tasks),
        }
    return {"train_length": train_length, "length": train_length, "longest": longest}


def _randomized(config: Mapping[str, Any]) -> bool:
    """Whether the config (or its sweep) trains on randomized positions."""
    return bool(config.get("sweep", {}).get("randomized")) or bool(
        config["model"].get("randomized_positions")
    )


def sized_values(lengths: Mapping[str, int]) -> dict[str, Any]:
    """The value of every `SIZED_OPTIONS` path for ``lengths`` (`sizing_lengths`)."""
    length, longest = lengths["length"], lengths["longest"]
    max_distance = max(length // 4, 3)
    return {
        # Randomized positions (Ruoss et al. 2023) are drawn from [0, max_position), which
        # must reach every evaluation length.
        "max_position": longest,
        # A learned table has L rows: positions past L have no embedding, and the tables
        # report "n/a" there instead of numbers from untrained rows.
        "positional_options.learned.max_length": length,
        # The length RoPE scalings at evaluation extend from: L (for tasks too: the plan
        # scales by evaluation length / original length, both task lengths).
        "positional_options.rope.original_length": lengths["train_length"],
        "positional_options.p_rope.original_length": lengths["train_length"],
        # T5 (Raffel et al. 2020): max_distance 128 with inputs of 512 tokens, i.e. L / 4, so
        # the shared last bucket (every distance >= max_distance) is trained; 32 buckets,
        # fewer when L / 4 < 32 so that max_distance stays above the exact buckets.
        "positional_options.t5.max_distance": max_distance,
        "positional_options.t5.num_buckets": max(4, min(32, 2 * (max_distance // 2))),
        # FIRE (Li et al. 2024): the learned threshold starts at L / 4, the public default 512
        # with the 2048-token training of its LM experiments.
        "positional_options.fire.threshold_init": length / 4,
        # xPos (Sun et al. 2022; torchscale XPOS): scale_base 512 with training length 1024.
        "positional_options.xpos.scale_base": length / 2,
    }


_ABSENT = object()


def _get(model: Any, path: str) -> Any:
    """The value at ``path`` below ``model``, or `_ABSENT` (a config without that option)."""
    node = model
    for key in path.split("."):
        try:
            node = node[key]
        except (KeyError, TypeError, AttributeError):
            return _ABSENT
    return node


def _set(model: Any, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node: Any = model
    for key in parents:
        node = node[key]
    node[leaf] = value


def size_to_training_length(c: Any) -> None:
    """Set every sized option of config ``c`` (a ConfigDict) for its lengths, and record them
    as ``c.sizing``; call after the preset sets L."""
    lengths = sizing_lengths(c)
    if lengths is None:
        raise ValueError(f"config.data.task={c['data'].get('task')!r}: not a known task")
    for path, value in sized_values(lengths).items():
        if _get(c["model"], path) is not _ABSENT or path == "max_position":
            _set(c["model"], path, value)
    c["sizing"] = dict(lengths)


def resize(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a plain nested dict of a config) with its sized options resized to its
    current lengths (the module docstring); unchanged without ``sizing`` or when the lengths
    are the recorded ones."""
    recorded = values.get("sizing")
    if not recorded:
        return dict(values)
    if not isinstance(recorded, Mapping) or set(recorded) != {"train_length", "length", "longest"}:
        raise ValueError(
            f"config.sizing={recorded!r} must map train_length, length and longest to the "
            "lengths the options were sized for (set by size_to_training_length)"
        )
    current = sizing_lengths(values)
    if current is not None and not _randomized(values):
        # without randomized positions max_position changes no number: it follows L, but new
        # evaluation lengths keep the training (and its identity)
        longest = recorded["longest"] * current["length"] // recorded["length"]
        current = dict(current, longest=longest)
    if current is None or dict(current) == dict(recorded):
        return dict(values)
    old, new = sized_values(recorded), sized_values(current)
    out = copy.deepcopy(dict(values))
    for path, value in new.items():
        have = _get(out["model"], path)
        if have is not _ABSENT and have == old[path]:  # not set by hand: follows L
            _set(out["model"], path, value)
    out["sizing"] = dict(current)
    return out
