"""Bits per byte of a tokenized text, checked against a hand computation.

A bigram model (logits depend on the previous token only) scores every target the same way
whatever its context, so each protocol and window length must give exactly the summed
``-log2 p`` of the scored tokens over the bytes they cover -- computed here with numpy from
the token sequence alone. The text's tokens are multi-character and multi-byte, and the
window lengths cut it at token positions that are not byte positions of any fixed stride, so
a mistake in which bytes a window's tokens cover (counting a token twice, or a window edge
in bytes) changes the number.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.data.tokens import TokenCorpus
from flaxformer_lite.evaluation.protocols import Windows
from flaxformer_lite.evaluation.score import score

VOCAB = 11


class Bigram(nnx.Module):
    def __init__(self, table: np.ndarray):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, tokens, positions=None, *, deterministic=True):
        del positions, deterministic
        return self.table[...][tokens]


def word_encoder(text: str):
    """Whitespace-split words, each a token covering its characters and the space before."""
    ids, offsets, start = [], [], 0
    for i in range(1, len(text) + 1):
        if i == len(text) or text[i] == " ":
            word = text[start:i]
            ids.append(sum(map(ord, word)) % (VOCAB - 1))
            offsets.append((start, i))
            start = i
    return ids, offsets


class _Split:
    def __init__(self, raw: bytes):
        self.data, self.name, self.num_files = np.frombuffer(raw, np.uint8), "validation", 2


class _Corpus:
    name = "toy"

    def __init__(self, raw: bytes):
        self._split = _Split(raw)

    def split(self, name):
        return self._split

    def provenance(self):
        return {"sha256": "x", "separator": 0}


TEXT = (
    ("le café de ŝi 日本語 tokens über the édge " * 7).encode()
    + b"\0"
    + ("second file, ünïcode ŵords " * 5).encode()
    + b"\0"
)


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, VOCAB)) * 2
    corpus = TokenCorpus(
        _Corpus(TEXT), word_encoder, separator_id=VOCAB - 1, tokenizer_sha256="t", vocab_size=VOCAB
    )
    return Bigram(table), corpus.split("validation"), table


def hand_bits_per_byte(split, table) -> float:
    """Sum over scored targets t >= 1 of -log2 softmax(table[x_{t-1}])[x_t], over their bytes."""
    x = split.data.astype(np.int64)
    logits = table[x[:-1]]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    bits = -logp[np.arange(len(x) - 1), x[1:]] / math.log(2)
    scored = split.scored[1:]
    return float(bits[scored].sum() / split.token_bytes[1:][scored].sum())


@pytest.mark.parametrize(("length", "stride"), [(5, None), (7, None), (7, 3), (32, None)])
def test_bits_per_byte_is_total_bits_over_total_bytes(setup, length, stride):
    model, split, table = setup
    expected = hand_bits_per_byte(split, table)
    result = score(model, Windows(length, stride=stride), split, batch_size=4)
    assert result["bits_per_byte"] == pytest.approx(expected, rel=1e-6)
    # every scored token's bytes once: the text's bytes minus the first token's
    text_bytes = len(TEXT) - 2  # the two 0x00 separators are not text
    assert result["scored_bytes"] == text_bytes - split.token_bytes[0]
    assert sum(result["blocks"]["bytes"]) == result["scored_bytes"]


def test_blocks_are_the_same_byte_ranges_at_every_length(setup):
    model, split, _ = setup
    a = score(model, Windows(5, block_tokens=64), split, batch_size=4)["blocks"]
    b = score(model, Windows(32, stride=8, block_tokens=64), split, batch_size=4)["blocks"]
    assert a["bytes"] == b["bytes"] and len(a["bytes"]) == -(-(len(TEXT) - 1) // 64)
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
