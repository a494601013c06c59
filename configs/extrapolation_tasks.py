r"""Length generalisation on synthetic tasks: train on task lengths 1..L, test up to 4L.

Usage (installed as ``flaxformer_lite.configs.extrapolation_tasks``: by name, or by path)::

    flaxformer-lite study --config=extrapolation_tasks:quick --workdir=runs/tasks
    python scripts/run_study.py --config=configs/extrapolation_tasks.py:quick \
        --workdir=runs/tasks

Each training batch draws its task length uniformly from ``[min_length, L]`` (one sequence
length per batch, padded to the sequence length of L). Evaluation scores exact match
(every answer byte right, teacher-forced) on 256 fresh examples at ``L x {1, 2, 4}`` -- the
setting of Kazemnejad et al. 2023 (train <= 20, test <= 40) extended to 4x.

Presets: ``tiny`` (tests), ``quick`` (3 tasks x 5 encodings, 1 seed, CPU), ``cpu`` (3 seeds),
``all`` (every registered encoding family, CPU-sized), ``passkey`` (passkey retrieval at
L = 128, the 5 encodings x 3 seeds, evaluated at 128, 256 and 512 bytes; see `_passkey` for
its cost). The sweep is ``config.sweep``: every task x encoding x seed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections

from flaxformer_lite.train.sizing import size_to_training_length


def _sibling(name: str):
    """Load ``configs/<name>.py`` by path (config files are loaded by path, not package)."""
    path = Path(__file__).with_name(name + ".py")
    spec = importlib.util.spec_from_file_location(f"_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


extrapolation_lm = _sibling("extrapolation_lm")

TASKS = ("copy", "reverse", "associative_recall")
# The `passkey` preset's training: steps and sequences per step (see `_passkey`).
PASSKEY_STEPS, PASSKEY_BATCH = 1000, 32


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not known; allowed: {sorted(PRESETS)}")
    c = extrapolation_lm.get_config("quick")
    c.study = "extrapolation_tasks"
    c.preset = preset
    c.data.update(source="task", corpus="", task=TASKS[0], train_length=16, batch_size=64)
    c.model.update(d_model=64, num_heads=4, d_ff=256, num_decoder_layers=2)
    c.optim.update(learning_rate=3e-3, warmup_steps=100)
    # one step per compiled call (extrapolation_lm's quick takes 10): not measured on the tasks
    c.train.update(num_steps=1500, log_every=100, checkpoint_every=500, steps_per_call=1)
    c.eval.update(length_multiples=(1, 2, 4), num_examples=256, batch_size=64)
    c.sweep.unlock()
    c.sweep.tasks = TASKS  # one run per task x encoding x seed
    c.sweep.lock()
    PRESETS[preset](c)
    # options sized to the task sequences' lengths at L and at the longest evaluation;
    # RoPE's original_length is L (the plan scales by evaluation length / original length)
    size_to_training_length(c)
    return c


def _tiny(c: ml_collections.ConfigDict) -> None:
    c.model.update(d_model=32, num_heads=2, d_ff=64, num_decoder_layers=1)
    c.data.update(train_length=4, batch_size=8)
    c.optim.update(warmup_steps=2)
    c.train.update(num_steps=6, log_every=3, checkpoint_every=6, progress=False)
    c.eval.update(length_multiples=(1, 2), num_examples=16, batch_size=16)
    c.sweep.tasks = ("copy",)


def _quick(c: ml_collections.ConfigDict) -> None:
    del c


def _cpu(c: ml_collections.ConfigDict) -> None:
    c.sweep.seeds = (0, 1, 2)


def _all(c: ml_collections.ConfigDict) -> None:
    c.sweep.encodings = extrapolation_lm.ALL_ENCODINGS
    c.sweep.randomized = extrapolation_lm.ALL_RANDOMIZED


def _passkey(c: ml_collections.ConfigDict) -> None:
    # Passkey retrieval (Mohtashami & Jaggi 2023): a 5-digit key in filler text, asked for at
    # the end. A sequence needs >= 101 bytes, so L = 128 (training lengths 101..128) and the
    # evaluation reaches 512; 128 examples per length (16 blocks of 8 for the bootstrap).
    # Learnable in the budget: nice'd 600-step probes reached exact match 1.0 (RoPE) and 0.24
    # (NoPE) at 1x. Cost, from nice'd probes on the shared 2-core machine scaled by 0.46
    # (the quick LM's unshared / probed step time, as in extrapolation_lm._scaling): ~59 ms
    # per step (128 ms probed CPU time), so ~59 s of training + ~3 s of evaluation + ~5 s of
    # start-up per run, 15 runs = ~17 min on 2 idle cores (16-20 min over the calibration's
    # spread).
    c.sweep.tasks = ("passkey",)
    c.sweep.seeds = (0, 1, 2)
    c.data.update(train_length=128, batch_size=PASSKEY_BATCH)
    c.train.update(num_steps=PASSKEY_STEPS, checkpoint_every=PASSKEY_STEPS)
    c.eval.update(num_examples=128, batch_size=32)


PRESETS = {"tiny": _tiny, "quick": _quick, "cpu": _cpu, "all": _all, "passkey": _passkey}
