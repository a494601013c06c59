"""Train and evaluate one run.

    python scripts/train.py --config=experiments/extrapolation_lm.py:tiny --workdir=runs/tiny \
        --config.model.positional=rope

A second invocation with the same workdir resumes from the newest checkpoint (or returns the
finished result). Bad overrides fail before anything is written. A second process on the same
workdir, a failed write (disk full) and SIGINT/SIGTERM each end with one line on stderr
(`cli.one_line_failures`; status 2, 1, 130/143).
"""

from __future__ import annotations

import json

from absl import app, flags, logging
from ml_collections import config_flags

from flaxformer_lite.base import interrupt
from flaxformer_lite.experiments import cli
from flaxformer_lite.train.loop import train_and_evaluate
from flaxformer_lite.train.run_config import RunConfig

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiments/FILE.py:PRESET", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of this run")
_RESTART = flags.DEFINE_bool(
    "restart_changed",
    False,
    "a workdir holding a run of another identity (config, corpus content, versions) starts "
    "afresh in place instead of being refused",
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    with cli.one_line_failures():
        run = RunConfig.from_config(_CONFIG.value)
        interrupt.where(run=f"the run in {_WORKDIR.value}")
        summary = train_and_evaluate(run, _WORKDIR.value, restart_changed=_RESTART.value)
    for r in summary["eval"]:
        metric = "exact_match" if r["protocol"] == "task" else "bits_per_byte"
        row = {k: r[k] for k in ("encoding", "protocol", "eval_length")}
        print(json.dumps(row | {metric: r.get(metric, "n/a")}))
    print(f"workdir: {_WORKDIR.value}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
