"""`train_and_evaluate(config, workdir)`: one complete, resumable run.

Build data and model, restore the newest checkpoint in ``workdir`` if there is one, train
with a jit-compiled step, evaluate periodically and at every evaluation length at the end,
and leave in ``workdir``::

    config.json        the resolved configuration (and a run of a different one is refused)
    checkpoints/       orbax checkpoints (every `checkpoint_every` steps and at the end)
    metrics.jsonl      training/validation metrics, one JSON object per line
    tensorboard/       the same metrics as TensorBoard events
    eval.json          the final evaluation at every length (written atomically, last)
    provenance.json    commit, package versions, backend, device, corpus hash

Training is deterministic given the config: the batch of step ``t`` is drawn from
``np.random.default_rng([seed, t])``, so a resumed run sees exactly the batches an
uninterrupted one would have seen.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.base import faults
from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.evaluation import run as run_evaluation
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train import allocator, batches, provenance, sharding
from flaxformer_lite.train.checkpoint import Checkpointer
from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import ConfigError, RunConfig
from flaxformer_lite.train.step import init_train_state, make_train_step
from flaxformer_lite.train.writer import MetricsWriter

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or Inf metric; the message names the step and the metric."""


def prepare_process(run: RunConfig) -> None:
    """What a process does before a run touches a device (the one preamble of
    `train_and_evaluate` and the study runner): keep freed host memory on CPU (before JAX's
    CPU client starts), read the git commit now (rows must name the code that ran, not a
    commit made while it ran), and join the other hosts when ``run.mesh.multihost``."""
    allocator.configure_host_allocator()
    provenance.git_commit()
    sharding.initialize_distributed(run.mesh)


def build_model(run: RunConfig) -> DecoderOnlyLM:
    """The run's model, initialised from ``run.seed``."""
    return DecoderOnlyLM(run.model, rngs=nnx.Rngs(params=run.seed, dropout=run.seed + 1))


def check_workdir(workdir: Path, run: RunConfig) -> None:
    """Raise `ConfigError` if ``workdir`` cannot hold ``run``; writes nothing.

    Refused: a path that is not (or cannot become) a writable directory, and a workdir that
    holds a run of a different config (the message lists the fields that differ).
    """
    check_writable_dir(workdir, "workdir")
    path = workdir / "config.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = None
        if isinstance(old, dict):
            diff = _identity_diff(old, run)
            if diff:
                raise ConfigError(
                    f"workdir={str(workdir)!r} holds a run of a different config "
                    f"(differs in {', '.join(diff)}); use another --workdir or the same config"
                )


def check_writable_dir(path: Path, name: str) -> None:
    """Raise `ConfigError` unless ``path`` is, or can be created as, a writable directory."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        problem = f"{str(existing)!r} is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{str(existing)!r} is not writable"
    else:
        return
    raise ConfigError(f"{name}={str(path)!r}: {problem}; must be a writable directory")


def prepare_workdir(workdir: Path, run: RunConfig) -> None:
    """Create ``workdir`` and record the config, or check it holds a run of the same config."""
    check_workdir(workdir, run)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"workdir={str(workdir)!r}: not writable ({e.strerror}); must be a writable directory"
        ) from None
    path = workdir / "config.json"
    atomic_write_text(path, json.dumps(run.to_dict(), indent=2, sort_keys=True, default=str))


def _identity_diff(old: dict[str, Any], run: RunConfig) -> list[str]:
    """How the run recorded in a workdir's ``config.json`` differs from ``run`` in what it
    trains (`RunConfig.identity_diff`); a record that is no longer a valid config differs."""
    try:
        recorded = RunConfig.from_config(old)
    except ConfigError as e:
        return [f"the recorded config.json is not a valid config here ({e})"]
    return run.identity_diff(recorded)


def _check_finite(step: int, metrics: dict[str, float]) -> None:
    for name in sorted(metrics, key=lambda k: k != "loss"):  # report the loss first
        value = metrics[name]
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"training metric {name!r} is {value} at step {step}; stopping "
                "(lower the learning rate, check the data, or use float32)"
            )


def train_and_evaluate(config: Any, workdir: str | Path) -> dict[str, Any]:
    """Run (or resume, or return the cached result of) one training + evaluation run.

    Args:
      config: an ``ml_collections.ConfigDict`` (or dict) as in ``experiments/*.py``, or a
        validated `RunConfig`.
      workdir: the run's directory.

    Returns:
      ``{"config": ..., "steps": ..., "train_seconds": ..., "eval": [...], "provenance": ...}``
      (also saved as ``eval.json``).
    """
    run = config if isinstance(config, RunConfig) else RunConfig.from_config(config)
    prepare_process(run)
    plan = run.eval_plan()
    dataset = batches.open_run_data(run, plan)  # bad data settings fail before any write
    placement = sharding.Plan.create(run)  # None on one device: the plain single-device path
    workdir = Path(workdir)
    prepare_workdir(workdir, run)
    eval_path = workdir / "eval.json"

    tx = make_optimizer(run.optim, run.train.num_steps)
    if placement is None:
        graphdef, state = init_train_state(build_model(run), tx)
    else:
        graphdef, state = placement.init_train_state(lambda: build_model(run), tx)
    ckpt = Checkpointer(workdir / "checkpoints", keep=run.train.keep_checkpoints)
    try:
        restored = ckpt.restore_latest(state)
        start = 0 if restored is None else restored[1]
        if restored is not None:
            state = restored[0] if placement is None else placement.place(restored[0])
        if start >= run.train.num_steps and eval_path.exists():
            cached = json.loads(eval_path.read_text())
            if cached.get("config_hash") == run.hash():
                return cached
        info = {"train_seconds": 0.0}
        if start < run.train.num_steps:
            train_data = batches.TrainBatches(run, dataset, plan)
            validate = functools.partial(run_evaluation.quick_evaluate, plan=plan, dataset=dataset)
            state, info = _train(
                run, train_data, validate, graphdef, state, tx, ckpt, workdir, start, placement
            )
        ckpt.save(run.train.num_steps, state)
    finally:
        ckpt.close()

    model = nnx.merge(graphdef, state["params"], state["rest"])
    t0 = time.perf_counter()
    results = run_evaluation.evaluate_plan(model, plan, dataset, progress=run.train.progress)
    env = provenance.environment() | {"data": dataset.provenance()}
    atomic_write_text(workdir / "provenance.json", json.dumps(env, indent=2, sort_keys=True))
    summary = {
        "config": run.to_dict(),
        "config_hash": run.hash(),
        "steps": run.train.num_steps,
        "train_seconds": info["train_seconds"],
        "eval_seconds": time.perf_counter() - t0,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "eval": results,
        "provenance": env,
    }
    atomic_write_text(eval_path, json.dumps(summary, indent=1, default=str))
    return summary


def _train(run, train_data, validate, graphdef, state, tx, ckpt, workdir, start, placement=None):
    schedule = learning_rate_schedule(run.optim, run.train.num_steps)
    if placement is None:
        train_step = jax.jit(make_train_step(graphdef, tx, schedule), donate_argnums=0)
    else:
        train_step = placement.jit_train_step(graphdef, tx, schedule, state)
    writer = MetricsWriter(workdir, resume_step=start)
    bar = tqdm(
        total=run.train.num_steps,
        initial=start,
        desc=f"train {run.model.positional}",
        unit="step",
        disable=not run.train.progress,
        dynamic_ncols=True,
    )
    pending = None  # (step, device metrics) of the previous step, read while this one runs
    t0 = time.perf_counter()
    try:
        for step in range(start, run.train.num_steps):
            batch = train_data(step)
            if placement is not None:
                batch = placement.shard_batch(batch)
            state, metrics = train_step(state, batch)
            faults.hit("train_step")
            if pending is not None:
                _log_step(run, writer, bar, *pending)
            pending = (step + 1, metrics)
            if (step + 1) % run.train.checkpoint_every == 0 or step + 1 == run.train.num_steps:
                _log_step(run, writer, bar, *pending)
                pending = None
                ckpt.save(step + 1, state)
            if run.train.eval_every and (step + 1) % run.train.eval_every == 0:
                model = nnx.merge(graphdef, state["params"], state["rest"])
                writer.write(step + 1, "validation", validate(model))
        if pending is not None:
            _log_step(run, writer, bar, *pending)
    finally:
        bar.close()
        writer.close()
    jax.block_until_ready(state)
    return state, {"train_seconds": time.perf_counter() - t0}


def _log_step(run, writer, bar, step, metrics) -> None:
    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
    _check_finite(step, values)
    bar.update(step - bar.n)
    if step % run.train.log_every == 0 or step == run.train.num_steps:
        writer.write(step, "train", values)
        bar.set_postfix(loss=f"{values['loss']:.3f}", refresh=False)
