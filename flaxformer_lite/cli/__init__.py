"""The ``flaxformer-lite`` command: one subcommand per task, installed with the package.

    flaxformer-lite study    --config=extrapolation_lm:quick --workdir=runs/quick
    flaxformer-lite train    --config=extrapolation_lm:tiny --workdir=runs/tiny
    flaxformer-lite report   runs/quick [--out=DIR]
    flaxformer-lite generate --workdir=runs/quick/runs/rope-seed0 --prompt="def "
    flaxformer-lite demo
    flaxformer-lite SUBCOMMAND --help     # that subcommand's flags
    flaxformer-lite study --config=extrapolation_lm:quick --list-fields   # every --config.* field
    flaxformer-lite --version

``python -m flaxformer_lite SUBCOMMAND ...`` and the ``scripts/`` of a clone
(``run_study.py``, ``train.py``, ``make_report.py``, ``generate.py``, ``demo.py``) run the
same functions. Each subcommand is a module of this package with absl flags and a ``run``;
only the chosen one is imported (absl flags are global to a process). `common` holds what the
subcommands share (config resolution, one-line failures); `pipeline` runs a study then its report.

Layer: the top of the package; may import every layer.
"""

from __future__ import annotations

import importlib
import sys

PROG = "flaxformer-lite"
COMMANDS = {
    "study": "run a study: every cell of a study config's sweep, then its report",
    "train": "train and evaluate one run",
    "report": "tables, plots and REPORT.md from the rows of study or run directories",
    "generate": "sample a continuation from a trained run",
    "demo": "build every model with every positional encoding once (an install check)",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} SUBCOMMAND [flags]   ({PROG} SUBCOMMAND --help for its flags)", ""]
    lines += [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    lines += ["", "--config takes a packaged study config by name (extrapolation_lm:quick) or a"]
    lines += ["config file by path (configs/extrapolation_lm.py:quick); --list-fields prints every"]
    lines += ["--config.* field of it with its type, value and meaning. --version: the version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """The console entry point: ``argv[1]`` names the subcommand, the rest are its flags."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if len(argv) >= 2 else sys.stderr)
        sys.exit(0 if len(argv) >= 2 else 2)
    name = argv[1]
    if name == "--version":  # the subcommands' `common.version_line`
        print(importlib.import_module(f"{__name__}.common").version_line())
        sys.exit(0)
    if name not in COMMANDS:
        print(
            f"error: unknown subcommand {name!r}; allowed: {', '.join(COMMANDS)} ({PROG} --help)",
            file=sys.stderr,
        )
        sys.exit(2)
    module = importlib.import_module(f"{__name__}.{name}")
    module.run([f"{PROG} {name}", *argv[2:]], prog=f"{PROG} {name}")
