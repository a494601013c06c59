"""Run configuration: an ``ml_collections.ConfigDict`` at the edge becomes frozen dataclasses.

`RunConfig.from_config` converts and validates once; every error names the full field path,
the value and what is allowed, e.g. ``config.optim.learning_rate=-0.1: must be > 0``. Nothing
is written to a workdir before this succeeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping
from typing import Any

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn.model_config import ModelConfig

SOURCES = ("corpus", "task")
PROTOCOLS = ("nonoverlapping", "sliding")
SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "corpus"  # "corpus" (byte-level LM) or "task" (synthetic task)
    corpus: str = "stdlib"  # corpus registry name (flaxformer_lite.data.corpus_names())
    path: str = ""  # file, folder or list of files when corpus="path"
    cache_dir: str = ""  # corpus cache directory ("" = the library default)
    task: str = ""  # task registry name when source == "task"
    train_length: int = 64  # L: tokens per training sequence (task: the task length parameter)
    batch_size: int = 32  # sequences per training step


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 100  # linear warm-up from 0 to the peak
    final_lr_ratio: float = 0.1  # cosine decays to peak * final_lr_ratio at the last step
    weight_decay: float = 0.1  # decoupled weight decay on matrices (not norms or biases)
    clip_norm: float = 1.0  # global gradient-norm clipping (0 disables)
    b1: float = 0.9  # Adam beta1
    b2: float = 0.95  # Adam beta2
    eps: float = 1e-8  # Adam epsilon


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    num_steps: int = 500  # optimizer steps
    log_every: int = 50  # write training metrics every N steps
    eval_every: int = 0  # validation loss at the training length every N steps (0: only at end)
    checkpoint_every: int = 250  # save a checkpoint every N steps (and always at the end)
    keep_checkpoints: int = 2  # how many recent checkpoints to keep
    progress: bool = True  # show a tqdm progress bar


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    length_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)  # eval lengths = L x these
    protocols: tuple[str, ...] = ("nonoverlapping",)  # "nonoverlapping" and/or "sliding"
    stride_fraction: float = 0.5  # sliding window stride S = eval_length * this (>= 1 token)
    max_tokens: int = 65536  # score this many tokens of the split at every length
    batch_size: int = 8  # windows per evaluation batch
    split: str = "validation"  # "validation" or "test"
    num_examples: int = 256  # task sequences scored per length
    rope_scalings: tuple[str, ...] = ()  # extra RoPE rows, e.g. ("pi", "ntk", "yarn")
    chunked_threshold: int = 1024  # evaluate with chunked attention above this many keys


MESH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1  # devices along the data-parallel mesh axis; -1: all devices left over
    fsdp: int = 1  # devices along the parameter-sharding mesh axis; -1: all devices left over
    multihost: bool = False  # call jax.distributed.initialize() first (one process per host)
    # logical axis -> mesh axes ("+"-joined; empty: replicated); unnamed axes are replicated
    rules: tuple[str, ...] = ("batch=data", "embed=fsdp")

    def parsed_rules(self) -> dict[str, tuple[str, ...]]:
        """``{"batch": ("data",), "embed": ("fsdp",)}`` from ``rules`` (validated)."""
        out = {}
        for rule in self.rules:
            logical, _, mesh = rule.partition("=")
            out[logical.strip()] = tuple(a.strip() for a in mesh.split("+") if a.strip())
        return out


@dataclasses.dataclass(frozen=True)
class RunConfig:
    study: str
    preset: str
    seed: int
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    eval: EvalConfig
    mesh: MeshConfig = MeshConfig()

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        return tuple(self.data.train_length * m for m in self.eval.length_multiples)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunConfig:
        """Validate a ConfigDict (or dict) and freeze it; raises `ConfigError`."""
        values = _to_dict(config)
        known = {"study", "preset", "seed", "model", "data", "optim", "train", "eval"}
        known |= {"mesh", "sweep"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"config has unknown field(s) {unknown}; allowed: {sorted(known)}")
        try:
            model = ModelConfig.from_mapping(values.get("model", {}))
        except ValueError as e:
            raise ConfigError(f"config.model: {e}") from None
        run = cls(
            study=_check_type("config.study", values.get("study", "run"), str),
            preset=_check_type("config.preset", values.get("preset", ""), str),
            seed=_check_type("config.seed", values.get("seed", 0), int),
            model=model,
            data=_build(DataConfig, values.get("data", {}), "config.data"),
            optim=_build(OptimConfig, values.get("optim", {}), "config.optim"),
            train=_build(TrainConfig, values.get("train", {}), "config.train"),
            eval=_build(EvalConfig, values.get("eval", {}), "config.eval"),
            mesh=_build(MeshConfig, values.get("mesh", {}), "config.mesh"),
        )
        _validate(run)
        return run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        """The fields that define what is trained; a workdir only resumes a run with equal ones.

        Step counts, cadences, evaluation settings and the device mesh may change between
        invocations.
        """
        d = self.to_dict()
        d["train"] = {}
        d["eval"] = {}
        d.pop("mesh")
        d["model"].pop("attention_impl", None)
        return d

    def hash(self) -> str:
        """Short sha256 of the resolved config (recorded in results rows).

        The device mesh and the progress-bar switch are left out: they decide where and how
        visibly the numbers are computed, not what is computed.
        """
        d = self.to_dict()
        d.pop("mesh")
        d["train"].pop("progress")
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _to_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    return {k: (_to_dict(v) if isinstance(v, Mapping) else v) for k, v in dict(config).items()}


def _fail(path: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"{path}={value!r}: {allowed}")


def _check_type(path: str, value: Any, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin is tuple:
        (item_type, _) = typing.get_args(typ)
        if isinstance(value, str) or not isinstance(value, list | tuple):
            _fail(path, value, f"must be a tuple of {item_type.__name__}")
        return tuple(_check_type(f"{path}[{i}]", v, item_type) for i, v in enumerate(value))
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, value, "must be a number")
        return float(value)
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(path, value, "must be an int")
    if typ is bool and not isinstance(value, bool):
        _fail(path, value, "must be True or False")
    if typ is str and not isinstance(value, str):
        _fail(path, value, "must be a string")
    return value


def _build(cls: type, values: Mapping[str, Any], path: str) -> Any:
    if not isinstance(values, Mapping):
        _fail(path, values, "must be a mapping of fields")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"{path} has unknown field(s) {unknown}; allowed: {sorted(hints)}")
    kwargs = {k: _check_type(f"{path}.{k}", v, hints[k]) for k, v in values.items()}
    return cls(**kwargs)


def _positive(path: str, value: float) -> None:
    if not value > 0:
        _fail(path, value, "must be > 0")


def _validate(run: RunConfig) -> None:
    d, o, t, e = run.data, run.optim, run.train, run.eval
    if d.source not in SOURCES:
        _fail("config.data.source", d.source, f"allowed: {list(SOURCES)}")
    if d.source == "task" and not d.task:
        _fail("config.data.task", d.task, "a task name is required when config.data.source='task'")
    _positive("config.data.train_length", d.train_length)
    _positive("config.data.batch_size", d.batch_size)
    _positive("config.optim.learning_rate", o.learning_rate)
    _positive("config.optim.eps", o.eps)
    for name in ("warmup_steps",):
        if getattr(o, name) < 0:
            _fail(f"config.optim.{name}", getattr(o, name), "must be >= 0")
    for name in ("weight_decay", "clip_norm", "final_lr_ratio"):
        if getattr(o, name) < 0:
            _fail(f"config.optim.{name}", getattr(o, name), "must be >= 0")
    if o.final_lr_ratio > 1:
        _fail("config.optim.final_lr_ratio", o.final_lr_ratio, "must be in [0, 1]")
    for name in ("b1", "b2"):
        if not 0 <= getattr(o, name) < 1:
            _fail(f"config.optim.{name}", getattr(o, name), "must be in [0, 1)")
    _positive("config.train.num_steps", t.num_steps)
    _positive("config.train.log_every", t.log_every)
    _positive("config.train.checkpoint_every", t.checkpoint_every)
    _positive("config.train.keep_checkpoints", t.keep_checkpoints)
    if t.eval_every < 0:
        _fail("config.train.eval_every", t.eval_every, "must be >= 0 (0: evaluate only at the end)")
    _validate_eval(run, e)
    _validate_mesh(run)


def _validate_mesh(run: RunConfig) -> None:
    """Static checks; those that need the device count are in `train.sharding.make_mesh`."""
    m = run.mesh
    for name in MESH_AXES:
        value = getattr(m, name)
        if value != -1 and value < 1:
            _fail(f"config.mesh.{name}", value, "must be >= 1, or -1 for all devices left over")
    if m.data == -1 and m.fsdp == -1:
        _fail("config.mesh.fsdp", m.fsdp, "only one of config.mesh.data / fsdp may be -1")
    seen = set()
    for rule in m.rules:
        logical, eq, mesh = rule.partition("=")
        axes = [a.strip() for a in mesh.split("+") if a.strip()]
        if not eq or not logical.strip() or any(a not in MESH_AXES for a in axes):
            _fail(
                "config.mesh.rules",
                m.rules,
                f"each rule is 'logical_axis=mesh_axis[+mesh_axis]' (or 'logical_axis=' for "
                f"replicated) with mesh axes from {list(MESH_AXES)}; bad rule {rule!r}",
            )
        if logical.strip() in seen or len(set(axes)) != len(axes):
            _fail("config.mesh.rules", m.rules, f"rule {rule!r} repeats a logical or mesh axis")
        seen.add(logical.strip())
    batch_axes = m.parsed_rules().get("batch", ())
    known = [getattr(m, a) for a in batch_axes]
    if all(n > 0 for n in known):
        ways = 1
        for n in known:
            ways *= n
        if run.data.batch_size % ways:
            names = " x ".join(f"config.mesh.{a}={getattr(m, a)}" for a in batch_axes)
            _fail(
                "config.data.batch_size",
                run.data.batch_size,
                f"must be divisible by the {ways} data-parallel devices ({names}) it is split over",
            )


def _validate_eval(run: RunConfig, e: EvalConfig) -> None:
    if not e.length_multiples:
        _fail("config.eval.length_multiples", e.length_multiples, "must list at least one")
    for m in e.length_multiples:
        if m < 1:
            _fail(
                "config.eval.length_multiples",
                e.length_multiples,
                "each multiple must be >= 1 (an eval length shorter than the training length "
                "says nothing about extrapolation)",
            )
    for p in e.protocols:
        if p not in PROTOCOLS:
            _fail("config.eval.protocols", e.protocols, f"each must be one of {list(PROTOCOLS)}")
    if not 0 < e.stride_fraction <= 1:
        _fail("config.eval.stride_fraction", e.stride_fraction, "must be in (0, 1]")
    _positive("config.eval.max_tokens", e.max_tokens)
    _positive("config.eval.batch_size", e.batch_size)
    _positive("config.eval.num_examples", e.num_examples)
    _positive("config.eval.chunked_threshold", e.chunked_threshold)
    if e.split not in SPLITS:
        _fail("config.eval.split", e.split, f"allowed: {list(SPLITS)}")
    longest = max(run.eval_lengths)  # tokens for corpora (tasks check their own lengths)
    if (
        run.data.source == "corpus"
        and run.model.positional == "learned"
        and (run.model.max_length < longest)
    ):
        _fail(
            "config.model.max_length",
            run.model.max_length,
            f"the learned table must cover the longest evaluation length {longest} "
            "(rows past the training length stay untrained)",
        )
