r"""Sample a continuation from the newest checkpoint of a training run.

    flaxformer-lite generate --workdir=runs/quick/runs/rope-seed0 --prompt="def " \
        --max_new_tokens=200 [--temperature=0.8 --top_k=40 --seed=0]

(``python scripts/generate.py`` and ``python -m flaxformer_lite generate`` are the same
command.) ``--workdir`` is a run directory written by
`flaxformer_lite.train.loop.train_and_evaluate` (``flaxformer-lite train``, or a study cell
``STUDY/runs/<encoding>-seed<k>/``), loaded by
`flaxformer_lite.train.restore.load_trained_model`. Prints the prompt and its continuation
(bytes decoded as UTF-8, invalid sequences replaced) to stdout; greedy when
``--temperature=0``.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import app, flags, logging

from flaxformer_lite.data.text import decode_bytes, encode_text
from flaxformer_lite.experiments import cli
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.train.restore import load_trained_model

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (holds config.json, checkpoints/)")
_PROMPT = flags.DEFINE_string("prompt", "def ", "text to continue (encoded as UTF-8 bytes)")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 200, "bytes to generate")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0: greedy; > 0: sampling temperature")
_TOP_K = flags.DEFINE_integer("top_k", None, "sample among the k most likely bytes only")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
flags.mark_flags_as_required(["workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    prompt = encode_text(_PROMPT.value)
    try:
        if not prompt.size:
            raise ValueError("--prompt='': give at least one byte to continue")
        model, _, _ = load_trained_model(_WORKDIR.value)
        sampling = _TEMPERATURE.value > 0
        tokens = generate(
            model,
            prompt[None, :],
            max_new_tokens=_MAX_NEW_TOKENS.value,
            temperature=_TEMPERATURE.value,
            top_k=_TOP_K.value if sampling else None,
            rng=jax.random.key(_SEED.value) if sampling else None,
        )
    except ValueError as e:  # ConfigError is a ValueError
        cli.fail(str(e))
    print(decode_bytes(np.concatenate([prompt, np.asarray(tokens[0])])))


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite generate") -> None:
    """Parse ``argv`` (default ``sys.argv``) and generate (`cli.run_command`)."""
    cli.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
