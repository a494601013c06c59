"""Continue a prompt of token ids with a pretrained model, stopping at its end-of-text token.

`generate_ids` is `flaxformer_lite.nn.generate.generate` for one prompt of a `Pretrained`
model, with transformers' stopping rule: with ``stop_token="eos"`` (the model's
``eos_token_id``) or a token id, a continuation ends with the first stop token it emits, as
transformers' ``generate(..., eos_token_id=...)`` ends a sequence (tests compare the tokens
with transformers' on the same GGUF files).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from flaxformer_lite.base.checks import is_int
from flaxformer_lite.nn.generate import generate


def stop_token_id(lm: Any, stop_token: int | str | None) -> int | None:
    """The token id ``stop_token`` names: None, an id, or ``"eos"`` (the model's
    ``eos_token_id``; refused when the model has none, or several)."""
    if stop_token is None or is_int(stop_token):
        return stop_token
    if stop_token != "eos":
        raise ValueError(f"stop_token={stop_token!r}: must be None, 'eos' or a token id")
    eos = lm.info.hf_config.get("eos_token_id")
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    if not is_int(eos):
        raise ValueError(
            f"stop_token='eos': {lm.info.model_id} states eos_token_id={eos!r}; pass one id"
        )
    return int(eos)


def generate_ids(
    lm: Any,
    prompt_ids: Any,
    *,
    max_new_tokens: int,
    stop_token: int | str | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: Any = None,
) -> list[int]:
    """The new token ids continuing ``prompt_ids`` (a sequence of ints).

    Args:
      lm: a `Pretrained` model (`load_pretrained`).
      prompt_ids: the prompt's token ids (special tokens as the caller wants them).
      max_new_tokens: the most tokens to generate.
      stop_token: None (generate ``max_new_tokens``), ``"eos"`` (the model's end-of-text
        token) or a token id: the continuation ends with its first occurrence.
      temperature, top_k, rng: as `flaxformer_lite.nn.generate.generate` (greedy at 0).

    Returns:
      list of int: at most ``max_new_tokens`` ids, the last one the stop token if it was
      emitted.
    """
    stop = stop_token_id(lm, stop_token)
    prompt = np.asarray(prompt_ids, np.int32)[None, :]
    tokens, lengths = generate(
        lm.model,
        jnp.asarray(prompt),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        rng=rng,
        stop_byte=stop,
        return_lengths=True,
    )
    return np.asarray(tokens)[0, : int(lengths[0])].tolist()
