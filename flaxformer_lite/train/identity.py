"""A run's identity: everything that changes its numbers, recorded in its workdir.

    identity = {
        "config":        RunConfig.identity(): the resolved config fields that change numbers
        "corpus_sha256": the corpus content hash (its provenance "sha256"; None for a task)
        "versions":      python, flaxformer-lite, jax, jaxlib, flax, optax, numpy
        "pretrained":    a pretrained model's run only: {"weights_sha256", "tokenizer_sha256",
                         "documents" (separator, BOS, how text is scored)}
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
* A pretrained model is its content, likewise: ``pretrained.source`` and ``revision`` are
  replaced by the sha256 of its weight files and of its tokenizer files (its architecture,
  the mapped ``config.json``, is in ``config.model``). An identical folder moved to a new
  path continues its run; weights changed in place are refused. Hashing gigabytes at every
  resume is avoided: each file's size and modification time are recorded
  (``recorded.pretrained_files``) and the hashes are recomputed only when those differ.
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
* `reset` deletes only what a run writes (`RUN_FILES`: fixed names, and inside
  ``checkpoints/`` and ``tensorboard/`` only this project's steps and event files): a user's
  notes, job logs or sources in the workdir stay, and it says which it kept.
* A workdir from before identity records (``config.json`` only) compares its config; its
  corpus and versions are unknown and are not checked (a note says so).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import jax

from flaxformer_lite import pretrained as hf
from flaxformer_lite.base.checks import ConfigError, shown
from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.train import checkpoint, provenance
from flaxformer_lite.train.run_config import PRETRAINED_PLACE, RunConfig, flat_diff

IDENTITY_FILE = "identity.json"
CONFIG_FILE = "config.json"
# How a pretrained model's scored text is made (`flaxformer_lite.data.tokens`), in its run's
# identity: "prefix-cut" -- the split starts with a context token (its first token of text is
# scored) and a token boundary is forced at eval.max_bytes. A run recorded before has none, so
# its workdir is not resumed as if its numbers were these.
SCORED_TEXT = "prefix-cut"
VERSION_PACKAGES = ("flaxformer-lite", "jax", "jaxlib", "flax", "optax", "numpy")
# What a workdir's run leaves, beside its identity: evidence of a run even without a record.
STATE = ("checkpoints", "eval.json", "rows.jsonl", "metrics.jsonl")
# The evaluation's outputs (rows first: without them a study cell is not finished).
# each finished evaluation cell, so that a stopped evaluation resumes (`train.loop`)
EVAL_CELLS_FILE = "eval_cells.jsonl"
EVALUATION_OUTPUTS = (
    "rows.jsonl",
    "blocks.jsonl",
    "eval.json",
    "provenance.json",
    "error.txt",
    EVAL_CELLS_FILE,
)
# Every name a run writes in its workdir (`train.loop`, the study runner): all that `reset`
# may delete. Folders are emptied of what the run wrote in them (`checkpoint.remove_steps`,
# TensorBoard event files) and removed only when nothing else is left in them.
RUN_FILES = (
    *EVALUATION_OUTPUTS,
    "checkpoints",
    "metrics.jsonl",
    "tensorboard",
    IDENTITY_FILE,
    CONFIG_FILE,
)
TENSORBOARD_EVENTS = "events.out.tfevents.*"


def versions() -> dict[str, str]:
    """The versions that refuse a resume: Python and `VERSION_PACKAGES`."""
    packages = provenance.package_versions()
    return {"python": platform.python_version()} | {k: packages[k] for k in VERSION_PACKAGES}


def corpus_sha256(dataset: Any) -> str | None:
    """The content hash of a corpus (its provenance ``sha256``); None for a task."""
    return dataset.provenance().get("sha256")


def identity_hash(record: dict[str, Any]) -> str:
    """Short sha256 of the identity part of ``record`` (config, corpus hash, versions, and a
    pretrained model's content hashes when it has one)."""
    core = {k: record.get(k) for k in ("config", "corpus_sha256", "versions")}
    if record.get("pretrained") is not None:  # absent for a trained run: its hash is as before
        core["pretrained"] = record["pretrained"]
    blob = json.dumps(core, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def current(run: RunConfig, dataset: Any, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The identity of ``run`` on ``dataset`` (the opened corpus or task), with its hash and
    the recorded-only fields. Call after `train.loop.prepare_process` (reads the backend).
    ``previous``: the workdir's recorded identity (`recorded`), whose pretrained content
    hashes are reused when the model's files have the sizes and times recorded with them."""
    record = {
        "config": run.identity(),
        "corpus_sha256": corpus_sha256(dataset),
        "versions": versions(),
    }
    content = pretrained_content(run, previous)
    if content is not None:
        record["pretrained"] = content[0]
    record["hash"] = identity_hash(record)
    record["recorded"] = {"git_commit": provenance.git_commit(), "backend": jax.default_backend()}
    if content is not None:
        record["recorded"]["pretrained_files"] = content[1]
    return record


def pretrained_content(
    run: RunConfig, previous: dict[str, Any] | None = None
) -> tuple[dict[str, str | None], dict[str, list[int]]] | None:
    """``({"weights_sha256", "tokenizer_sha256", "documents"}, {file: [size, mtime_ns]})`` of
    the model
    ``run.pretrained.source`` names (None for a trained run): the hashes of `previous` when
    its recorded files have the same names, sizes and times, else computed (`content_hash`).
    `ConfigError` naming the source when its files cannot be listed or read."""
    source = run.pretrained.source
    if not source:
        return None
    try:
        checkpoint = hf.open_checkpoint(source, revision=run.pretrained.revision or None)
        weights, tokens = checkpoint.content_files()
        stats = hf.file_stats(checkpoint.folder, weights + tokens)
        # how documents are joined and started (`Checkpoint.separator_id`, `bos_id`) and how
        # text is credited (`SCORED_TEXT`): the scores change with them
        documents = {
            "separator_id": checkpoint.separator_id,
            "bos_id": checkpoint.bos_id,
            "scored_text": SCORED_TEXT,
        }
        old = previous or {}
        if old.get("pretrained") and (old.get("recorded") or {}).get("pretrained_files") == stats:
            return old["pretrained"] | {"documents": documents}, stats
        hashes = {
            "weights_sha256": hf.content_hash(weights),
            "tokenizer_sha256": hf.content_hash(tokens) if tokens else None,
            "documents": documents,
        }
    except (OSError, ValueError) as e:  # PretrainedError is a ValueError
        raise ConfigError(f"config.pretrained.source={shown(source)}: {e}") from None
    return hashes, stats


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
            config = RunConfig.from_recorded(old).identity()
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
    old_config, notes = old["config"], []
    if new.get("pretrained") is not None and "pretrained" not in old and not old.get("legacy"):
        # recorded when a model's path was its identity: compare the rest, say so
        where = PRETRAINED_PLACE
        model = {k: v for k, v in (old_config.get("pretrained") or {}).items() if k not in where}
        old_config = old_config | {"pretrained": model}
        notes.append(
            "recorded before a model's content was part of its identity: its weights and "
            "tokenizer were not checked"
        )
    diffs = flat_diff("", old_config, new["config"])
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
        if "pretrained" in old:
            for key in ("weights_sha256", "tokenizer_sha256"):
                a = (old.get("pretrained") or {}).get(key)
                b = (new.get("pretrained") or {}).get(key)
                if a != b:
                    diffs.append(f"pretrained.{key}: {_short(a, 23)} -> {_short(b, 23)}")
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
) -> list[str]:
    """Start the run in ``workdir`` afresh for the identity ``record``, then record it.

    Deletes only what a run writes (`RUN_FILES`): ``keep_training`` (only ``eval.*``
    differs: `evaluation_only`) deletes the evaluation's outputs and keeps the checkpoints and
    metrics; else every file of the run goes (of ``checkpoints/`` its own steps
    (`checkpoint.remove_steps`), of ``tensorboard/`` its event files; each folder itself
    only once empty). Anything else -- a user's notes, job logs, sources, hidden files such
    as the lock -- stays. ``rows.jsonl`` goes first and the new record is written last
    (``record`` None: the old one is deleted last), so a kill in between leaves a workdir
    that is unfinished and still differs (refused, or reset again). A run folder that is a
    symbolic link is refused (`checkpoint.refuse_link`) before anything is deleted.

    Returns the names (``name/`` for a folder; ``checkpoints/name`` inside a run folder) it
    left because the run did not make them, sorted, for the caller's one line.
    """
    workdir = Path(workdir)
    for name in ("checkpoints", "tensorboard"):
        checkpoint.refuse_link(workdir / name)
    recorded_files = (IDENTITY_FILE, CONFIG_FILE)  # rewritten by `write`, or deleted last
    names = [n for n in RUN_FILES if n not in recorded_files]
    names = EVALUATION_OUTPUTS if keep_training else names
    doomed = [workdir / name for name in dict.fromkeys(("rows.jsonl", *names))]
    if record is None:
        doomed += [workdir / name for name in recorded_files]
    kept: list[str] = []
    for path in doomed:
        if path.name == "checkpoints" and path.is_dir():
            kept += [f"checkpoints/{name}" for name in checkpoint.remove_steps(path)]
        elif path.name == "tensorboard" and path.is_dir():
            for event in path.glob(TENSORBOARD_EVENTS):
                if event.is_file() or event.is_symlink():
                    event.unlink()
            others = sorted(p.name for p in path.iterdir())
            kept += [f"tensorboard/{name}" for name in others]
            if not others:
                path.rmdir()
        elif path.is_dir() and not path.is_symlink():
            kept.append(f"{path.name}/")  # a folder where the run writes a file: not its own
        else:
            path.unlink(missing_ok=True)
    if record is not None:
        write(workdir, record, config)
    if workdir.is_dir():
        owned = set(RUN_FILES)
        kept += [
            p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
            for p in workdir.iterdir()
            if p.name not in owned and not p.name.startswith(".")
        ]
    return sorted(set(kept))


def kept_line(workdir: Path, kept: list[str]) -> str:
    """The one line naming what `reset` left in ``workdir`` (the run did not make it)."""
    shown = ", ".join(kept[:8]) + (f", ... ({len(kept)} in all)" if len(kept) > 8 else "")
    return f"workdir={str(workdir)!r}: kept what the run did not make: {shown}"


def _short(value: Any, size: int = 16) -> str:
    """``value``'s repr, a long string cut to ``size`` characters."""
    if isinstance(value, str) and len(value) > size:
        return repr(value[:size] + "...")
    return repr(value)
