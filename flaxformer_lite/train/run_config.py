"""Run configuration: an ``ml_collections.ConfigDict`` at the edge becomes frozen dataclasses.

A run config is composed of the sections each layer owns: ``model`` (`nn.ModelConfig`),
``data`` (`data.DataConfig`), ``eval`` (`evaluation.EvalConfig`), and this layer's ``optim``,
``train`` and ``mesh``. `RunConfig.from_config` converts and validates once -- including the
run's evaluation plan (`RunConfig.eval_plan`), so an encoding that cannot reach the longest
evaluation length fails before training; every error names the full field path, the value
and what is allowed, e.g. ``config.optim.learning_rate=-0.1: must be > 0``. Nothing is
written to a workdir before this succeeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from collections.abc import Mapping
from typing import Any

from flaxformer_lite import pretrained as hf
from flaxformer_lite.base.checks import ConfigError, check_path, check_type, fail, shown
from flaxformer_lite.base.fields import field_comments
from flaxformer_lite.data.data_config import DataConfig
from flaxformer_lite.evaluation.eval_config import EvalConfig, evaluation_lengths
from flaxformer_lite.evaluation.plan import EvalPlan
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.train import cpu_matmul, sizing

MAX_SEED = 2**32 - 2  # seeds feed numpy's and JAX's generators (seed + 1: dropout's)


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
    progress: bool = True  # tqdm progress bars when stderr is a terminal (base.progress)
    # optimizer steps per compiled call (a `lax.scan` over that many batches): the same
    # numbers, less per-call overhead for small models (docs/performance.md); 1: one step.
    # Steps before a checkpoint or validation that do not fill a call run one per call.
    steps_per_call: int = 1
    # which library runs a CPU step's matrix products (`train.cpu_matmul`): "auto" (oneDNN
    # for float32 models, and bf16 models on a jaxlib that leaves their bf16 products to XLA,
    # where this jaxlib passes its check; else XLA's default), "onednn", "xla". The same
    # values to float32 tolerance, faster with oneDNN (docs/performance.md).
    cpu_matmul: str = "auto"


MESH_AXES = ("data", "fsdp")
# ModelConfig fields a pretrained model's run may set: how it computes, not what
PRETRAINED_MODEL_FIELDS = ("dtype", "param_dtype", "attention_impl", "chunked_threshold")


@dataclasses.dataclass(frozen=True)
class PretrainedConfig:
    # A Hugging Face model folder or hub id (`flaxformer_lite.pretrained`): the run evaluates
    # that model instead of training config.model; "" trains as usual.
    source: str = ""
    revision: str = ""  # hub revision (branch, tag or commit); "": the default branch
    name: str = ""  # the model's row name in tables; "": the source's last path part

    @property
    def label(self) -> str:
        return self.name or self.source.rstrip("/").rsplit("/", 1)[-1]

    def checkpoint(self) -> hf.Checkpoint:
        """The model's `pretrained.Checkpoint` (resolved, read and mapped once per process)."""
        return hf.open_checkpoint(self.source, revision=self.revision or None)


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
    study: str  # the study's name, recorded in every results row
    preset: str  # the study config's preset, recorded in every results row
    seed: int  # parameter initialisation, data order and dropout (a sweep sets it per cell)
    model: ModelConfig  # the model (a pretrained run: how it computes, not what)
    data: DataConfig  # the corpus or synthetic task, training length and batch size
    optim: OptimConfig  # AdamW and its learning-rate schedule
    train: TrainConfig  # steps, logging, checkpoints, progress
    eval: EvalConfig  # evaluation lengths, protocols and the report's comparisons
    mesh: MeshConfig = MeshConfig()  # how devices split the batch and the parameters
    pretrained: PretrainedConfig = PretrainedConfig()  # a model to load instead of training

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        return tuple(evaluation_lengths(self.data.train_length, self.eval))

    def eval_plan(self) -> EvalPlan:
        """Every evaluation of this run (`flaxformer_lite.evaluation.plan.EvalPlan`)."""
        name = self.pretrained.label if self.pretrained.source else None
        return EvalPlan.build(self.model, self.data, self.eval, seed=self.seed, name=name)

    @classmethod
    def from_recorded(cls, config: Mapping[str, Any]) -> RunConfig:
        """The run a workdir records (its ``config.json``, or ``eval.json``'s ``"config"``:
        `to_dict`), validated as `from_config` does. A pretrained model's run records the
        whole mapped `ModelConfig`; it is taken as recorded (the model folder is not read
        again: it may have moved), where a config given by a user may set only
        `PRETRAINED_MODEL_FIELDS`."""
        return cls._from_mapping(config, recorded=True)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunConfig:
        """Validate a ConfigDict (or dict) and freeze it; raises `ConfigError`."""
        return cls._from_mapping(config, recorded=False)

    @classmethod
    def _from_mapping(cls, config: Mapping[str, Any], *, recorded: bool) -> RunConfig:
        values = _to_dict(config)
        known = {"study", "preset", "seed", "model", "data", "optim", "train", "eval"}
        known |= {"mesh", "sweep", "pretrained", "sizing"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"config has unknown field(s) {unknown}; allowed: {sorted(known)}")
        if values.get("sizing") and not values.get("pretrained", {}).get("source"):
            try:  # an overridden L resizes the options sized to L (train.sizing)
                values = sizing.resize(values)
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"config.sizing: {e}") from None
        pretrained = _build(PretrainedConfig, values.get("pretrained", {}), "config.pretrained")
        data = _build(DataConfig, values.get("data", {}), "config.data")
        if pretrained.source and not recorded:
            model = _pretrained_model(pretrained, values.get("model", {}), data)
        else:
            try:
                model = ModelConfig.from_mapping(values.get("model", {}))
            except ValueError as e:
                raise ConfigError(f"config.model: {e}") from None
            model = model.with_temperature_length(data.train_length)
        run = cls(
            study=check_type("config.study", values.get("study", "run"), str),
            preset=check_type("config.preset", values.get("preset", ""), str),
            seed=check_type("config.seed", values.get("seed", 0), int),
            model=model,
            data=data,
            optim=_build(OptimConfig, values.get("optim", {}), "config.optim"),
            train=_build(TrainConfig, values.get("train", {}), "config.train"),
            eval=_build(EvalConfig, values.get("eval", {}), "config.eval"),
            mesh=_build(MeshConfig, values.get("mesh", {}), "config.mesh"),
            pretrained=pretrained,
        )
        _validate(run)
        return run

    def to_dict(self) -> dict[str, Any]:
        """Every section as plain values (the model's by `ModelConfig.to_dict`)."""
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        return out

    def identity(self) -> dict[str, Any]:
        """The resolved config fields that change a run's numbers (JSON types).

        A workdir continues only a run of an equal identity, which `train.identity` extends
        with the corpus content hash and the versions. Left out (`NOT_IDENTITY_FIELDS`, the
        reasons in `train.identity`): the names ``study`` and ``preset``, the device
        ``mesh``, the corpus's paths (its content hash stands for them), where a pretrained
        model is (its content hashes stand for it, in `train.identity`), logging,
        checkpointing and validation cadences, how many steps one compiled call runs, how
        attention is computed, and the report's comparison settings.
        """
        d = self.to_dict()
        for name in ("study", "preset", "mesh"):
            d.pop(name)
        for section, names in NOT_IDENTITY_FIELDS.items():
            for name in names:
                d[section].pop(name)
        for section, names in IDENTITY_ADDED_FIELDS.items():
            defaults = {f.name: f.default for f in dataclasses.fields(type(getattr(self, section)))}
            for name in names:
                if d[section][name] == defaults[name]:
                    d[section].pop(name)
        options = d["model"]["positional_options"]
        for name, default in IDENTITY_ADDED_OPTIONS.items():
            if name in options and options[name] == default:
                options.pop(name)
        if self.pretrained.source:
            for name in PRETRAINED_PLACE:
                d["pretrained"].pop(name)
        else:
            for (section, name), recorded in IDENTITY_RECORDED_NAMES.items():
                d[section][recorded] = d[section].pop(name)
        return json.loads(json.dumps(d, default=str))

    def identity_diff(self, other: RunConfig) -> list[str]:
        """``["section.field: old -> new", ...]`` where ``other``'s identity differs (nested
        fields by their full path, e.g. ``model.positional_options.rope.base``)."""
        lines = flat_diff("", other.identity(), self.identity())
        for (section, name), recorded in IDENTITY_RECORDED_NAMES.items():
            lines = [re.sub(rf"^{section}\.{recorded}:", f"{section}.{name}:", x) for x in lines]
        return lines

    def hash(self) -> str:
        """Short sha256 of `identity` (results rows carry `train.identity`'s hash, which adds
        the corpus content hash and the versions)."""
        blob = json.dumps(self.identity(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "mesh": MeshConfig,
    "pretrained": PretrainedConfig,
}


def field_docs() -> dict[str, tuple[str, str]]:
    """``{"section.field": (type, meaning)}`` for every field of a run config, sections
    included (``"model"``), and ``"model.positional_options.<encoding>.<option>"`` for the
    options of every registered encoding; the type as its dataclass annotates it, the
    meaning the comment beside the field in the dataclass's source
    (`base.fields.field_comments`), so a listing of the fields and the code say the same.
    ``config.sizing`` (`train.sizing.RECORDED_LENGTHS`) is included; ``config.sweep`` is the
    study layer's."""
    docs: dict[str, tuple[str, str]] = {}

    def add(prefix: str, cls: type) -> None:
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            docs[f"{prefix}{f.name}"] = (_type_text(f.type), comments[f.name])

    add("", RunConfig)
    for section, cls in SECTIONS.items():
        add(f"{section}.", cls)
    for name in registry.positional_encoding_names():
        docs[f"model.positional_options.{name}"] = ("section", f"options of the {name} encoding")
        add(f"model.positional_options.{name}.", registry.get_positional_encoding(name).options)
    docs["sizing"] = ("section", "the lengths the options sized to L were set for (train.sizing)")
    for name, meaning in sizing.RECORDED_LENGTHS.items():
        docs[f"sizing.{name}"] = ("int", meaning)
    return docs


def _type_text(annotation: Any) -> str:
    """``"int | None"`` for an annotation (a string under postponed evaluation, or a type)."""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", str(annotation))


# Where a pretrained model is: left out of its run's identity, which `train.identity` gives
# the sha256 of its weights and tokenizer instead (a trained run keeps these empty fields, so
# its identity, and every hash recorded with it, stays as it was).
PRETRAINED_PLACE = ("source", "revision")
# Config fields that do not change a run's numbers: left out of its identity (and hash).
NOT_IDENTITY_FIELDS = {
    "model": ("attention_impl", "chunked_threshold"),  # how attention is computed, not what
    "data": ("path", "cache_dir"),  # where the corpus is: its content hash is the identity
    "train": (
        "log_every",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "progress",
        "steps_per_call",  # how the steps are grouped into compiled calls, not what they compute
        "cpu_matmul",  # which library computes the products (equal to float32 tolerance)
    ),
    "eval": ("paired_reference", "paired_all"),  # what the report compares
    "pretrained": ("name",),  # the model's row name (its place: `PRETRAINED_PLACE`)
}


# Fields renamed since runs were recorded keep their recorded name in a trained run's
# identity, so the rename voids no finished workdir. ``eval.max_bytes`` was ``max_tokens``:
# on a byte corpus (every trained run's) a target is a byte, so the value means the same;
# a pretrained run's cap now counts bytes of text, not tokens, so its identity takes the new
# name and an earlier token-capped run is not mistaken for it.
IDENTITY_RECORDED_NAMES = {("eval", "max_bytes"): "max_tokens"}

# Fields added since runs were recorded: left out of the identity while at their default (the
# behaviour every earlier run had), so adding an option voids no finished workdir; any other
# value is part of it.
IDENTITY_ADDED_FIELDS = {
    "model": (
        "head_size",
        "qk_norm",
        "sandwich_norm",
        "query_pre_attn_scalar",
        "layer_pattern",
        "attention_sinks",
        "attention_temperature",
        "temperature_length",
        "temperature_floor_scale",
        "temperature_attn_scale",
        "attention_keep_first",
    ),
    "eval": ("temperatures", "length_divisors", "streaming_first"),
}
# Options added to an encoding since runs were recorded (ALiBi's position interpolation), left
# out of the chosen encoding's options in the identity while at this default.
IDENTITY_ADDED_OPTIONS = {"pi_train_length": None, "pi_eval_length": None}


def _pretrained_model(
    pretrained: PretrainedConfig, values: Mapping[str, Any], data: DataConfig
) -> ModelConfig:
    """The `ModelConfig` of ``config.pretrained.source`` (its ``config.json``), with the
    `PRETRAINED_MODEL_FIELDS` of ``config.model`` applied. A RoPE model's ``original_length``
    (the length evaluation-time scalings extend from; a layer pattern's RoPE kinds' too,
    `ModelConfig.with_original_length`) defaults to ``config.data.train_length``, the
    model's training context."""
    values = dict(values) if isinstance(values, Mapping) else {}
    extra = sorted(set(values) - set(PRETRAINED_MODEL_FIELDS))
    if extra:
        raise ConfigError(
            f"config.model has field(s) {extra}, but config.pretrained.source="
            f"{pretrained.source!r} takes its architecture from its config.json; only "
            f"{list(PRETRAINED_MODEL_FIELDS)} may be set"
        )
    check_path("config.pretrained.source", pretrained.source)
    try:
        model = pretrained.checkpoint().config.replace(**values)
    except ValueError as e:
        raise ConfigError(f"config.pretrained.source={shown(pretrained.source)}: {e}") from None
    except OSError as e:  # a name too long, unreadable, ...
        fail("config.pretrained.source", pretrained.source, f"cannot be read ({e.strerror or e})")
    return model.with_original_length(data.train_length)


def flat_diff(prefix: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``["prefix.key.sub: old -> new", ...]`` over nested mappings."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, "<absent>"), b.get(key, "<absent>")
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += flat_diff(f"{prefix}{key}.", x, y)
        elif x != y:
            out.append(f"{prefix}{key}: {x!r} -> {y!r}")
    return out


def _to_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    return {k: (_to_dict(v) if isinstance(v, Mapping) else v) for k, v in dict(config).items()}


def _build(cls: type, values: Mapping[str, Any], path: str) -> Any:
    if not isinstance(values, Mapping):
        fail(path, values, "must be a mapping of fields")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"{path} has unknown field(s) {unknown}; allowed: {sorted(hints)}")
    kwargs = {k: check_type(f"{path}.{k}", v, hints[k]) for k, v in values.items()}
    return cls(**kwargs)


def _positive(path: str, value: float) -> None:
    if not value > 0:
        fail(path, value, "must be > 0")


def _positive_finite(path: str, value: float) -> None:
    if not 0 < value < math.inf:  # NaN fails too
        fail(path, value, "must be > 0 and finite")


def _validate(run: RunConfig) -> None:
    o, t = run.optim, run.train
    run.data.validate()
    run.eval.validate()
    if run.eval.length_divisors and not run.pretrained.source:
        fail(
            "config.eval.length_divisors",
            run.eval.length_divisors,
            "must be () for a trained model (an eval length shorter than the training length "
            "says nothing about extrapolation); it is for a pretrained model's in-distribution "
            "lengths",
        )
    evaluation_lengths(run.data.train_length, run.eval)
    if not 0 <= run.seed <= MAX_SEED:
        fail("config.seed", run.seed, f"must be an int in [0, {MAX_SEED}]")
    _positive_finite("config.optim.learning_rate", o.learning_rate)
    _positive_finite("config.optim.eps", o.eps)
    if o.warmup_steps < 0:
        fail("config.optim.warmup_steps", o.warmup_steps, "must be >= 0")
    for name in ("weight_decay", "clip_norm", "final_lr_ratio"):
        if not 0 <= getattr(o, name) < math.inf:  # NaN fails too
            fail(f"config.optim.{name}", getattr(o, name), "must be >= 0 and finite")
    if o.final_lr_ratio > 1:
        fail("config.optim.final_lr_ratio", o.final_lr_ratio, "must be in [0, 1]")
    for name in ("b1", "b2"):
        if not 0 <= getattr(o, name) < 1:
            fail(f"config.optim.{name}", getattr(o, name), "must be in [0, 1)")
    for name in ("num_steps", "log_every", "checkpoint_every", "keep_checkpoints"):
        _positive(f"config.train.{name}", getattr(t, name))
    if t.eval_every < 0:
        fail("config.train.eval_every", t.eval_every, "must be >= 0 (0: evaluate only at the end)")
    _positive("config.train.steps_per_call", t.steps_per_call)
    cpu_matmul.check_choice(t.cpu_matmul)
    cadences = {"num_steps": t.num_steps, "checkpoint_every": t.checkpoint_every}
    if t.eval_every:
        cadences["eval_every"] = t.eval_every
    shortest = min(cadences, key=cadences.get)
    if t.steps_per_call > cadences[shortest]:  # no call could run that many steps
        fail(
            "config.train.steps_per_call",
            t.steps_per_call,
            f"must be <= config.train.{shortest}={cadences[shortest]}: the steps of one call "
            "end before a checkpoint, a validation or the end",
        )
    _validate_mesh(run)
    run.eval_plan()  # the encoding covers every evaluation length, variants exist, ...


def _validate_mesh(run: RunConfig) -> None:
    """Static checks; those that need the device count are in `train.sharding.make_mesh`."""
    m = run.mesh
    for name in MESH_AXES:
        value = getattr(m, name)
        if value != -1 and value < 1:
            fail(f"config.mesh.{name}", value, "must be >= 1, or -1 for all devices left over")
    if m.data == -1 and m.fsdp == -1:
        fail("config.mesh.fsdp", m.fsdp, "only one of config.mesh.data / fsdp may be -1")
    seen = set()
    for rule in m.rules:
        logical, eq, mesh = rule.partition("=")
        axes = [a.strip() for a in mesh.split("+") if a.strip()]
        if not eq or not logical.strip() or any(a not in MESH_AXES for a in axes):
            fail(
                "config.mesh.rules",
                m.rules,
                f"each rule is 'logical_axis=mesh_axis[+mesh_axis]' (or 'logical_axis=' for "
                f"replicated) with mesh axes from {list(MESH_AXES)}; bad rule {rule!r}",
            )
        if logical.strip() in seen or len(set(axes)) != len(axes):
            fail("config.mesh.rules", m.rules, f"rule {rule!r} repeats a logical or mesh axis")
        seen.add(logical.strip())
    batch_axes = m.parsed_rules().get("batch", ())
    known = [getattr(m, a) for a in batch_axes]
    if all(n > 0 for n in known):
        ways = math.prod(known)
        if run.data.batch_size % ways:
            names = " x ".join(f"config.mesh.{a}={getattr(m, a)}" for a in batch_axes)
            fail(
                "config.data.batch_size",
                run.data.batch_size,
                f"must be divisible by the {ways} data-parallel devices ({names}) it is split over",
            )
