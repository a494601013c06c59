"""Run a study: every (encoding x seed) cell of an experiment's sweep, then the report.

    python scripts/run_study.py --config=experiments/extrapolation_lm.py:quick --workdir=runs/quick
    python scripts/run_study.py --config=experiments/extrapolation_lm.py:cpu --workdir=runs/cpu \
        --only=alibi,rope

Rerunning the same command skips finished cells and resumes an interrupted one. A failed
cell is reported at the end and the exit status is non-zero.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from flaxformer_lite.experiments import cli
from flaxformer_lite.experiments.runner import run_study
from flaxformer_lite.train.run_config import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiments/FILE.py:PRESET", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "the study directory")
_ONLY = flags.DEFINE_list("only", [], "run only these encodings or cell names, e.g. alibi,rope")
_PROGRESS = flags.DEFINE_bool("progress", True, "show progress bars")
flags.mark_flags_as_required(["config", "workdir"])


def load_sweep(config) -> list[dict]:
    """The experiment file's ``get_sweep(config)``."""
    path = config_flags.get_config_filename(flags.FLAGS["config"]).split(":")[0]
    spec = importlib.util.spec_from_file_location("_experiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise ConfigError(f"{path} defines no get_sweep(config): it is not a study config")
    return module.get_sweep(config)


def make_report(workdir: Path) -> None:
    from flaxformer_lite.experiments import report, results

    rows, problems = results.load_rows([workdir], return_problems=True)
    if rows:
        path = report.write_report(rows, workdir, problems=problems)
        print(f"report: {path}")
        print(f"tables: {workdir / 'tables'}   plots: {workdir / 'plots'}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    config = _CONFIG.value
    command = shlex.join(["python", "scripts/run_study.py", *sys.argv[1:]])
    try:
        config.unlock()
        config.train.progress = config.train.progress and _PROGRESS.value
        config.lock()
        sweep = load_sweep(config)
        swept = {path for cell in sweep for path in cell["overrides"]}
        for name, value in cli.config_overrides(sys.argv):
            if name.removeprefix("config.") in swept:
                raise ConfigError(
                    f"--{name}={value}: set for every cell by the study's sweep; select cells "
                    "with --only (e.g. --only=rope) or change config.sweep"
                )
        outcome = run_study(
            config,
            sweep,
            _WORKDIR.value,
            only=_ONLY.value,
            command=command,
            report=make_report,
            progress=_PROGRESS.value,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"results: {outcome['results']} ({len(outcome['done'])} cells done)")
    if outcome["failed"]:
        for name, error in outcome["failed"].items():
            print(f"FAILED {name}: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
