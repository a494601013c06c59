"""Sharding on a (data, fsdp) device mesh: equal numbers, requested shardings, clear errors.

The multi-device checks run in ONE subprocess with 8 simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``), so the rest of the suite keeps its
single device. The subprocess is this file run as a script; it prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "configs"))

from extrapolation_lm import get_config  # noqa: E402

from flaxformer_lite.train.run_config import ConfigError, MeshConfig, RunConfig  # noqa: E402
from flaxformer_lite.train.sharding import mesh_shape  # noqa: E402

DATA, FSDP = 2, 4


def _tiny(**mesh):
    c = get_config("tiny")
    c.mesh.update(mesh)
    return c


# ----------------------------------------------------------------------------- in-process


@pytest.mark.parametrize(
    ("mesh", "devices", "expected"),
    [
        ({"data": -1, "fsdp": 1}, 8, (8, 1)),
        ({"data": -1, "fsdp": 4}, 8, (2, 4)),
        ({"data": 2, "fsdp": -1}, 8, (2, 4)),
        ({"data": 1, "fsdp": 1}, 8, (1, 1)),  # explicit sizes may use fewer devices
        ({"data": -1, "fsdp": 1}, 1, (1, 1)),
    ],
)
def test_mesh_shape_resolves_minus_one(mesh, devices, expected):
    assert mesh_shape(MeshConfig(**mesh), devices) == expected


@pytest.mark.parametrize(
    ("mesh", "devices", "match"),
    [
        ({"data": -1, "fsdp": 3}, 8, r"config.mesh.fsdp=3.*8 devices cannot be split"),
        ({"data": 4, "fsdp": 4}, 8, r"config.mesh.data=4 x config.mesh.fsdp=4 needs 16"),
    ],
)
def test_mesh_shape_errors_name_the_fields(mesh, devices, match):
    with pytest.raises(ConfigError, match=match):
        mesh_shape(MeshConfig(**mesh), devices)


@pytest.mark.parametrize(
    ("mesh", "match"),
    [
        ({"data": 3}, r"config.data.batch_size=8: must be divisible by the 3 data-parallel"),
        ({"data": 0}, r"config.mesh.data=0: must be >= 1, or -1"),
        ({"data": -1, "fsdp": -1}, r"config.mesh.fsdp=-1: only one of"),
        ({"rules": ("embed=model",)}, r"config.mesh.rules=.*bad rule 'embed=model'"),
        ({"rules": ("embed",)}, r"config.mesh.rules=.*bad rule 'embed'"),
        ({"rules": ("embed=fsdp", "embed=data")}, r"repeats a logical or mesh axis"),
    ],
)
def test_static_mesh_validation(mesh, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_config(_tiny(**mesh))


def test_mesh_is_neither_identity_nor_hash():
    a = RunConfig.from_config(_tiny())
    b = RunConfig.from_config(_tiny(data=2, fsdp=4))
    assert a.hash() == b.hash() and a.identity() == b.identity()
    assert a.to_dict()["mesh"] != b.to_dict()["mesh"]


# ----------------------------------------------------------------------------- 8 devices


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    workdir = tmp_path_factory.mktemp("sharded")
    proc = subprocess.run(
        [sys.executable, __file__, str(workdir)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_worker_saw_eight_devices(eight_devices):
    assert eight_devices["devices"] == 8
    assert eight_devices["mesh"] == {"data": DATA, "fsdp": FSDP}


def test_sharded_step_equals_single_device_step(eight_devices):
    r = eight_devices
    for i, (single, sharded) in enumerate(zip(r["loss_single"], r["loss_sharded"], strict=True)):
        assert sharded == pytest.approx(single, rel=1e-6, abs=1e-6), f"loss of step {i}"
    # Adam's moments are linear / quadratic in the gradients: they agree to float32 rounding.
    assert r["max_opt_diff"] < 1e-5 * r["max_mu"], (r["max_opt_diff"], r["max_mu"])
    # Parameters after two steps (the second with a nonzero learning rate). Adam's update
    # m / (sqrt(v) + eps) divides by the gradient's own size, so an entry whose gradient is
    # ~1e-8 turns rounding noise into a visible difference; bound the update as a whole.
    assert r["param_change"] > 1e-4  # the states compared are not two untouched ones
    assert r["update_rel_diff"] < 1e-2, r["update_rel_diff"]
    assert r["max_param_diff"] < 0.2 * r["param_change"], r["max_param_diff"]
    # the state created sharded by a jitted init equals the eager single-device init
    assert r["max_init_diff"] < 1e-6, r["max_init_diff"]


def _expected_spec(logical_axes, shape):
    """embed -> fsdp where 4 divides the dimension; everything else replicated."""
    spec = [None] * len(shape)
    if "embed" in logical_axes:
        i = list(logical_axes).index("embed")
        if shape[i] % FSDP == 0:
            spec[i] = "fsdp"
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def test_param_and_optimizer_shardings_follow_the_rules(eight_devices):
    params = eight_devices["params"]
    assert len(params) > 10
    sharded = 0
    for path, (axes, shape, spec) in params.items():
        assert spec == _expected_spec(axes, shape), path
        sharded += "fsdp" in spec
        for moment in ("mu", "nu"):  # Adam's moments live where their parameter lives
            assert eight_devices[moment][path] == spec, (moment, path)
    assert sharded >= 10  # kernels, norms, the embedding table
    assert eight_devices["embedding"] == [None, "fsdp"]  # ("vocab", "embed")
    assert eight_devices["replicated"] == {"step": [], "adam_count": []}
    assert all(spec == [] for spec in eight_devices["rest"])


def test_batch_is_split_over_data(eight_devices):
    assert eight_devices["batch"] == {
        k: ["data"] for k in ("inputs", "loss_mask", "positions", "targets")
    }
    assert eight_devices["batch_rows_per_device"] == 8 // DATA


def test_batch_not_divisible_is_a_clear_error(eight_devices):
    msg = eight_devices["indivisible"]
    assert "config.data.batch_size=12" in msg and "divisible by the 8 data-parallel" in msg


@pytest.mark.parametrize("run", ["run_sharded", "run_sharded_two_per_call"])
def test_train_and_evaluate_on_the_mesh_matches_one_device(eight_devices, run):
    single, sharded = eight_devices["run_single"], eight_devices[run]
    assert len(single["train_loss"]) == len(sharded["train_loss"]) == 4
    np.testing.assert_allclose(sharded["train_loss"], single["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(sharded["eval_loss"], single["eval_loss"], rtol=1e-5)
    assert sharded["checkpoint_steps"] == single["checkpoint_steps"]
    assert sharded["stacked_calls"] == ([2, 2] if run == "run_sharded_two_per_call" else [])


# ----------------------------------------------------------------------------- worker


def _spec(x) -> list:
    return [None if a is None else a for a in x.sharding.spec]


def _worker(workdir: Path) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flaxformer_lite.train import batches as train_batches
    from flaxformer_lite.train import loop, sharding
    from flaxformer_lite.train.loop import build_model, train_and_evaluate
    from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
    from flaxformer_lite.train.step import init_train_state, make_train_step

    out: dict = {"devices": jax.device_count()}
    run = RunConfig.from_config(_tiny(data=DATA, fsdp=FSDP))
    plan = sharding.Placement.create(run)
    out["mesh"] = dict(plan.mesh.shape)
    tx = make_optimizer(run.optim, run.train.num_steps)
    schedule = learning_rate_schedule(run.optim, run.train.num_steps)
    graphdef, state = init_train_state(build_model(run), tx)
    eval_plan = run.eval_plan()
    source = train_batches.TrainBatches(run, train_batches.open_run_data(run, eval_plan), eval_plan)
    batches = [source(t) for t in range(2)]

    def maxdiff(a, b):
        diffs = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)
        return max(jax.tree.leaves(diffs), default=0.0)

    _, init_sharded = plan.init_train_state(lambda: build_model(run), tx)
    out["max_init_diff"] = maxdiff(state["params"], init_sharded["params"])

    single_step = jax.jit(make_train_step(graphdef, tx, schedule))
    s1, out["loss_single"] = state, []
    for b in batches:
        s1, m = single_step(s1, b)
        out["loss_single"].append(float(m["loss"]))
    sharded_step = plan.jit_train_step(graphdef, tx, schedule, init_sharded)
    s2, out["loss_sharded"] = plan.place(jax.tree.map(jnp.copy, state)), []
    for b in batches:
        s2, m = sharded_step(s2, plan.shard_batch(b))
        out["loss_sharded"].append(float(m["loss"]))
    out["max_param_diff"] = maxdiff(s1["params"], s2["params"])
    adam = lambda s: s["opt_state"][-1][0]  # (clip, (ScaleByAdamState, ...))
    out["max_opt_diff"] = max(maxdiff(adam(s1).mu, adam(s2).mu), maxdiff(adam(s1).nu, adam(s2).nu))
    out["param_change"] = maxdiff(state["params"], s1["params"])
    d1 = jax.tree.leaves(jax.tree.map(jnp.subtract, s1["params"], state["params"]))
    d2 = jax.tree.leaves(jax.tree.map(jnp.subtract, s2["params"], state["params"]))
    num = sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(d1, d2, strict=True))
    out["update_rel_diff"] = (num / sum(float(jnp.sum(a**2)) for a in d1)) ** 0.5
    out["max_mu"] = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(adam(s1).mu))

    def specs(tree):
        flat = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )[0]
        return {jax.tree_util.keystr(p): v for p, v in flat}

    params = specs(s2["params"])
    out["params"] = {
        k: (list(v.get_metadata()["logical_axes"]), list(v[...].shape), _spec(v[...]))
        for k, v in params.items()
    }
    out["mu"] = {k: _spec(v[...]) for k, v in specs(adam(s2).mu).items()}
    out["nu"] = {k: _spec(v[...]) for k, v in specs(adam(s2).nu).items()}
    out["embedding"] = next(
        _spec(v[...]) for k, v in params.items() if "embedding" in k and "embed" in k
    )
    out["replicated"] = {"step": _spec(s2["step"]), "adam_count": _spec(adam(s2).count)}
    out["rest"] = [_spec(x) for x in jax.tree.leaves(s2["rest"])]
    sb = plan.shard_batch(batches[0])
    out["batch"] = {k: _spec(v) for k, v in sb.items()}
    out["batch_rows_per_device"] = sb["inputs"].addressable_shards[0].data.shape[0]
    indivisible = dataclasses.replace(
        run, data=dataclasses.replace(run.data, batch_size=12), mesh=MeshConfig()
    )
    try:  # data=-1 takes all 8 devices; 12 rows do not split 8 ways
        sharding.Placement.create(indivisible)
        out["indivisible"] = "no error"
    except ConfigError as e:
        out["indivisible"] = str(e)

    stacked_calls = []  # the steps of each several-step call
    stack = loop._stack

    def counted_stack(batches):
        stacked_calls.append(len(batches))
        return stack(batches)

    loop._stack = counted_stack
    # The whole loop: 4 steps on one device, then on the 2 x 4 mesh (one step per call, and
    # two: stacked batches split along their second axis); same numbers.
    for name, mesh, steps_per_call in (
        ("single", {"data": 1, "fsdp": 1}, 1),
        ("sharded", {"data": DATA, "fsdp": FSDP}, 1),
        ("sharded_two_per_call", {"data": DATA, "fsdp": FSDP}, 2),
    ):
        c = _tiny(**mesh)
        c.train.update(num_steps=4, log_every=1, checkpoint_every=2, steps_per_call=steps_per_call)
        c.eval.update(length_multiples=(1, 2), max_bytes=512)
        stacked_calls.clear()
        summary = train_and_evaluate(c, workdir / name)
        lines = (workdir / name / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        out[f"run_{name}"] = {
            "train_loss": [r["loss"] for r in rows if r.get("split") == "train"],
            "eval_loss": [r["loss"] for r in summary["eval"]],
            "checkpoint_steps": sorted(os.listdir(workdir / name / "checkpoints")),
            "stacked_calls": list(stacked_calls),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(_worker(Path(sys.argv[1]))))
