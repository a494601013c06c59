"""``python -m flaxformer_lite SUBCOMMAND ...``: the ``flaxformer-lite`` command."""

from flaxformer_lite.cli import main

if __name__ == "__main__":
    main()
