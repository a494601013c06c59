"""`flaxformer-lite report` from a clone: `python scripts/make_report.py --help` shows its usage.

The work is `flaxformer_lite.cli.report` (installed as the `flaxformer-lite`
command); this wrapper records `python scripts/make_report.py` as the command that was run.
"""

from flaxformer_lite.cli import report

if __name__ == "__main__":
    report.run(prog="python scripts/make_report.py")
