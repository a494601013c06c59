"""Data and parameter sharding on a ``jax.make_mesh`` device mesh (DESIGN.md §8).

The mesh has two axes, ``data`` and ``fsdp``, sized by `MeshConfig` (``-1``: all devices left
over). Parameters name their dimensions in the ``logical_axes`` metadata of their
``nnx.Variable`` (e.g. ``("embed", "mlp")``); the config's rules map logical names to mesh
axes (default ``batch -> data``, ``embed -> fsdp``, every other name replicated), as in
MaxText's logical axis rules. Hence:

* parameters and the optimizer state (Adam's moments are Variables with the parameters'
  metadata) are sharded over ``fsdp`` along their ``embed`` dimension;
* the step counter, RNG state and every other leaf are replicated;
* the batch is split over ``data`` along its batch dimension. With the default rules each
  ``fsdp`` group computes on its ``data`` shard of the batch and holds ``1/fsdp`` of the
  parameters (XLA gathers them where they are used); the rule ``"batch=data+fsdp"`` splits
  the batch over both axes instead (ZeRO-3 style FSDP).

Nothing here is home-made parallelism: states and batches become global ``jax.Array`` s with
a ``NamedSharding``, the step is jitted with input and output shardings, and XLA's SPMD
partitioner inserts the collectives. A dimension that its mesh axes do not divide evenly
stays replicated. On one device `Placement.create` returns None and the training loop keeps its
plain single-device path.

The state is created sharded (STYLE.md habit 13): ``nnx.eval_shape`` gives the abstract
state, its shardings are derived from the metadata, and a jitted initializer with those
output shardings materialises each shard on its device only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from flaxformer_lite.train.run_config import MESH_AXES, ConfigError, MeshConfig, RunConfig
from flaxformer_lite.train.step import (
    TrainState,
    init_train_state,
    make_multi_step,
    make_train_step,
)

log = logging.getLogger(__name__)
Rules = Mapping[str, tuple[str, ...]]


def _identity(x: Any) -> Any:  # module-level, so `Placement.local_copy` compiles once per tree
    return x


def initialize_distributed(cfg: MeshConfig) -> None:
    """``jax.distributed.initialize()`` (environment auto-detection) when ``cfg.multihost``.

    Call it before anything touches a device; a second call in the same process is a no-op.
    """
    if not cfg.multihost:
        return
    from jax._src import distributed  # the public API has no "is it initialized" query

    if distributed.global_state.client is not None:
        return
    jax.distributed.initialize()
    log.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int]:
    """``(data, fsdp)`` with ``-1`` resolved; raises `ConfigError` naming the fields.

    With a ``-1`` the mesh takes every device; with two explicit sizes it may take fewer
    (the first ``data * fsdp`` devices), never more.
    """
    data, fsdp = cfg.data, cfg.fsdp
    if -1 in (data, fsdp):
        fixed = fsdp if data == -1 else data
        if num_devices % fixed:
            raise ConfigError(
                f"config.mesh.data={data}, config.mesh.fsdp={fsdp}: {num_devices} devices "
                f"cannot be split into groups of {fixed}; the -1 axis takes the devices left "
                "over, so the other size must divide the device count"
            )
        return (num_devices // fixed, fsdp) if data == -1 else (data, num_devices // fixed)
    if data * fsdp > num_devices:
        raise ConfigError(
            f"config.mesh.data={data} x config.mesh.fsdp={fsdp} needs {data * fsdp} devices, "
            f"but {num_devices} are available (use -1 on one axis for all devices left over)"
        )
    return data, fsdp


def make_mesh(
    cfg: MeshConfig, *, batch_size: int | None = None, devices: list | None = None
) -> Mesh:
    """The ``(data, fsdp)`` mesh over ``devices`` (default: all of them).

    With ``batch_size``, also checks that the batch splits evenly over the mesh axes the
    ``batch`` rule names (`ConfigError` naming ``config.data.batch_size`` and the axes).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    if shape[0] * shape[1] < len(devices):
        log.warning("the mesh uses %d of %d devices", shape[0] * shape[1], len(devices))
        devices = devices[: shape[0] * shape[1]]
    if batch_size is not None:
        sizes = dict(zip(MESH_AXES, shape, strict=True))
        axes = cfg.parsed_rules().get("batch", ())
        ways = int(np.prod([sizes[a] for a in axes], dtype=np.int64))
        if batch_size % ways:
            names = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise ConfigError(
                f"config.data.batch_size={batch_size}: must be divisible by the {ways} "
                f"data-parallel devices it is split over (config.mesh: {names}); choose a "
                "batch size that is a multiple of it, or change config.mesh.data / fsdp"
            )
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def logical_spec(
    logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: Rules
) -> PartitionSpec:
    """The `PartitionSpec` of an array whose dimensions are named ``logical_axes``.

    A dimension is sharded over the mesh axes its rule names, unless they do not divide it
    evenly or an earlier dimension already uses one of them; then it is replicated.
    """
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical_axes {logical_axes} do not match the array shape {shape}")
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape, strict=True):
        axes = tuple(a for a in rules.get(name, ()) if mesh.shape[a] > 1) if name else ()
        ways = int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))
        if not axes or used & set(axes) or size % ways:
            spec.append(None)
            continue
        used |= set(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: Mesh, rules: Rules) -> Any:
    """A tree prefix of ``state`` with a `NamedSharding` at every Variable and array leaf.

    Variables with ``logical_axes`` metadata (parameters and the optimizer's moments of
    them) follow the rules; everything else (step, Adam's count, RNG state) is replicated.
    Works on concrete and abstract (``jax.ShapeDtypeStruct``) states.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(x):
        if _is_variable(x):
            axes = x.get_metadata().get("logical_axes")
            value = x.get_value()
            if axes is not None and hasattr(value, "shape"):
                return NamedSharding(mesh, logical_spec(tuple(axes), value.shape, mesh, rules))
        return replicated

    return jax.tree.map(one, state, is_leaf=_is_variable)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's state and batches live on a multi-device mesh."""

    mesh: Mesh
    rules: Rules

    @classmethod
    def create(cls, run: RunConfig, *, devices: list | None = None) -> Placement | None:
        """The placement for ``run``, or None on a single device (nothing to shard).

        On several processes the mesh must hold devices of every process (each one runs the
        same steps on its share); `ConfigError` otherwise.
        """
        mesh = make_mesh(run.mesh, batch_size=run.data.batch_size, devices=devices)
        processes = {d.process_index for d in mesh.devices.flat}
        if len(processes) < jax.process_count():
            raise ConfigError(
                f"config.mesh.data={run.mesh.data}, config.mesh.fsdp={run.mesh.fsdp}: the "
                f"{mesh.size}-device mesh takes devices of {len(processes)} of the "
                f"{jax.process_count()} processes; on several processes it must span them all "
                "(use -1 on one axis for all devices)"
            )
        if mesh.size == 1:
            return None
        return cls(mesh=mesh, rules=run.mesh.parsed_rules())

    def batch_sharding(self, *, stacked: bool = False) -> NamedSharding:
        """Batch arrays ``[batch, ...]``: the batch dimension over the ``batch`` rule's axes
        (``stacked``: ``[steps, batch, ...]``, `step.make_multi_step`'s, the steps axis whole)."""
        axes = tuple(a for a in self.rules.get("batch", ()) if self.mesh.shape[a] > 1)
        first = None if not axes else (axes[0] if len(axes) == 1 else axes)
        return NamedSharding(
            self.mesh, PartitionSpec(None, first) if stacked else PartitionSpec(first)
        )

    def shardings(self, state: Any) -> Any:
        return state_shardings(state, self.mesh, self.rules)

    def init_train_state(
        self, build_model: Callable[[], nnx.Module], tx: optax.GradientTransformation
    ) -> tuple[nnx.GraphDef, TrainState]:
        """`step.init_train_state` of ``build_model()``, created directly in its shardings."""

        def init() -> TrainState:
            return init_train_state(build_model(), tx)[1]

        graphdef = nnx.split(nnx.eval_shape(build_model))[0]
        shardings = self.shardings(jax.eval_shape(init))
        return graphdef, jax.jit(init, out_shardings=shardings)()

    def place(self, state: Any) -> Any:
        """``state`` (e.g. restored from a checkpoint) moved into its shardings."""
        return jax.device_put(state, self.shardings(state))

    def local_copy(self, tree: Any) -> Any:
        """``tree``'s arrays whole on this process's first device of the mesh.

        On several processes the shards of the others are gathered (a collective: every
        process calls it); evaluation then runs on each process by itself, on the whole
        model, as on a single device. Needs the whole ``tree`` to fit one device.
        """
        whole = jax.jit(_identity, out_shardings=NamedSharding(self.mesh, PartitionSpec()))(tree)
        return jax.tree.map(lambda x: x.addressable_data(0), whole)

    def shard_batch(
        self, batch: Mapping[str, Any], *, stacked: bool = False
    ) -> dict[str, jax.Array]:
        """Global batch arrays split over the data axes (``stacked``: ``[steps, batch, ...]``
        arrays for several steps in one call, the batch axis second).

        Every process holds the whole host batch (it is a pure function of the step) and
        transfers only the rows of its own devices, so this is also right on several hosts.
        """
        sharding = self.batch_sharding(stacked=stacked)
        out = {}
        for k, v in batch.items():
            host = np.asarray(v)
            out[k] = jax.make_array_from_callback(host.shape, sharding, lambda i, a=host: a[i])
        return out

    def jit_train_step(
        self,
        graphdef: nnx.GraphDef,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        state: TrainState,
        *,
        steps_per_call: int = 1,
        compiler_options: dict[str, Any] | None = None,
    ) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
        """`make_train_step` jitted with the state's shardings in and out, state donated;
        ``steps_per_call > 1``: `make_multi_step` of it, taking `shard_batch`'s stacked
        batches; ``compiler_options`` as ``jax.jit`` takes them (`cpu_matmul`)."""
        state_sh = self.shardings(state)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        fn = make_train_step(graphdef, tx, schedule)
        if steps_per_call > 1:
            fn = make_multi_step(fn)
        return jax.jit(
            fn,
            in_shardings=(state_sh, self.batch_sharding(stacked=steps_per_call > 1)),
            out_shardings=(state_sh, replicated),
            donate_argnums=0,
            compiler_options=compiler_options,
        )
