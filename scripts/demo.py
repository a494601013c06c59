"""`flaxformer-lite demo` from a clone: `python scripts/demo.py --help` shows its usage.

The work is `flaxformer_lite.cli.demo` (installed as the `flaxformer-lite`
command); this wrapper records `python scripts/demo.py` as the command that was run.
"""

from flaxformer_lite.cli import demo

if __name__ == "__main__":
    demo.run(prog="python scripts/demo.py")
