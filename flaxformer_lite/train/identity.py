"""A run's identity: everything that changes its numbers, recorded in its workdir.

    identity = {
        "config":        RunConfig.identity(): the resolved config fields that change numbers
        "corpus_sha256": the corpus content hash (its provenance "sha256"; None for a task)
        "versions":      python, flaxformer-lite, jax, jaxlib, flax, optax, numpy
    }

`current(run, dataset)` adds ``"hash"`` (short sha256 of exactly that identity: the
``config_hash`` of ``eval.json`` and of every results row) and ``"recorded"`` (the git
commit and the JAX backend: kept for the record, never refused). `train.loop.prepare_workdir`
writes it to ``<workdir>/identity.json`` (atomically, before ``config.json`` and before any
other state), so every checkpoint, ``eval.json`` and ``rows.jsonl`` in a workdir was made by
the identity recorded there.

A workdir continues (resumes, or returns its finished result) only a run of an equal
identity; `compare` lists the fields that differ (``train.num_steps: 20 -> 40``,
``corpus_sha256: '1f0c...' -> '9ab2...'``, ``versions.jax: '0.4.30' -> '0.10.2'``) and the
caller refuses with them, or -- asked to (``--restart_changed``) -- `reset` starts the run
afresh in place. Decisions:

* Paths are not identity: ``data.path`` and ``data.cache_dir`` are replaced by the content
  hash, so identical content at a new path or cache is accepted and changed content at the
  same path is refused. The content hash covers file names (they decide a multi-file
  corpus's split), so a renamed single file counts as another corpus.
* Left out of ``config`` (they do not change a number in ``eval.json``): where and how
  visibly a run is computed (``mesh``, ``train.progress``, ``train.log_every``,
  ``train.steps_per_call``: the same steps, grouped into compiled calls; ``train.cpu_matmul``:
  which library computes the products, equal to float32 tolerance), when state is
  saved (``train.checkpoint_every``, ``train.keep_checkpoints``: a resume is exact),
  ``train.eval_every`` (validation curves in ``metrics.jsonl`` only), how attention is
  computed (``model.attention_impl``, ``model.chunked_threshold``: equal to float32
  tolerance), the names ``study`` and ``preset`` (the study directory records those:
  ``study.runner``), and what the report compares (``eval.paired_reference``,
  ``eval.paired_all``). Everything else is in, ``eval.batch_size`` too (randomized
  positions are drawn per evaluation batch).
* Versions refuse: a different Python, library version or jax/jaxlib/flax/optax/numpy. The
  git commit does not: a docs-only commit must not void a study, so a different commit is
  a warning (`compare`'s notes), as is another backend (cpu/gpu/tpu: equal to float
  tolerance, like the mesh). Code changed without a version bump is therefore only warned
  about: the commit is in every row.
* Only ``eval.*`` differs: the training is the same, so `reset` keeps the checkpoints and
  the run is evaluated again; anything else starts the run from step 0. A checkpoint is
  never resumed into another schedule.
* A workdir from before identity records (``config.json`` only) compares its config; its
  corpus and versions are unknown and are not checked (a note says so).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import jax

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.train import provenance
from flaxformer_lite.train.run_config import RunConfig, flat_diff

IDENTITY_FILE = "identity.json"
CONFIG_FILE = "config.json"
VERSION_PACKAGES = ("flaxformer-lite", "jax", "jaxlib", "flax", "optax", "numpy")
# What a workdir's run leaves, beside its identity: evidence of a run even without a record.
STATE = ("checkpoints", "eval.json", "rows.jsonl", "metrics.jsonl")
# The evaluation's outputs (rows first: without them a study cell is not finished).
EVALUATION_OUTPUTS = ("rows.jsonl", "blocks.jsonl", "eval.json", "provenance.json", "error.txt")


def versions() -> dict[str, str]:
    """The versions that refuse a resume: Python and `VERSION_PACKAGES`."""
    packages = provenance.package_versions()
    return {"python": platform.python_version()} | {k: packages[k] for k in VERSION_PACKAGES}


def corpus_sha256(dataset: Any) -> str | None:
    """The content hash of a corpus (its provenance ``sha256``); None for a task."""
    return dataset.provenance().get("sha256")


def identity_hash(record: dict[str, Any]) -> str:
    """Short sha256 of the identity part of ``record`` (config, corpus hash, versions)."""
    core = {k: record.get(k) for k in ("config", "corpus_sha256", "versions")}
    blob = json.dumps(core, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def current(run: RunConfig, dataset: Any) -> dict[str, Any]:
    """The identity of ``run`` on ``dataset`` (the opened corpus or task), with its hash and
    the recorded-only fields. Call after `train.loop.prepare_process` (reads the backend)."""
    record = {
        "config": run.identity(),
        "corpus_sha256": corpus_sha256(dataset),
        "versions": versions(),
    }
    record["hash"] = identity_hash(record)
    record["recorded"] = {"git_commit": provenance.git_commit(), "backend": jax.default_backend()}
    return record


def _read_json(path: Path) -> tuple[Any, dict[str, str] | None]:
    """``(content, None)``, or ``(None, {"problem": ...})`` when ``path`` cannot be read."""
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as e:
        return None, {"problem": f"{path} is unreadable ({type(e).__name__}: {e})"}


def recorded(workdir: Path) -> dict[str, Any] | None:
    """The identity recorded in ``workdir``; None when it holds no run.

    A workdir from before identity records yields ``{"config": ..., "legacy": True}`` (from
    its ``config.json``); one whose record cannot be read, or that holds run state without
    any record, yields ``{"problem": "..."}`` (it differs from every identity).
    """
    workdir = Path(workdir)
    path = workdir / IDENTITY_FILE
    if path.exists():
        record, problem = _read_json(path)
        if problem:
            return problem
        if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
            return {"problem": f"{path} is not an identity record"}
        return record
    path = workdir / CONFIG_FILE
    if path.exists():
        old, problem = _read_json(path)
        if problem:
            return problem
        if not isinstance(old, dict):
            return {"problem": f"{path} is not a config"}
        try:
            config = RunConfig.from_config(old).identity()
        except ConfigError as e:
            return {"problem": f"the recorded config.json is not a valid config here ({e})"}
        return {"config": config, "legacy": True}
    found = [name for name in STATE if (workdir / name).exists()]
    if found:
        return {"problem": f"{workdir} holds {', '.join(found)} but no {IDENTITY_FILE}"}
    return None


def compare(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(differences, notes)`` of the recorded identity ``old`` against ``new``.

    Differences (each ``"field: old -> new"``, or a problem of the record) refuse a resume;
    notes (another git commit or backend; a legacy record) are for a warning.
    """
    if old is None:
        return [], []
    if "problem" in old:
        return [old["problem"]], []
    diffs = flat_diff("", old["config"], new["config"])
    notes = []
    if old.get("legacy"):
        notes.append(
            f"recorded before {IDENTITY_FILE} existed: its corpus content and versions are "
            "not known and were not checked"
        )
    else:
        a, b = old.get("corpus_sha256"), new.get("corpus_sha256")
        if a != b:
            diffs.append(f"corpus_sha256: {_short(a)} -> {_short(b)}")
        diffs += flat_diff("versions.", old.get("versions") or {}, new.get("versions") or {})
    for key in ("git_commit", "backend"):
        a = (old.get("recorded") or {}).get(key)
        b = (new.get("recorded") or {}).get(key)
        if a and b and a != b and "unknown" not in (a, b):
            notes.append(f"its run so far used {key.replace('_', ' ')} {a}, this one {b}")
    return diffs, notes


def evaluation_only(diffs: list[str]) -> bool:
    """Whether only ``eval.*`` fields differ (the training, and its checkpoints, are equal)."""
    return bool(diffs) and all(d.startswith("eval.") for d in diffs)


def refusal(workdir: Path, diffs: list[str], more: list[str] = ()) -> str:
    """The one-line refusal of a workdir holding another identity; ``more``: the other
    cells whose workdirs differ too."""
    message = f"workdir={str(workdir)!r} holds a run of a different config (differs in "
    message += ", ".join(diffs) + ")"
    if more:
        shown = ", ".join(more[:5]) + (", ..." if len(more) > 5 else "")
        message += f"; so do {len(more)} more cell(s) ({shown})"
    what = "them" if more else "it"
    return (
        f"{message}; use another --workdir, the same config, or --restart_changed to start "
        f"{what} afresh in place"
    )


def write(workdir: Path, record: dict[str, Any], config: dict[str, Any]) -> None:
    """Record ``record`` in ``workdir/identity.json``, then the resolved ``config`` in
    ``config.json`` (both atomic)."""
    workdir = Path(workdir)
    atomic_write_text(workdir / IDENTITY_FILE, json.dumps(record, indent=1, sort_keys=True))
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    atomic_write_text(workdir / CONFIG_FILE, text)


def reset(
    workdir: Path,
    record: dict[str, Any] | None,
    config: dict[str, Any] | None,
    *,
    keep_training: bool,
) -> None:
    """Start the run in ``workdir`` afresh for the identity ``record``, then record it.

    ``keep_training`` (only ``eval.*`` differs: `evaluation_only`): delete the evaluation's
    outputs and keep the checkpoints and metrics; else delete everything in ``workdir`` but
    hidden files (a lock). ``rows.jsonl`` goes first and the new record is written last
    (``record`` None: the old one is deleted last), so a kill in between leaves a workdir
    that is unfinished and still differs (refused, or reset again).
    """
    workdir = Path(workdir)
    if keep_training:
        doomed = [workdir / name for name in EVALUATION_OUTPUTS]
    else:
        keep = {IDENTITY_FILE, CONFIG_FILE, "rows.jsonl"}
        doomed = [workdir / "rows.jsonl"]  # hidden files (the workdir's lock) stay
        doomed += sorted(p for p in workdir.iterdir() if p.name not in keep and p.name[0] != ".")
    if record is None:
        doomed += [workdir / CONFIG_FILE, workdir / IDENTITY_FILE]
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if record is not None:
        write(workdir, record, config)


def _short(value: Any) -> str:
    return repr(value[:16] + "...") if isinstance(value, str) and len(value) > 16 else repr(value)
