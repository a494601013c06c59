r"""Sample a continuation from the newest checkpoint of a training run, or from a pretrained model.

    flaxformer-lite generate --workdir=runs/quick/runs/rope-seed0 --prompt="def " \
        --max_new_tokens=200 [--temperature=0.8 --top_k=40 --seed=0 --stop_token=10]
    flaxformer-lite generate --pretrained=SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompt="The capital of France is" --max_new_tokens=40 --stop_token=eos

(``python scripts/generate.py`` and ``python -m flaxformer_lite generate`` are the same
command.) ``--workdir`` is a run directory written by
`flaxformer_lite.train.loop.train_and_evaluate` (``flaxformer-lite train``, or a study cell
``STUDY/runs/<encoding>-seed<k>/``), loaded by
`flaxformer_lite.train.restore.load_trained_model`. Prints the prompt and its continuation
(bytes decoded as UTF-8, invalid sequences replaced) to stdout; greedy when
``--temperature=0``. ``--pretrained`` instead loads a Hugging Face folder or hub id, or a
GGUF file (`flaxformer_lite.pretrained.load_pretrained`): the prompt (UTF-8) is tokenized by
the model's tokenizer, with its special tokens (a BOS where the model adds one), and the
continuation decoded by it.

``--stop_token`` ends the continuation at the first stop token it emits (included), as
transformers' ``generate`` does with ``eos_token_id``: ``eos`` (the pretrained model's
end-of-text token) or a token id (a byte value for a byte-level run); empty: never.

The prompt is the bytes given on the command line, exactly (``os.fsencode``: bytes that are
not UTF-8 reach the model unchanged), or the bytes of ``--prompt_file=PATH`` (``-`` reads
standard input). Before the checkpoint is loaded, the memory that generation needs (the
model with its optimizer state, the key/value cache of ``prompt_len + max_new_tokens - 1``
slots, the prompt's forward pass: `train.memory.check_generation_memory`) is compared with
the memory available, and a call that cannot fit is refused in one line (exit status 2),
as every other bad input is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from absl import app, flags, logging

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.cli import common
from flaxformer_lite.data.text import decode_bytes
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.pretrained import PretrainedError, generate_ids, load_pretrained
from flaxformer_lite.train import memory
from flaxformer_lite.train.restore import load_trained_model
from flaxformer_lite.train.run_config import RunConfig

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (holds config.json, checkpoints/)")
_PROMPT = flags.DEFINE_string(
    "prompt", "def ", "text to continue (its bytes as given on the command line)"
)
_PROMPT_FILE = flags.DEFINE_string(
    "prompt_file", None, "continue the bytes of this file instead of --prompt ('-': stdin)"
)
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 200, "bytes to generate")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0: greedy; > 0: sampling temperature")
_TOP_K = flags.DEFINE_integer("top_k", None, "sample among the k most likely bytes only")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_PRETRAINED = flags.DEFINE_string(
    "pretrained", None, "a Hugging Face folder or hub id, or a .gguf file (instead of --workdir)"
)
_STOP_TOKEN = flags.DEFINE_string(
    "stop_token", "", "end at this token: 'eos' (the model's end-of-text token) or an id"
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    with common.one_line_failures():  # one line, no traceback, on every way out
        try:
            if (_WORKDIR.value is None) == (_PRETRAINED.value is None):
                raise ConfigError("give one of --workdir (a training run) and --pretrained")
            if _MAX_NEW_TOKENS.value < 1:
                raise ConfigError(f"--max_new_tokens={_MAX_NEW_TOKENS.value}: must be >= 1")
            stop = _stop_token()
            continuation = _pretrained if _PRETRAINED.value is not None else _trained
            text = continuation(_prompt_bytes(), stop) + "\n"
        except (ValueError, PretrainedError) as e:  # ConfigError is a ValueError
            common.fail(str(e))
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a replaced sys.stdout (a notebook, a test's capture)
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    out.write(text.encode("utf-8"))  # whatever the locale's encoding: never an encode error
    out.flush()


def _sampling() -> dict:
    sampling = _TEMPERATURE.value > 0
    return dict(
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value if sampling else None,
        rng=jax.random.key(_SEED.value) if sampling else None,
    )


def _trained(prompt_bytes: bytes, stop: int | str | None) -> str:
    """The prompt and its continuation by the newest checkpoint of ``--workdir``."""
    if stop == "eos":
        raise ConfigError(
            "--stop_token=eos: a byte-level run has no end-of-text token; give a byte"
        )
    prompt = np.frombuffer(prompt_bytes, np.uint8).astype(np.int32)
    run = _recorded_run(_WORKDIR.value)
    if run is not None:  # else load_trained_model says what is wrong with the workdir
        memory.check_generation_memory(
            run.model, prompt_len=int(prompt.size), max_new_tokens=_MAX_NEW_TOKENS.value
        )
    model, _, _ = load_trained_model(_WORKDIR.value)  # closes its checkpoint manager
    tokens, lengths = generate(
        model,
        prompt[None, :],
        max_new_tokens=_MAX_NEW_TOKENS.value,
        stop_byte=stop,
        return_lengths=True,
        **_sampling(),
    )
    new = np.asarray(tokens[0])[: int(lengths[0])]
    return decode_bytes(np.concatenate([prompt, new]))


def _pretrained(prompt_bytes: bytes, stop: int | str | None) -> str:
    """The prompt and its continuation by the ``--pretrained`` model, through its tokenizer."""
    try:
        prompt = prompt_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the prompt is not UTF-8 ({e}); a tokenizer reads text") from None
    lm = load_pretrained(_PRETRAINED.value)
    if lm.tokenizer is None:
        raise ConfigError(f"--pretrained={_PRETRAINED.value!r}: no tokenizer")
    ids = lm.tokenizer.encode(prompt, add_special_tokens=True)
    new = generate_ids(
        lm, ids, max_new_tokens=_MAX_NEW_TOKENS.value, stop_token=stop, **_sampling()
    )
    return prompt + lm.tokenizer.decode(new)


def _stop_token() -> int | str | None:
    value = _STOP_TOKEN.value.strip()
    if not value:
        return None
    if value == "eos":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"--stop_token={value!r}: give 'eos' or a token id (empty: no stop token)"
        ) from None


def _prompt_bytes() -> bytes:
    """The prompt: ``--prompt_file``'s bytes, or ``--prompt`` as the command line gave it
    (Python decoded it with ``surrogateescape``; ``os.fsencode`` gives the bytes back)."""
    if _PROMPT_FILE.value is not None:
        if flags.FLAGS["prompt"].present:
            raise ConfigError("--prompt and --prompt_file: give one of them")
        path = _PROMPT_FILE.value
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"--prompt_file={path!r}: cannot read it ({e.strerror})") from None
        if not data:
            raise ConfigError(f"--prompt_file={path!r} is empty: give at least one byte")
        return data
    try:
        data = os.fsencode(_PROMPT.value)
    except UnicodeError as e:  # not from a command line (a str with lone surrogates)
        raise ConfigError(f"--prompt={_PROMPT.value!r}: not bytes ({e})") from None
    if not data:
        raise ConfigError("--prompt='': give at least one byte to continue")
    return data


def _recorded_run(workdir: str) -> RunConfig | None:
    """The run recorded in ``workdir/config.json``, or None when there is none readable
    (`load_trained_model` then refuses the workdir in its own words)."""
    try:
        return RunConfig.from_config(json.loads((Path(workdir) / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite generate") -> None:
    """Parse ``argv`` (default ``sys.argv``) and generate (`common.run_command`)."""
    common.run_command(
        main,
        doc=__doc__,
        module=__name__,
        argv=argv,
        prog=prog,
        raw_flags=("prompt", "prompt_file"),
    )


if __name__ == "__main__":
    run()
