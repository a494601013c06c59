r"""Run a study: every cell (encoding x seed x ...) of a study config's sweep, then its report.

    flaxformer-lite study --config=extrapolation_lm:quick --workdir=runs/quick
    flaxformer-lite study --config=configs/extrapolation_lm.py:cpu --workdir=runs/cpu \
        --only=alibi,rope
    flaxformer-lite study --config=extrapolation_lm:cpu \
        --shard=$SLURM_ARRAY_TASK_ID/4 --workdir=runs/cpu-$SLURM_ARRAY_TASK_ID
    flaxformer-lite report runs/cpu-* --out=runs/cpu

(``python scripts/run_study.py`` and ``python -m flaxformer_lite study`` are the same command.)
--config takes a packaged study config by name (NAME:PRESET) or a config file by path
(FILE.py:PRESET); --list-fields prints every --config.* field with its type, value and
meaning.

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

from absl import app, flags, logging
from ml_collections import config_flags

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.cli import common
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.study import sweeps

_CONFIG = config_flags.DEFINE_config_file("config", None, common.config_help(), lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "the study directory")
_ONLY = flags.DEFINE_list("only", [], "run only these encodings or cell names, e.g. alibi,rope")
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


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite study") -> None:
    """Parse ``argv`` (default ``sys.argv``) and run the study (`common.run_command`)."""
    common.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
