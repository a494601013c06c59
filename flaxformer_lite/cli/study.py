r"""Run a study: every cell (encoding x seed x ...) of a study config's sweep, then its report.

    flaxformer-lite study --config=extrapolation_lm:quick --workdir=runs/quick
    flaxformer-lite study --config=configs/extrapolation_lm.py:cpu --workdir=runs/cpu \
        --only=alibi,rope
    flaxformer-lite study --config=extrapolation_lm:cpu \
        --shard=$SLURM_ARRAY_TASK_ID/4 --workdir=runs/cpu-$SLURM_ARRAY_TASK_ID
    flaxformer-lite report runs/cpu-* --out=runs/cpu

    flaxformer-lite study --config=pretrained:small --model=models/my-model \
        --model=HuggingFaceTB/SmolLM2-135M --workdir=runs/mine

(``python scripts/run_study.py`` and ``python -m flaxformer_lite study`` are the same command.)
--config takes a packaged study config by name (NAME:PRESET) or a config file by path
(FILE.py:PRESET); --list-fields prints every --config.* field with its type, value and
meaning.

--model=DIR_OR_HUB_ID_OR_GGUF[:LENGTH] (repeatable, pretrained studies only) replaces the
preset's ``sweep.models`` with these models (`use_models`): each named by its folder's, hub
id's or file's name, at its training context LENGTH or, without it, the context its config
states. Hub models that are neither cached nor downloadable are all named at once, each
with the ``hf download`` command that fetches it and the ``--model=`` that takes the result.

--shard=I/N (0-based, 0 <= I < N) runs a deterministic 1/N of the selected cells, balanced
by an estimated cost (`sweeps.shard_cells`), each shard into its own workdir; ``report``
merges the shards' workdirs and names the cells that are missing.

Rerunning the same command skips finished cells and resumes an interrupted one; a cell
whose run differs in what changes its numbers (config, corpus content, versions) is refused
unless --restart_changed, and a workdir holds one study. A failed cell is reported at the end
and the exit status is non-zero. A second process on the same workdir, a failed write of the
study's state (disk full) and SIGINT/SIGTERM each end with one line on stderr
(`common.one_line_failures`; status 2, 1, 130/143). The work is
`flaxformer_lite.study.runner.run_study`; this command parses flags and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from flaxformer_lite import pretrained
from flaxformer_lite.base.checks import ConfigError, fail
from flaxformer_lite.cli import common
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.pretrained.load import CONTEXT_FIELDS
from flaxformer_lite.study import sweeps

_CONFIG = config_flags.DEFINE_config_file("config", None, common.config_help(), lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "the study directory")
_ONLY = flags.DEFINE_list("only", [], "run only these encodings or cell names, e.g. alibi,rope")
_MODEL = flags.DEFINE_multi_string(
    "model",
    [],
    "a pretrained study's model: a Hugging Face model folder, hub id or GGUF file, "
    "optionally :LENGTH (its training context in tokens; default: the context its config "
    "states, " + ", ".join(CONTEXT_FIELDS) + "); repeatable; replaces the preset's models",
)
_PROGRESS = flags.DEFINE_bool(
    "progress",
    True,
    "progress bars when stderr is a terminal; elsewhere (a log file, a pipe) one line per cell",
)
_RESTART = flags.DEFINE_bool(
    "restart_changed",
    False,
    "cells holding a run of another identity (config, corpus content, versions) start afresh "
    "in place (only eval.* changed: evaluated again) instead of being refused",
)
_SHARD = flags.DEFINE_string(
    "shard",
    None,
    "I/N: run only shard I (0-based, 0 <= I < N) of N of the selected cells, balanced by "
    "estimated cost; give each shard its own --workdir and merge them with the report command",
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    config = _CONFIG.value
    shard = None
    if _SHARD.value is not None:
        try:
            shard = sweeps.parse_shard(_SHARD.value)
        except ConfigError as e:
            common.fail(str(e))
    with config.unlocked():
        config.train.progress = config.train.progress and _PROGRESS.value
    with common.one_line_failures():
        if _MODEL.value:
            use_models(config, _MODEL.value, overrides=common.config_overrides(sys.argv))
        outcome = run_study(
            config,
            _WORKDIR.value,
            only=_ONLY.value,
            command=common.command_line(sys.argv),
            overrides=common.config_overrides(sys.argv),
            progress=_PROGRESS.value,
            restart_changed=_RESTART.value,
            shard=shard,
        )
    if outcome["report"] is not None:
        study = outcome["report"].parent
        print(f"report: {outcome['report']}")
        if (study / "tables").is_dir():  # none when every cell failed
            print(f"tables: {study / 'tables'}   plots: {study / 'plots'}")
    print(f"results: {outcome['results']} ({len(outcome['done'])} cells done)")
    if outcome["failed"]:
        for name, error in outcome["failed"].items():
            print(f"FAILED {name}: {error}", file=sys.stderr)
        sys.exit(1)


def model_entry(spec: str) -> dict[str, object]:
    """The ``sweep.models`` entry (`sweeps.MODEL_FIELDS`) of one ``--model`` value: a model
    folder, hub id or GGUF file, optionally ``:LENGTH``. Its name is the folder's or hub
    id's last part (a GGUF file's name without ``.gguf``); its ``train_length`` is LENGTH,
    else the context its config states (`pretrained.training_length`). Raises
    `pretrained.MissingModelError` for a hub id that cannot be fetched here, `ConfigError`
    naming ``--model`` otherwise."""
    source, colon, length = spec.rpartition(":")
    if not (colon and source and length.isdigit()):
        source, length = spec, ""
    if length and int(length) < 1:
        fail("--model", spec, "LENGTH in --model=SOURCE:LENGTH must be an int >= 1")
    name = Path(source.rstrip("/")).name
    name = name.removesuffix(".gguf") if Path(source).is_file() else name
    if not name:
        fail("--model", spec, "must be a model folder, hub id (org/name) or GGUF file")
    if length:
        if not Path(source).expanduser().exists():  # a hub id: fetched (or found cached) now
            _opened(spec, pretrained.resolve, source)
        return dict(name=name, source=source, train_length=int(length))
    checkpoint = _opened(spec, pretrained.open_checkpoint, source)
    found = pretrained.training_length(checkpoint.hf_config)
    if found is None:
        fail(
            "--model",
            spec,
            f"its config states no training context ({', '.join(CONTEXT_FIELDS)}); give it "
            f"as --model={source}:LENGTH",
        )
    return dict(name=name, source=source, train_length=found)


def _opened(spec: str, opener: Any, source: str) -> Any:
    """``opener(source)``; a `pretrained.PretrainedError` as a `ConfigError` naming
    ``--model``, except a `pretrained.MissingModelError` (every missing hub model is named
    together, `use_models`)."""
    try:
        return opener(source)
    except pretrained.MissingModelError:
        raise
    except pretrained.PretrainedError as e:
        raise ConfigError(f"--model={spec}: {e}") from None


def use_models(config: Any, specs: list[str], *, overrides: list[tuple[str, Any]]) -> None:
    """Replace the pretrained study ``config``'s ``sweep.models`` with the models of the
    ``--model`` values ``specs`` (`model_entry`), in order. Every missing hub model is named
    at once (`pretrained.missing_models_message`). ``eval.paired_reference``, unless the
    command line sets it (``overrides``), becomes the first model when it names none of
    them. A study config without ``sweep.models`` (a training study) is refused."""
    sweep = config.get("sweep")
    if sweep is None or "models" not in sweep or "pretrained" not in config:
        raise ConfigError(
            f"--model={specs[0]}: applies to a study of pretrained models "
            "(--config=pretrained:PRESET); a training study's models are its encodings: "
            "select them with --only=ENCODING or --config.sweep.encodings"
        )
    entries, missing = [], []
    for spec in specs:
        try:
            entries.append(model_entry(spec))
        except pretrained.MissingModelError as e:
            missing.append(e)
    if missing:
        raise ConfigError(pretrained.missing_models_message(missing))
    with config.unlocked():
        config.sweep.models = tuple(entries)
        names = [e["name"] for e in entries]
        typed = {name.removeprefix("config.") for name, _ in overrides}
        evals = config.get("eval")
        if (
            evals is not None
            and "eval.paired_reference" not in typed
            and evals.get("paired_reference") not in names
        ):
            evals.paired_reference = names[0]


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite study") -> None:
    """Parse ``argv`` (default ``sys.argv``) and run the study (`common.run_command`)."""
    common.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
