"""`flaxformer-lite study` from a clone: `python scripts/run_study.py --help` shows its usage.

The work is `flaxformer_lite.cli.study` (installed as the `flaxformer-lite`
command); this wrapper records `python scripts/run_study.py` as the command that was run.
"""

from flaxformer_lite.cli import study

if __name__ == "__main__":
    study.run(prog="python scripts/run_study.py")
