"""Every preset of every study config builds and validates every run of its sweep (no
training): a preset that cannot run fails here, not after a user's install."""

from __future__ import annotations

import importlib

import pytest

from flaxformer_lite.experiments.sweeps import apply_overrides, expand_sweep
from flaxformer_lite.train.run_config import RunConfig

CONFIG_MODULES = ("experiments.extrapolation_lm", "experiments.extrapolation_tasks")
PRESETS = [
    (module, preset)
    for module in CONFIG_MODULES
    for preset in importlib.import_module(module).PRESETS
]


def test_the_presets_are_found():
    assert ("experiments.extrapolation_lm", "cpu") in PRESETS
    assert ("experiments.extrapolation_tasks", "quick") in PRESETS


@pytest.mark.parametrize(("module", "preset"), PRESETS)
def test_every_run_of_every_preset_validates(module, preset):
    config = importlib.import_module(module).get_config(preset)
    sweep = expand_sweep(config)
    assert sweep, f"{module}:{preset} has no cells"
    names = [cell["name"] for cell in sweep]
    assert len(set(names)) == len(names)
    for cell in sweep:
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        assert run.eval_plan() is not None  # every evaluation cell is buildable


def test_associative_recall_holds_the_task_studies_longest_length():
    """64 pairs (16 x 4, the task studies' longest evaluation): distinct keys per row, and
    the one scored target is the value that followed the queried key."""
    import numpy as np

    from flaxformer_lite.data import get_task

    task = get_task("associative_recall")
    assert task.max_length == 83
    batch = task.sample(np.random.default_rng(0), 32, 64)
    seq = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)  # [B, 2n + 3]
    assert seq.shape == (32, 2 * 64 + 3)
    for row, mask in zip(seq, batch["loss_mask"], strict=True):
        keys, values = row[0:128:2], row[1:128:2]
        assert len(set(keys.tolist())) == 64 and all(chr(k) not in "0123456789? " for k in keys)
        assert row[128] == ord("?") and np.flatnonzero(mask).tolist() == [129]
        (where,) = np.flatnonzero(keys == row[129])
        assert row[130] == values[where]
    with pytest.raises(ValueError, match=r"must be in \[1, 83\], got 84"):
        task.sample(np.random.default_rng(0), 1, 84)
