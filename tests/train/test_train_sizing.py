"""train.sizing: options sized to the training length follow an override of L."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite.train import sizing
from flaxformer_lite.train.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]
# option -> (encoding, field) on the resolved ModelConfig
FIELDS = {
    "positional_options.learned.max_length": ("learned", "max_length"),
    "positional_options.rope.original_length": ("rope", "original_length"),
    "positional_options.p_rope.original_length": ("p_rope", "original_length"),
    "positional_options.t5.max_distance": ("t5", "max_distance"),
    "positional_options.t5.num_buckets": ("t5", "num_buckets"),
    "positional_options.fire.threshold_init": ("fire", "threshold_init"),
    "positional_options.xpos.scale_base": ("xpos", "scale_base"),
}


def _resolved(config, encoding: str) -> RunConfig:
    config.model.positional = encoding
    return RunConfig.from_config(config)


def _sized(run: RunConfig, path: str):
    if path == "max_position":
        return run.model.max_position
    return getattr(run.model.positional_options, FIELDS[path][1])


def test_every_sized_option_has_a_closed_form_value_for_l_128():
    values = sizing.sized_values({"train_length": 128, "length": 128, "longest": 2048})
    assert set(values) == set(sizing.SIZED_OPTIONS)
    assert values == {
        "max_position": 2048,
        "positional_options.learned.max_length": 128,
        "positional_options.rope.original_length": 128,
        "positional_options.p_rope.original_length": 128,
        "positional_options.t5.max_distance": 32,
        "positional_options.t5.num_buckets": 32,
        "positional_options.fire.threshold_init": 32.0,
        "positional_options.xpos.scale_base": 64.0,
    }
    # a short L keeps T5's max_distance above its exact buckets
    small = sizing.sized_values({"train_length": 8, "length": 8, "longest": 32})
    assert small["positional_options.t5.max_distance"] == 3
    assert small["positional_options.t5.num_buckets"] == 4


@pytest.mark.parametrize("path", [*sorted(FIELDS), "max_position"])
def test_an_override_of_l_resizes_every_sized_option(path):
    encoding = FIELDS.get(path, ("rope",))[0]
    base = _resolved(extrapolation_lm.get_config("quick"), encoding)
    config = extrapolation_lm.get_config("quick")
    config.data.train_length = 128
    run = _resolved(config, encoding)
    want = sizing.sized_values({"train_length": 128, "length": 128, "longest": 128 * 16})
    assert _sized(run, path) == want[path] != _sized(base, path)


def test_an_option_set_by_hand_is_kept_when_l_changes():
    config = extrapolation_lm.get_config("quick")
    config.data.train_length = 128
    config.model.positional_options.t5.max_distance = 20  # not the value sized for L = 64
    run = _resolved(config, "t5")
    assert run.model.positional_options.max_distance == 20
    assert run.model.positional_options.num_buckets == 32  # still follows L


def test_task_lengths_follow_l_through_the_task_sequence_length():
    config = extrapolation_tasks.get_config("quick")
    config.data.train_length = 32
    run = _resolved(config, "learned")
    # copy at L = 32 has 2 x 32 + 2 tokens per sequence (the longest of the sweep's tasks)
    assert run.model.positional_options.max_length == max(
        sizing.get_task(t).sequence_length(32) for t in config.sweep.tasks
    )
    assert _resolved(config, "rope").model.positional_options.original_length == 32


def test_a_malformed_sizing_record_is_refused_naming_the_field():
    config = extrapolation_lm.get_config("tiny")
    config.sizing = {"train_length": 16}
    config.data.train_length = 32
    with pytest.raises(ConfigError, match=r"config\.sizing=.*train_length, length and longest"):
        RunConfig.from_config(config)


def test_the_command_line_override_reaches_the_recorded_identity(tmp_path):
    """``flaxformer-lite train --config.data.train_length=128``: the run's recorded identity
    has every option sized for L = 128 (here FIRE's; the position range scales with L, 16 x 4 ->
    128 x 4, and not with the evaluation lengths, which change no number without randomized
    positions)."""
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "flaxformer_lite",
        "train",
        "--config=extrapolation_lm:tiny",
        f"--workdir={workdir}",
        "--config.model.positional=fire",
        "--config.data.train_length=128",
        "--config.model.d_model=16",
        "--config.model.num_decoder_layers=1",
        "--config.train.num_steps=2",
        "--config.eval.length_multiples=(1,)",
        "--config.eval.max_bytes=256",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    identity = json.loads((workdir / "identity.json").read_text())
    model = identity["config"]["model"] if "config" in identity else identity["model"]
    assert model["max_position"] == 512
    assert model["positional_options"]["threshold_init"] == 32.0


def test_randomized_positions_reach_the_longest_context_window():
    """The context protocol's window at c = 16L holds c + S - 1 = 1024 + 32 - 1 tokens; a
    study that trains on randomized positions needs them all, one that does not keeps 16L."""
    assert extrapolation_lm.get_config("families").model.max_position == 1055
    assert extrapolation_lm.get_config("cpu").model.max_position == 1024
    config = extrapolation_lm.get_config("families")
    config.data.train_length = 128  # resized with L: 2048 + 64 - 1
    assert RunConfig.from_config(config).model.max_position == 2111


def test_new_evaluation_lengths_keep_the_sized_options_without_randomized_positions():
    config = extrapolation_lm.get_config("quick")
    config.eval.length_multiples = (1, 2)
    assert _resolved(config, "rope").model.max_position == 1024  # as sized: no number changes
    config = extrapolation_lm.get_config("families")  # randomized RoPE: the range must follow
    config.eval.length_multiples = (1, 2)
    config.eval.protocols = ("nonoverlapping",)
    assert RunConfig.from_config(config).model.max_position == 128
