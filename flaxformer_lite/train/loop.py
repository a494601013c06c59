"""`train_and_evaluate(config, workdir)`: one complete, resumable run.

Build data and model, restore the newest checkpoint in ``workdir`` if there is one, train
with a jit-compiled step, evaluate periodically and at every evaluation length at the end,
and leave in ``workdir``::

    identity.json      what changes the numbers: the config fields, corpus content hash and
                       versions (`train.identity`); a run of another identity is refused
    config.json        the resolved configuration
    checkpoints/       orbax checkpoints (every `checkpoint_every` steps and at the end)
    metrics.jsonl      training/validation metrics, one JSON object per line
    tensorboard/       the same metrics as TensorBoard events
    eval_cells.jsonl   each evaluation cell's result as it finishes, so an evaluation that
                       stops resumes at its next cell (removed once eval.json is written)
    eval.json          the final evaluation at every length (written atomically, last)
    provenance.json    commit, package versions, backend, device, corpus hash, and the
                       positional encoding's options and source (`provenance.encoding`)

On several processes (``config.mesh.multihost``) process 0 alone writes these files, except
the checkpoints: every process writes its shards of them (`multihost`).

Training is deterministic given the config: the batch of step ``t`` is drawn from
``np.random.default_rng([seed, t])``, so a resumed run sees exactly the batches an
uninterrupted one would have seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite import pretrained as hf
from flaxformer_lite.base import faults, interrupt
from flaxformer_lite.base.checks import check_path, fail, is_number, shown
from flaxformer_lite.base.io import append_text, atomic_write_text
from flaxformer_lite.base.lock import WorkdirLock
from flaxformer_lite.base.progress import bars as progress_bars
from flaxformer_lite.evaluation import run as run_evaluation
from flaxformer_lite.evaluation.plan import EvalPlan
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train import (
    allocator,
    batches,
    cpu_matmul,
    identity,
    memory,
    multihost,
    provenance,
    sharding,
)
from flaxformer_lite.train.checkpoint import Checkpointer
from flaxformer_lite.train.checkpoint import check_folder as check_checkpoints
from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import ConfigError, RunConfig, TrainConfig
from flaxformer_lite.train.step import init_train_state, make_multi_step, make_train_step
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


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What `preflight` opened for a run: its evaluation plan, its corpus or task, and where
    its state lives (`sharding.Placement`; None on one device: the plain single-device path)."""

    plan: EvalPlan
    dataset: Any
    placement: sharding.Placement | None


def preflight(run: RunConfig, workdir: str | Path) -> Preflight:
    """Every check of ``run`` that writes nothing, in the order a bad call fails: the one
    pre-flight of `train_and_evaluate` and of the study runner (for each of its cells, before
    any cell runs). Prepares the process (`prepare_process`), opens the data and checks it
    against the evaluation plan (`batches.open_run_data`), builds the mesh against the devices
    and the batch (`sharding.Placement.create`), checks the memory estimate against what is
    free (`memory.check_memory`) and that ``workdir`` is, or can become, a writable directory
    (`check_writable_dir`). Raises `ConfigError` naming the setting."""
    prepare_process(run)  # before JAX touches a device
    plan = run.eval_plan()
    dataset = batches.open_run_data(run, plan)  # corpus / task / length errors
    placement = sharding.Placement.create(run)  # the batch vs the devices
    memory.check_memory(run, plan)  # the estimate of training and evaluation vs what is free
    check_writable_dir(Path(workdir), "workdir")
    return Preflight(plan=plan, dataset=dataset, placement=placement)


def build_model(run: RunConfig) -> DecoderOnlyLM:
    """The run's model, initialised from ``run.seed``."""
    return DecoderOnlyLM(run.model, rngs=nnx.Rngs(params=run.seed, dropout=run.seed + 1))


def check_workdir(
    workdir: Path, run: RunConfig, dataset: Any = None, *, restart_changed: bool = False
) -> list[str]:
    """Raise `ConfigError` if ``workdir`` cannot hold ``run``; writes nothing.

    Refused: a path that is not (or cannot become) a writable directory, a ``checkpoints/``
    that is a symbolic link or holds folders orbax did not write (`checkpoint.check_folder`),
    and a workdir that holds a run of another identity (`train.identity`: the config fields
    that change numbers, the corpus content hash, the versions; the message lists the fields
    that differ) unless
    ``restart_changed``. Returns those differences (empty: the workdir may continue its run).
    ``dataset``: the run's opened corpus or task (default: opened here).
    """
    check_writable_dir(workdir, "workdir")
    dataset = batches.open_run_data(run) if dataset is None else dataset
    old = identity.recorded(workdir)
    diffs, _ = identity.compare(old, identity.current(run, dataset, previous=old))
    if diffs and not restart_changed:
        raise ConfigError(identity.refusal(workdir, diffs))
    if not diffs:  # a run continued here reads its checkpoints (a restart removes its own)
        check_checkpoints(workdir / "checkpoints")
    return diffs


def workdir_lock(workdir: Path) -> contextlib.AbstractContextManager:
    """Hold ``workdir/.lock`` (`lock.WorkdirLock`: one writer per workdir; a second process
    gets `lock.WorkdirBusyError` naming the holder's pid). On a multi-host run every host writes
    its checkpoint shards into the shared workdir, so only process 0 takes the lock (and it
    alone writes the run's other files: `multihost`)."""
    return WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()


def check_writable_dir(path: Path, name: str) -> None:
    """Raise `ConfigError` unless ``path`` is, or can be created as, a writable directory
    (and one whose path orbax's checkpoints keep: no backslash)."""
    if "\\" in str(path):
        # orbax's array writer (tensorstore) reads a backslash as a separator: the arrays of
        # a checkpoint in a/b\c/ land in a/b/c/, outside the workdir (orbax then finds the
        # step without them), and a resume never finds them.
        fail(
            name,
            str(path),
            "contains a backslash, which checkpoint paths cannot hold (orbax would write the "
            "arrays outside the workdir); use a path without '\\'",
        )
    check_path(name, str(path))  # bytes that are not UTF-8: no row or report could name it
    existing = Path(os.path.abspath(path))
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as e:  # a name too long, a loop of links, ...
        fail(
            name, str(path), f"not a usable path ({e.strerror or e}); must be a writable directory"
        )
    if not is_dir:
        problem = f"{shown(str(existing))} is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{shown(str(existing))} is not writable"
    else:
        return
    fail(name, str(path), f"{problem}; must be a writable directory")


def prepare_workdir(
    workdir: Path, run: RunConfig, dataset: Any = None, *, restart_changed: bool = False
) -> dict[str, Any]:
    """Create ``workdir`` and record the run's identity and config, or check it holds a run
    of the same identity (`check_workdir`); with ``restart_changed``, a workdir of another
    identity starts afresh in place (`identity.reset`: only ``eval.*`` differs -- its
    checkpoints are kept and the run is evaluated again). Another git commit or backend is
    a warning. Returns the identity record (`identity.current`)."""
    check_writable_dir(workdir, "workdir")
    dataset = batches.open_run_data(run) if dataset is None else dataset
    old = identity.recorded(workdir)
    record = identity.current(run, dataset, previous=old)
    diffs, notes = identity.compare(old, record)
    if diffs and not restart_changed:
        raise ConfigError(identity.refusal(workdir, diffs))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_test", dir=workdir)  # O_EXCL: no link
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            f"workdir={str(workdir)!r}: not writable ({e.strerror}); must be a writable directory"
        ) from None
    for note in notes:
        warnings.warn(f"workdir={str(workdir)!r}: {note}", RuntimeWarning, stacklevel=2)
    if diffs:
        keep = identity.evaluation_only(diffs)
        log.warning(
            "workdir=%r: --restart_changed: %s (differs in %s)",
            str(workdir),
            "evaluating again, training kept" if keep else "starting afresh",
            ", ".join(diffs),
        )
        kept = identity.reset(workdir, record, run.to_dict(), keep_training=keep)
        if kept:  # only what the run wrote was deleted
            log.warning("%s", identity.kept_line(workdir, kept))
    else:
        identity.write(workdir, record, run.to_dict())
    return record


def read_eval_cache(path: Path) -> dict[str, Any]:
    """A finished run's cached result (``eval.json``), or ``{}`` when it is damaged -- empty,
    cut short, not JSON, not a result -- with a `RuntimeWarning` naming the file (the run
    is evaluated again from its final checkpoint)."""
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        problem = None
        if not isinstance(cached, dict):
            problem = f"holds a JSON {type(cached).__name__}, not a result"
        elif not isinstance(cached.get("eval"), list) or not isinstance(
            cached.get("provenance"), dict
        ):
            problem = "lacks its 'eval' results or 'provenance'"
    except (OSError, UnicodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        problem = f"cannot be read ({type(e).__name__}: {e})"
    if problem is None:
        return cached
    warnings.warn(
        f"{path} {problem}: ignoring this evaluation cache and evaluating again",
        RuntimeWarning,
        stacklevel=2,
    )
    return {}


def _check_finite(step: int, metrics: dict[str, float]) -> None:
    for name in sorted(metrics, key=lambda k: k != "loss"):  # report the loss first
        value = metrics[name]
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"training metric {name!r} is {value} at step {step}; stopping "
                "(lower the learning rate, check the data, or use float32)"
            )


def train_and_evaluate(
    config: Any,
    workdir: str | Path,
    *,
    restart_changed: bool = False,
    ready: Preflight | None = None,
) -> dict[str, Any]:
    """Run (or resume, or return the cached result of) one training + evaluation run.

    Args:
      config: an ``ml_collections.ConfigDict`` (or dict) as in ``configs/*.py``, or a
        validated `RunConfig`.
      workdir: the run's directory.
      restart_changed: a workdir holding a run of another identity (`train.identity`) starts
        afresh in place (`prepare_workdir`) instead of being refused.
      ready: the run's `preflight`, when the caller has made it (the study runner checks
        every cell before running any); None: made here.

    Returns:
      ``{"config": ..., "steps": ..., "train_seconds": ..., "train_steps": ..., "eval": [...],
      "provenance": ...}``, also saved as ``eval.json``; ``train_seconds`` times the
      ``train_steps`` steps this call ran (fewer than ``steps`` after a resume; 0 for a
      pretrained model, which is loaded, not trained).

    The workdir is checked before anything is written, then locked (`workdir_lock`) until
    the function returns. After the lock the run obtains its model -- trained here (resumed
    from its newest checkpoint), or loaded by `flaxformer_lite.pretrained` from the config
    the run config already mapped (``config.pretrained.source``) -- and evaluates and
    publishes it (`_evaluate_and_publish`). An OS error while writing state is raised as
    `io.StateWriteError`.

    Several processes (``config.mesh.multihost``, one process per host, one workdir on a file
    system they all share): every process calls this with the same config. Training steps
    and checkpoint saves and restores are collective (each process writes its shards of a
    checkpoint); only process 0 checks and locks the workdir and writes the run's own files,
    and it takes every decision that reads them (`multihost.on_process_0`: refusal, finished
    run); each process evaluates the whole model by itself (`sharding.Placement.local_copy`), and
    every process returns process 0's summary, as decoded from ``eval.json``'s JSON.
    """
    run = config if isinstance(config, RunConfig) else RunConfig.from_config(config)
    workdir = Path(workdir)
    ready = preflight(run, workdir) if ready is None else ready  # bad settings fail first
    if not run.pretrained.source:
        train_matmul(run)  # config.train.cpu_matmul="onednn" on a jaxlib that fails its check
    # writes nothing: a bad call leaves no lock file behind
    multihost.on_process_0(
        lambda: check_workdir(workdir, run, ready.dataset, restart_changed=restart_changed)
    )
    with contextlib.ExitStack() as held:
        # process 0 takes the lock; when it is busy, every process stops
        multihost.on_process_0(lambda: bool(held.enter_context(workdir_lock(workdir))))
        record = multihost.on_process_0(
            lambda: prepare_workdir(workdir, run, ready.dataset, restart_changed=restart_changed)
        )
        eval_path = workdir / "eval.json"
        cached = multihost.on_process_0(lambda: _cached_result(eval_path, record["hash"]))
        if cached is not None:
            return cached
        obtain = _loaded_model if run.pretrained.source else _trained_model
        model, made = obtain(run, ready, workdir)
        return _evaluate_and_publish(run, ready, model, made, record, eval_path)


def _trained_model(run: RunConfig, ready: Preflight, workdir: Path) -> tuple[nnx.Module, dict]:
    """The run's model trained to ``run.train.num_steps`` (resumed from the newest checkpoint
    in ``workdir``), and what the summary says of it (steps, time, provenance)."""
    interrupt.where(phase="restoring the checkpoint of", step=None, checkpoint=None)
    tx = make_optimizer(run.optim, run.train.num_steps)
    placement = ready.placement
    if placement is None:
        graphdef, state = init_train_state(build_model(run), tx)
    else:
        graphdef, state = placement.init_train_state(lambda: build_model(run), tx)
    ckpt = Checkpointer(workdir / "checkpoints", keep=run.train.keep_checkpoints)
    info = {"train_seconds": 0.0, "train_steps": 0}  # steps that train_seconds timed
    try:
        restored = ckpt.restore_latest(state)
        start = 0 if restored is None else restored[1]
        multihost.check_same(start, "the checkpoint step to resume from")
        if restored is not None:
            state = restored[0] if placement is None else placement.place(restored[0])
        interrupt.where(checkpoint=start, steps=run.train.num_steps)
        if start < run.train.num_steps:
            training = _Training(
                run=run,
                graphdef=graphdef,
                tx=tx,
                placement=placement,
                ckpt=ckpt,
                workdir=workdir,
                batches=batches.TrainBatches(run, ready.dataset, ready.plan),
                validate=functools.partial(
                    run_evaluation.quick_evaluate,
                    plan=ready.plan,
                    dataset=ready.dataset,
                    compiler_options=cpu_matmul.compiler_options(
                        train_matmul(run, evaluation=True)
                    ),
                ),
            )
            state, info = _train(training, state, start)
        interrupt.where(phase="saving the final checkpoint of")
        ckpt.save(run.train.num_steps, state)
    finally:
        ckpt.close()
    made = info | {
        "steps": run.train.num_steps,
        "provenance": {
            "train_matmul": train_matmul(run),
            "encoding": provenance.encoding(run.model),
        },
    }
    return _evaluation_model(graphdef, state, ready.placement), made


def _loaded_model(run: RunConfig, ready: Preflight, workdir: Path) -> tuple[nnx.Module, dict]:
    """The pretrained model of ``config.pretrained.source`` with the weights of its
    checkpoint, under the run's model config (mapped once, with its compute settings), and
    what the summary says of it (no steps; the model's id, family, revision and hashes)."""
    del workdir
    interrupt.where(phase="loading the pretrained model of", step=None, checkpoint=None)
    placement = ready.placement
    shardings = None
    if placement is not None:
        shardings = lambda abstract: sharding.state_shardings(
            abstract, placement.mesh, placement.rules
        )
    checkpoint = run.pretrained.checkpoint()
    try:
        model = checkpoint.load(run.model, shardings=shardings)
    except hf.PretrainedError as e:
        raise ConfigError(f"config.pretrained.source={run.pretrained.source!r}: {e}") from None
    made = {
        "steps": 0,
        "train_seconds": 0.0,
        "train_steps": 0,
        "provenance": {"pretrained": checkpoint.info().record()},
    }
    return model, made


def _evaluate_and_publish(
    run: RunConfig,
    ready: Preflight,
    model: nnx.Module,
    made: dict[str, Any],
    record: dict[str, Any],
    eval_path: Path,
) -> dict[str, Any]:
    """Evaluate ``model`` at every cell of the run's plan, then write ``provenance.json`` and
    ``eval.json`` (process 0; every process returns the summary). ``made``: what obtaining
    the model says of it (steps, training time, its provenance)."""
    interrupt.where(phase="evaluating")
    t0 = time.perf_counter()
    progress = progress_bars(run.train.progress) and multihost.is_primary()
    products = train_matmul(run, evaluation=True)
    cells_path = eval_path.parent / identity.EVAL_CELLS_FILE
    done = multihost.on_process_0(lambda: _finished_cells(cells_path, record["hash"], ready.plan))
    began = t0  # when the cell being scored began

    def keep(result: dict[str, Any]) -> None:  # process 0 appends each cell it finishes
        nonlocal began
        now = time.perf_counter()
        done.append(_cell_line(record["hash"], ready.plan, len(done), result, now - began))
        began = now
        if multihost.is_primary():  # never through a link (`append_text`)
            append_text(cells_path, json.dumps(done[-1], default=str) + "\n")

    results = run_evaluation.evaluate_plan(
        model,
        ready.plan,
        ready.dataset,
        progress=progress,
        compiler_options=cpu_matmul.compiler_options(products),
        done=[line["result"] for line in done],
        on_cell=keep,
    )
    env = provenance.environment() | {"data": ready.dataset.provenance()} | made["provenance"]
    env["eval_matmul"] = products
    summary = {
        "config": run.to_dict(),
        "config_hash": record["hash"],  # of exactly the recorded identity
        "steps": made["steps"],
        "train_seconds": made["train_seconds"],
        "train_steps": made["train_steps"],  # this call's steps (a resume: fewer)
        "eval_seconds": sum(line["seconds"] for line in done),  # a stopped evaluation's too
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "eval": results,
        "provenance": env,
    }

    def publish() -> dict[str, Any]:  # process 0 writes; every process returns its summary
        atomic_write_text(
            eval_path.parent / "provenance.json", json.dumps(env, indent=2, sort_keys=True)
        )
        atomic_write_text(eval_path, json.dumps(summary, indent=1, default=str))
        cells_path.unlink(missing_ok=True)  # eval.json holds them all now
        return summary

    return multihost.on_process_0(publish)


def _cell_line(
    config_hash: str, plan: EvalPlan, index: int, result: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """The ``eval_cells.jsonl`` line of the plan's cell ``index``: the run it belongs to, the
    cell (checked when read back), the seconds it took and its result."""
    cell = plan.cells[index]
    return {
        "config_hash": config_hash,
        "cell": index,
        "what": [cell.label.encoding, cell.protocol, cell.length],
        "seconds": seconds,
        "result": result,
    }


def _finished_cells(path: Path, config_hash: str, plan: EvalPlan) -> list[dict[str, Any]]:
    """The lines of ``path`` (``eval_cells.jsonl``) that are the plan's first cells, in order,
    of this run (``config_hash``); the file is rewritten to hold just them. A line of another
    run or cell, or one a kill cut short, ends them: the cells from there are scored again."""
    lines: list[dict[str, Any]] = []
    if not path.exists():
        return lines
    with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
        for text in path.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            index = len(lines)
            if index == len(plan.cells) or not isinstance(line, dict):
                break
            expected = _cell_line(config_hash, plan, index, {}, 0.0)
            if any(line.get(k) != expected[k] for k in ("config_hash", "cell", "what")):
                break
            if not isinstance(line.get("result"), dict) or not is_number(line.get("seconds")):
                break
            lines.append(line)
    atomic_write_text(path, "".join(json.dumps(x, default=str) + "\n" for x in lines))
    return lines


def _cached_result(eval_path: Path, config_hash: str) -> dict[str, Any] | None:
    """The finished run's result in ``eval_path`` if it is of ``config_hash``, else None
    (also when it is missing or damaged: the run is evaluated again)."""
    if not eval_path.exists():
        return None
    cached = read_eval_cache(eval_path)  # {} when damaged
    return cached if cached.get("config_hash") == config_hash else None


def _evaluation_model(graphdef, state, placement) -> nnx.Module:
    """The model to evaluate. On several processes its state is first gathered whole onto
    each process's first device (`sharding.Placement.local_copy`): each process then evaluates
    on its own (the evaluation code is not SPMD), the same model on the same batches."""
    params, rest = state["params"], state["rest"]
    if placement is not None and jax.process_count() > 1:
        params, rest = placement.local_copy((params, rest))
    return nnx.merge(graphdef, params, rest)


def train_matmul(run: RunConfig, *, evaluation: bool = False) -> str:
    """``"onednn"`` or ``"xla"``: the products this run's training (or, with ``evaluation``,
    scoring) steps use on this backend (`cpu_matmul.resolve` of ``config.train.cpu_matmul``)."""
    return cpu_matmul.resolve(
        run.train.cpu_matmul, compute_dtype=run.model.compute_dtype, evaluation=evaluation
    )


@dataclasses.dataclass(frozen=True)
class _Training:
    """What stays fixed while `_train` runs the steps of one run: its config, the model's
    graph definition, the optimizer, where the state lives (``placement``: None on one
    device), the checkpointer, the workdir (metrics), the batch of each step and the
    validation of a model."""

    run: RunConfig
    graphdef: nnx.GraphDef
    tx: optax.GradientTransformation
    placement: sharding.Placement | None
    ckpt: Checkpointer
    workdir: Path
    batches: Callable[[int], dict[str, jax.Array]]  # step -> its batch (`batches.TrainBatches`)
    validate: Callable[[nnx.Module], dict[str, float]]


def _compiled_steps(training: _Training, state) -> tuple[Callable, Callable | None]:
    """The jitted training step and, with ``train.steps_per_call`` > 1, the jitted call of
    that many steps (None otherwise); each compiles on its first call, so a run that never
    calls one never compiles it."""
    run, placement = training.run, training.placement
    schedule = learning_rate_schedule(run.optim, run.train.num_steps)
    several = run.train.steps_per_call
    options = cpu_matmul.compiler_options(train_matmul(run))

    def jitted(steps: int) -> Callable:
        if placement is None:
            step = make_train_step(training.graphdef, training.tx, schedule)
            step = step if steps == 1 else make_multi_step(step)
            return jax.jit(step, donate_argnums=0, compiler_options=options)
        return placement.jit_train_step(
            training.graphdef,
            training.tx,
            schedule,
            state,
            steps_per_call=steps,
            compiler_options=options,
        )

    return jitted(1), (jitted(several) if several > 1 else None)


def _train(training: _Training, state, start: int) -> tuple[Any, dict[str, Any]]:
    """Train ``state`` from step ``start`` to ``run.train.num_steps``, checkpointing and
    validating on the run's cadences; returns the final state and ``{"train_seconds",
    "train_steps"}`` (the steps this call ran, and their time)."""
    run, placement = training.run, training.placement
    train_step, multi_step = _compiled_steps(training, state)
    # the run's logs are process 0's: the other processes compute the same metrics
    writer = (
        MetricsWriter(training.workdir, resume_step=start)
        if multihost.is_primary()
        else _NoWriter()
    )
    bar = tqdm(
        total=run.train.num_steps,
        initial=start,
        desc=f"train {run.model.positional}",
        unit="step",
        disable=not (progress_bars(run.train.progress) and multihost.is_primary()),
        dynamic_ncols=True,
    )
    pending = None  # (last step, device metrics) of the previous call, read while this one runs
    t0 = time.perf_counter()
    interrupt.where(phase="training")
    try:
        step = start
        while step < run.train.num_steps:
            n = _steps_this_call(run.train, step)
            if n == 1:
                batch, call = training.batches(step), train_step
            else:
                batch, call = (
                    _stack([training.batches(t) for t in range(step, step + n)]),
                    multi_step,
                )
            if placement is not None:
                batch = placement.shard_batch(batch, stacked=n > 1)
            state, metrics = call(state, batch)
            step += n
            interrupt.where(step=step)  # dispatched
            faults.hit("train_step")
            if pending is not None:
                _log_steps(run, writer, bar, *pending)
            pending = (step, metrics)
            if step % run.train.checkpoint_every == 0 or step == run.train.num_steps:
                _log_steps(run, writer, bar, *pending)
                pending = None
                training.ckpt.save(step, state)
            if run.train.eval_every and step % run.train.eval_every == 0:
                model = _evaluation_model(training.graphdef, state, placement)
                writer.write(step, "validation", training.validate(model))
        if pending is not None:
            _log_steps(run, writer, bar, *pending)
    finally:
        bar.close()
        writer.close()
    jax.block_until_ready(state)
    return state, {
        "train_seconds": time.perf_counter() - t0,
        "train_steps": run.train.num_steps - start,
    }


def _steps_this_call(train: TrainConfig, step: int) -> int:
    """How many steps the call starting after ``step`` runs: ``train.steps_per_call`` when
    that many fit before the next checkpoint, validation or the end (so those fall on the
    steps they name), else 1. A run whose cadences are multiples of ``steps_per_call``
    (resumed from one of its checkpoints too) compiles only the several-step call."""
    stop = train.num_steps
    for every in (train.checkpoint_every, train.eval_every):
        if every:
            stop = min(stop, (step // every + 1) * every)
    return train.steps_per_call if stop - step >= train.steps_per_call else 1


def _stack(batches: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
    """``[steps, batch, ...]`` arrays of a list of batches (`make_multi_step`'s input)."""
    return {k: jnp.stack([b[k] for b in batches]) for k in batches[0]}


def _log_steps(run, writer, bar, last: int, metrics) -> None:
    """Check and log the metrics of one call's steps, the last of them ``last``: scalars of
    one step, or ``[steps]`` arrays of a several-step call."""
    host = {k: np.reshape(v, -1) for k, v in jax.device_get(metrics).items()}
    n = len(host["loss"])
    for i in range(n):
        step = last - n + 1 + i
        values = {k: float(v[i]) for k, v in host.items()}
        _check_finite(step, values)
        bar.update(step - bar.n)
        if step % run.train.log_every == 0 or step == run.train.num_steps:
            writer.write(step, "train", values)
            bar.set_postfix(loss=f"{values['loss']:.3f}", refresh=False)


class _NoWriter:
    """`MetricsWriter`'s interface, writing nothing (a process other than process 0)."""

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass
