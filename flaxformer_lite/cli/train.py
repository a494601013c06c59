r"""Train and evaluate one run.

    flaxformer-lite train --config=extrapolation_lm:tiny --workdir=runs/tiny \
        --config.model.positional=rope

(``python scripts/train.py`` and ``python -m flaxformer_lite train`` are the same command.)
--config takes a packaged study config by name (NAME:PRESET) or a config file by path
(FILE.py:PRESET); --list-fields prints every --config.* field with its type, value and
meaning.

A second invocation with the same workdir resumes from the newest checkpoint (or returns the
finished result). Bad overrides fail before anything is written. A second process on the same
workdir, a failed write (disk full) and SIGINT/SIGTERM each end with one line on stderr
(`common.one_line_failures`; status 2, 1, 130/143). Prints one line per evaluated length (bits
per byte, or exact match for a task) and the workdir; ``flaxformer-lite report WORKDIR``
writes its tables.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from flaxformer_lite.base import interrupt
from flaxformer_lite.cli import common
from flaxformer_lite.train.loop import train_and_evaluate
from flaxformer_lite.train.run_config import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, common.config_help(), lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of this run")
_RESTART = flags.DEFINE_bool(
    "restart_changed",
    False,
    "a workdir holding a run of another identity (config, corpus content, versions) starts "
    "afresh in place instead of being refused",
)
flags.mark_flags_as_required(["config", "workdir"])


def result_lines(summary: dict) -> list[str]:
    """One aligned line per evaluated (encoding, protocol, length): bits/byte to 4 decimals,
    exact match as a percentage, or why it was not evaluated."""
    lines = []
    for r in summary["eval"]:
        task = r["protocol"] == "task"
        metric = "exact_match" if task else "bits_per_byte"
        value = r.get(metric)
        if value is None:
            shown = f"n/a ({r['na']})" if r.get("na") else "n/a"
        elif task:
            shown = f"{100 * value:.1f} % exact match"
        else:
            shown = f"{value:.4f} bits/byte"
        lines.append(
            f"{r['encoding']:<24} {r['protocol']:<15} length {r['eval_length']:>6}  {shown}"
        )
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    with common.one_line_failures():
        run = RunConfig.from_config(_CONFIG.value)
        interrupt.where(run=f"the run in {_WORKDIR.value}")
        summary = train_and_evaluate(run, _WORKDIR.value, restart_changed=_RESTART.value)
    for line in result_lines(summary):
        print(line)
    print(f"workdir: {_WORKDIR.value}")


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite train") -> None:
    """Parse ``argv`` (default ``sys.argv``) and train (`common.run_command`)."""
    common.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
