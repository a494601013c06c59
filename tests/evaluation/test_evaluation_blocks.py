"""evaluation.blocks: each statistics block records the file of its first target, for byte
splits, token splits, the non-overlapping and the context protocols."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_lite.data.corpus import Split
from flaxformer_lite.data.store import SEPARATOR
from flaxformer_lite.data.tokens import TokenCorpus
from flaxformer_lite.evaluation.blocks import BlockSums
from flaxformer_lite.evaluation.protocols import Context, Windows
from flaxformer_lite.evaluation.score import score


class Uniform(nnx.Module):
    """Equal logits over ``vocab`` tokens: every target costs log(vocab) nats."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.bias = nnx.Param(jnp.zeros(vocab))

    def __call__(self, tokens, positions=None, *, deterministic=True):
        del positions, deterministic
        return jnp.zeros((*tokens.shape, self.vocab)) + self.bias[...][None, None, :]


def _files(sizes, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated random files (no 0x00 inside), each followed by the separator; and the
    file index of every byte (numpy reference)."""
    rng = np.random.default_rng(seed)
    parts, owner = [], []
    for k, n in enumerate(sizes):
        parts += [rng.integers(1, 256, n, dtype=np.uint8), np.array([SEPARATOR], np.uint8)]
        owner.append(np.full(n + 1, k))
    return np.concatenate(parts), np.concatenate(owner)


def test_document_of_counts_the_separators_before_a_position():
    data, owner = _files([5, 1, 9, 3])
    split = Split(data, name="validation", corpus="toy", num_files=4)
    np.testing.assert_array_equal(split.document_of(np.arange(data.size)), owner)
    one = Split(data, name="validation", corpus="toy", num_files=1)  # one document
    assert not one.document_of(np.arange(data.size)).any()


def test_block_sums_name_the_file_of_each_blocks_first_target():
    sums = BlockSums(4, "t")
    sums.add("count", np.array([0, 2, 2]), np.ones(3))
    sums.note_positions(np.array([0, 2, 2]), np.array([3, 11, 9]))
    record = sums.to_dict(lambda p: np.asarray(p) // 5)
    assert record["file"] == [0, -1, 1]  # block 1 has no target; block 2 starts at 9
    assert "file" not in sums.to_dict()  # without a split: nothing to name


def test_nonoverlapping_blocks_record_their_files():
    sizes = [700, 40, 2100, 300, 1500]
    data, owner = _files(sizes)
    split = Split(data, name="validation", corpus="toy", num_files=len(sizes))
    result = score(Uniform(256), Windows(64, block_tokens=256), split, batch_size=4)
    record = result["blocks"]
    n_blocks = len(record["count"])
    # targets are bytes 1 .. 64 * windows; block b's first target is byte max(1, 256 b)
    first = np.maximum(1, 256 * np.arange(n_blocks))
    np.testing.assert_array_equal(record["file"], owner[first])
    assert 1 not in record["file"]  # a 40-byte file holds no block's first target
    np.testing.assert_allclose(np.sum(record["loss"]), result["tokens"] * np.log(256), rtol=1e-5)


def test_context_protocol_blocks_record_the_file_of_their_first_target():
    sizes = [900, 2000, 50, 1200, 3000]
    data, owner = _files(sizes, seed=1)
    split = Split(data, name="validation", corpus="toy", num_files=len(sizes))
    starts = split.context_starts(max_context=64, block=16, blocks=32)
    protocol = Context(32, 16, max_context=64, targets=32 * 16, block_tokens=64)
    result = score(Uniform(256), protocol, split, batch_size=8)
    record = result["blocks"]
    per_stat = 64 // 16  # target blocks per statistics block
    np.testing.assert_array_equal(record["file"], owner[starts[::per_stat]])
    assert len(set(record["file"])) > 1


class _Split:
    def __init__(self, raw: bytes, num_files: int):
        self.data, self.name, self.num_files = np.frombuffer(raw, np.uint8), "validation", num_files


class _Corpus:
    name = "toy"

    def __init__(self, raw: bytes, num_files: int):
        self._split = _Split(raw, num_files)

    def split(self, name):
        return self._split

    def provenance(self):
        return {"separator": SEPARATOR}


def _chars(text: str):
    return [ord(c) % 7 for c in text], [(i, i + 1) for i in range(len(text))]


def test_token_split_documents_follow_its_separator_tokens():
    raw = b"abcdefgh\x00ijk\x00lmnopqrstu\x00"
    tokens = TokenCorpus(
        _Corpus(raw, 3), _chars, separator_id=9, tokenizer_sha256="x", vocab_size=10
    )
    split = tokens.split("validation")
    # one token per byte after the split's first (context) token: position = byte + 1
    owner = np.repeat([0, 1, 2], [10, 4, 11])
    np.testing.assert_array_equal(split.document_of(np.arange(owner.size)), owner)
    result = score(Uniform(10), Windows(4, block_tokens=4), split, batch_size=2)
    # a block (4 bytes) and its first *scored* target: separators are context, never targets
    scored = [p for p in range(1, owner.size) if split.scored[p]]
    offset = split.token_offset
    first = [min(p for p in scored if offset[p] // 4 == b) for b in range(len(raw) // 4)]
    assert offset[first[2]] == 9  # byte 8, the first separator, is not scored
    np.testing.assert_array_equal(result["blocks"]["file"], owner[first])
