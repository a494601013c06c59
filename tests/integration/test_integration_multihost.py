"""Multi-host training with real processes: two local processes join one JAX runtime.

Each worker (this file run as a script) calls ``jax.distributed.initialize`` with a coordinator
on 127.0.0.1, has 2 CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``) and
gloo CPU collectives, and trains a few steps of the ``tiny`` model on a ``(data=2, fsdp=2)``
mesh spanning both processes, with the library's `sharding.Placement` and `Checkpointer`. The test
checks that the losses and parameters equal a single-process, single-device run on the same
global batches, and that the checkpoint the two processes wrote together restores here, in one
process. A second pair of workers runs `train_and_evaluate` itself (``mesh.multihost``) in
one shared workdir: the run, its rerun and a refused run of another identity, checked against
a single-process run. Every subprocess has a timeout: a hung collective fails the test, it
does not hang.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "configs"))

from extrapolation_lm import get_config  # noqa: E402

from flaxformer_lite.train.run_config import RunConfig  # noqa: E402

PROCESSES, LOCAL_DEVICES = 2, 2
DATA, FSDP = 2, 2
STEPS = 3
LOOP_STEPS = 4
TIMEOUT_S = 180


def _run_config() -> RunConfig:
    c = get_config("tiny")
    c.mesh.update(data=DATA, fsdp=FSDP)
    return RunConfig.from_config(c)


def _loop_config(*, multihost: bool):
    """`train_and_evaluate`'s config: tiny, 4 steps with a checkpoint and a validation every
    2 and a training row every step, a small evaluation; on the 2 x 2 mesh of both workers
    (``multihost``) or on the one device of this process."""
    c = get_config("tiny")
    c.train.update(num_steps=LOOP_STEPS, checkpoint_every=2, eval_every=2, log_every=1)
    c.eval.update(length_multiples=(1, 2), max_bytes=512)
    if multihost:
        c.mesh.update(data=DATA, fsdp=FSDP, multihost=True)
    return c


def _gloo_missing() -> str | None:
    """Why this jax build cannot run CPU processes together, or None if it can."""
    import jax
    from jax._src.lib import _jax  # the public API has no "is gloo built in" query

    if not hasattr(jax, "distributed"):
        return "this jax has no jax.distributed"
    if not hasattr(_jax, "make_gloo_tcp_collectives"):
        return "this jaxlib has no gloo CPU collectives (make_gloo_tcp_collectives)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flat_params(params) -> dict[str, np.ndarray]:
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


# ----------------------------------------------------------------------------- the test


def _run_workers(mode: str, workdir: Path, out_dir: Path) -> None:
    """Run `PROCESSES` workers (this file as a script: ``_worker`` or ``_loop_worker`` by
    ``mode``) joined through a coordinator on a free port; fail unless all exit 0 within
    `TIMEOUT_S` (their logs, in ``out_dir``, in the message)."""
    reason = _gloo_missing()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={LOCAL_DEVICES}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    port = _free_port()
    procs, logs = [], []
    t0 = time.monotonic()
    try:
        for pid in range(PROCESSES):
            log = open(out_dir / f"worker{pid}.log", "w")  # closed in the finally below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        str(port),
                        str(pid),
                        str(workdir),
                        mode,
                        str(out_dir),
                    ],
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        # Poll both: when one fails, the other is blocked in a collective and is killed.
        while any(p.poll() is None for p in procs) and time.monotonic() - t0 < TIMEOUT_S:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
        codes = [
            f"killed after {time.monotonic() - t0:.0f} s" if p.poll() is None else p.returncode
            for p in procs
        ]
    finally:
        for p in procs:  # a worker that failed leaves the other blocked in a collective
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for log in logs:
            log.close()
    outputs = {pid: (out_dir / f"worker{pid}.log").read_text()[-4000:] for pid in range(PROCESSES)}
    assert codes == [0] * PROCESSES, f"workers: {codes}\n" + "\n".join(
        f"--- worker {pid} ---\n{text}" for pid, text in outputs.items()
    )


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multihost")
    _run_workers("steps", workdir, workdir)
    results = [json.loads((workdir / f"out{pid}.json").read_text()) for pid in range(PROCESSES)]
    params = [dict(np.load(workdir / f"params{pid}.npz")) for pid in range(PROCESSES)]
    return {"workdir": workdir, "results": results, "params": params}


@pytest.fixture(scope="module")
def single_process():
    """The same steps on one device in this process: the reference."""
    import jax

    from flaxformer_lite.train import batches as train_batches
    from flaxformer_lite.train.loop import build_model
    from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
    from flaxformer_lite.train.step import init_train_state, make_train_step

    run = _run_config()
    tx = make_optimizer(run.optim, run.train.num_steps)
    schedule = learning_rate_schedule(run.optim, run.train.num_steps)
    graphdef, state = init_train_state(build_model(run), tx)
    init = _flat_params(state["params"])
    eval_plan = run.eval_plan()
    source = train_batches.TrainBatches(run, train_batches.open_run_data(run, eval_plan), eval_plan)
    step_fn = jax.jit(make_train_step(graphdef, tx, schedule))
    losses = []
    for t in range(STEPS):
        state, metrics = step_fn(state, source(t))
        losses.append(float(metrics["loss"]))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    return {
        "loss": losses,
        "init": init,
        "params": _flat_params(state["params"]),
        "abstract": abstract,
    }


def test_workers_formed_one_runtime(two_processes):
    for pid, r in enumerate(two_processes["results"]):
        assert r["process_index"] == pid
        assert r["process_count"] == PROCESSES
        assert r["local_devices"] == LOCAL_DEVICES
        assert r["devices"] == PROCESSES * LOCAL_DEVICES
        assert r["mesh"] == {"data": DATA, "fsdp": FSDP}
        assert r["mesh_processes"] == list(range(PROCESSES))  # the mesh spans both
        assert r["library_initialize_is_noop"]


def test_both_processes_see_the_same_numbers(two_processes):
    a, b = two_processes["results"]
    assert a["loss"] == b["loss"]
    pa, pb = two_processes["params"]
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


def test_two_processes_equal_one_process(two_processes, single_process):
    losses = two_processes["results"][0]["loss"]
    np.testing.assert_allclose(losses, single_process["loss"], rtol=1e-5, atol=1e-6)
    multi, single, init = (
        two_processes["params"][0],
        single_process["params"],
        single_process["init"],
    )
    assert multi.keys() == single.keys() and len(single) > 10
    # As in test_sharding: Adam's m / (sqrt(v) + eps) turns rounding noise in a ~0 gradient
    # into a visible difference of one entry, so bound the update as a whole.
    change = max(float(np.max(np.abs(single[k] - init[k]))) for k in single)
    diff = max(float(np.max(np.abs(multi[k] - single[k]))) for k in single)
    num = sum(float(np.sum((multi[k] - single[k]) ** 2)) for k in single)
    den = sum(float(np.sum((single[k] - init[k]) ** 2)) for k in single)
    assert change > 1e-4  # training moved the parameters
    assert (num / den) ** 0.5 < 1e-2, (num / den) ** 0.5
    assert diff < 0.2 * change, (diff, change)


def test_checkpoint_of_two_processes_restores_in_one(two_processes, single_process):
    from flaxformer_lite.train.checkpoint import Checkpointer

    directory = two_processes["workdir"] / "checkpoints"
    assert sorted(os.listdir(directory)) == [str(STEPS)]  # one step, no temporary directory
    ckpt = Checkpointer(directory, keep=2)
    try:
        restored_step = ckpt.restore_latest(single_process["abstract"])
    finally:
        ckpt.close()
    assert restored_step is not None
    state, step = restored_step
    assert step == STEPS
    restored = _flat_params(state["params"])
    written = two_processes["params"][0]
    assert restored.keys() == written.keys()
    for k in written:
        np.testing.assert_array_equal(restored[k], written[k], err_msg=k)
    assert int(state["step"]) == STEPS


def test_trained_model_of_two_processes_loads_in_one(two_processes):
    from flax import nnx

    from flaxformer_lite.train.restore import load_trained_model

    model, step, run = load_trained_model(two_processes["workdir"])
    assert step == STEPS and run.mesh.data == DATA
    loaded = _flat_params(nnx.state(model, nnx.Param))
    written = two_processes["params"][0]
    assert len(loaded) == len(written)
    for a, b in zip(loaded.values(), written.values(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_train_and_evaluate_on_two_processes(tmp_path):
    """`train_and_evaluate` itself on 2 processes sharing one workdir (``mesh.multihost``):
    both return process 0's result, which equals a single-process run; the run's files are
    written once (by process 0); a rerun returns the finished result; a refusal stops both."""
    from flaxformer_lite.train.loop import train_and_evaluate

    workdir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    _run_workers("loop", workdir, out_dir)
    a, b = (json.loads((out_dir / f"loop{pid}.json").read_text()) for pid in range(PROCESSES))
    assert (a["process_index"], b["process_index"]) == (0, 1)
    assert a["first"] == b["first"] == json.loads((workdir / "eval.json").read_text())
    assert a["rerun"] == b["rerun"] == a["first"]  # finished: the cached result
    assert a["refused"] == b["refused"]  # another identity: both refuse, with one message
    assert "seed" in a["refused"]

    # the run's files, written once: a row per step, one TensorBoard log
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["split"], r["step"]) for r in rows]
    assert sorted(steps) == sorted(
        [("train", t) for t in range(1, LOOP_STEPS + 1)] + [("validation", 2), ("validation", 4)]
    ), steps
    assert len(list((workdir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", str(LOOP_STEPS)]

    # the same run on this process's one device: the same numbers to float tolerance
    single = train_and_evaluate(_loop_config(multihost=False), tmp_path / "single")
    assert single["config_hash"] == a["first"]["config_hash"]  # the mesh is not identity
    text = (tmp_path / "single" / "metrics.jsonl").read_text()
    single_rows = [json.loads(line) for line in text.splitlines()]
    assert [(r["split"], r["step"]) for r in single_rows] == steps
    for m, s in zip(rows, single_rows, strict=True):
        np.testing.assert_allclose(m["loss"], s["loss"], rtol=1e-5, err_msg=str(m))
    assert len(single["eval"]) == len(a["first"]["eval"]) == 2
    for m, s in zip(a["first"]["eval"], single["eval"], strict=True):
        assert m["eval_length"] == s["eval_length"]
        for key in ("loss", "bits_per_byte", "accuracy"):
            np.testing.assert_allclose(m[key], s[key], rtol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------- worker


def _join(port: int, pid: int) -> None:
    """Join the 2-process JAX runtime (coordinator on 127.0.0.1:``port``, gloo collectives)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=PROCESSES,
        process_id=pid,
        initialization_timeout=60,
    )


def _worker(port: int, pid: int, workdir: Path, out_dir: Path) -> None:
    import jax

    _join(port, pid)
    from jax._src import distributed
    from jax.experimental import multihost_utils

    from flaxformer_lite.train import batches as train_batches
    from flaxformer_lite.train import sharding
    from flaxformer_lite.train.checkpoint import Checkpointer
    from flaxformer_lite.train.loop import build_model
    from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
    from flaxformer_lite.train.run_config import MeshConfig

    run = _run_config()
    client = distributed.global_state.client
    sharding.initialize_distributed(MeshConfig(multihost=True))  # already joined: a no-op
    out: dict = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "local_devices": jax.local_device_count(),
        "devices": jax.device_count(),
        "library_initialize_is_noop": distributed.global_state.client is client,
    }
    plan = sharding.Placement.create(run)
    out["mesh"] = dict(plan.mesh.shape)
    out["mesh_processes"] = sorted({d.process_index for d in plan.mesh.devices.flat})
    tx = make_optimizer(run.optim, run.train.num_steps)
    schedule = learning_rate_schedule(run.optim, run.train.num_steps)
    graphdef, state = plan.init_train_state(lambda: build_model(run), tx)
    eval_plan = run.eval_plan()
    source = train_batches.TrainBatches(run, train_batches.open_run_data(run, eval_plan), eval_plan)
    step_fn = plan.jit_train_step(graphdef, tx, schedule, state)
    out["loss"] = []
    for t in range(STEPS):
        state, metrics = step_fn(state, plan.shard_batch(source(t)))
        out["loss"].append(float(metrics["loss"]))  # replicated: readable on every process
    ckpt = Checkpointer(workdir / "checkpoints", keep=2)
    try:
        ckpt.save(STEPS, state)  # every process takes part; orbax's primary host commits
    finally:
        ckpt.close()
    params = multihost_utils.process_allgather(state["params"], tiled=True)
    np.savez(workdir / f"params{pid}.npz", **_flat_params(params))
    (workdir / f"out{pid}.json").write_text(json.dumps(out))
    if pid == 0:  # what `load_trained_model` rebuilds the model from
        (workdir / "config.json").write_text(json.dumps(run.to_dict()))
    multihost_utils.sync_global_devices("done")  # neither process leaves while one still reads
    jax.distributed.shutdown()


def _loop_worker(port: int, pid: int, workdir: Path, out_dir: Path) -> None:
    """`train_and_evaluate` on the shared ``workdir``: the run, its rerun (finished), and a
    run of another identity (refused); what each returned or raised goes to ``out_dir``."""
    import jax

    _join(port, pid)
    from jax.experimental import multihost_utils

    from flaxformer_lite.base.checks import ConfigError
    from flaxformer_lite.train.loop import train_and_evaluate

    out: dict = {"process_index": jax.process_index()}
    out["first"] = train_and_evaluate(_loop_config(multihost=True), workdir)
    out["rerun"] = train_and_evaluate(_loop_config(multihost=True), workdir)
    other = _loop_config(multihost=True)
    other.seed += 1
    try:
        train_and_evaluate(other, workdir)
    except ConfigError as e:
        out["refused"] = str(e)
    (out_dir / f"loop{pid}.json").write_text(json.dumps(out, default=str))
    multihost_utils.sync_global_devices("done")
    jax.distributed.shutdown()


if __name__ == "__main__":
    worker = {"steps": _worker, "loop": _loop_worker}[sys.argv[4]]
    worker(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[5]))
