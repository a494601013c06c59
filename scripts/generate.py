"""`flaxformer-lite generate` from a clone: `python scripts/generate.py --help` shows its usage.

The work is `flaxformer_lite.cli.generate` (installed as the `flaxformer-lite`
command); this wrapper records `python scripts/generate.py` as the command that was run.
"""

from flaxformer_lite.cli import generate

if __name__ == "__main__":
    generate.run(prog="python scripts/generate.py")
