"""`flaxformer-lite train` from a clone: `python scripts/train.py --help` shows its usage.

The work is `flaxformer_lite.cli.train` (installed as the `flaxformer-lite`
command); this wrapper records `python scripts/train.py` as the command that was run.
"""

from flaxformer_lite.cli import train

if __name__ == "__main__":
    train.run(prog="python scripts/train.py")
