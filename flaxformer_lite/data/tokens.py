"""A byte corpus seen through a model's tokenizer: token splits scored in bits per byte.

Models with different tokenizers are compared on the same text in **bits per UTF-8 byte**:
the summed ``-log2 p`` of the scored tokens divided by the bytes of text those tokens cover
(the unit lm-evaluation-harness calls ``bits_per_byte``). `TokenCorpus` tokenizes each
document of a `ByteCorpus` split once, on its own, and records for every token:

* ``token_bytes``: the UTF-8 bytes of text it covers. Offsets come from the tokenizer
  (character offsets into the document); a token that starts inside a character another token
  already covered (byte-level BPE splits a multi-byte character over several tokens) is given
  the bytes past what came before it, so the bytes of a document are counted exactly once;
  the tokens' bytes sum to the document's bytes (checked).
* ``token_offset``: the byte position of its first byte in the byte split, so statistics
  blocks (`flaxformer_lite.evaluation.blocks`) are ranges of the same text for every
  tokenizer (and for byte-level models), and paired comparisons across tokenizers pair the
  same bytes.

Documents are joined by the model's end-of-text token (``separator_id``), which is fed as
context but never scored and covers no bytes (the byte corpus's 0x00 separators are not
text). Windows are cut in token space, so a token never spans a window edge: every scored
token is scored once, with all its bytes, at every evaluation length.

Bytes that are not valid UTF-8 (the byte corpora accept any file) become U+FFFD for the
tokenizer and keep their own byte count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flaxformer_lite.data import store
from flaxformer_lite.data.corpus import Split

# encode(text) -> (token ids, [(start, end) character offsets]) for one document
Encoder = Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]]


def _char_bytes(raw: bytes) -> tuple[str, np.ndarray]:
    """``raw`` as text for a tokenizer (invalid UTF-8 bytes -> U+FFFD, one per byte) and the
    byte position where each character starts, ``[len(text) + 1]`` (the last: ``len(raw)``)."""
    text = raw.decode("utf-8", errors="surrogateescape")
    sizes = np.fromiter(
        (1 if 0xDC80 <= ord(c) <= 0xDCFF else len(c.encode("utf-8")) for c in text),
        np.int64,
        len(text),
    )
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in text):
        text = "".join("\ufffd" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)
    return text, starts


def tokenize_document(raw: bytes, encode: Encoder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, token_bytes, token_start)`` of one document: int32 ids ``[t]``, the bytes each
    token covers (module docstring) and the byte offset of each token's first byte, both
    int64 ``[t]``; ``token_bytes.sum() == len(raw)`` (else a ValueError)."""
    text, char_start = _char_bytes(raw)
    ids, offsets = encode(text)
    ids = np.asarray(ids, np.int32)
    if ids.size == 0:
        return ids, np.zeros(0, np.int64), np.zeros(0, np.int64)
    spans = np.asarray(offsets, np.int64).reshape(-1, 2)
    if spans.shape[0] != ids.shape[0] or spans.min() < 0 or spans.max() > len(text):
        raise ValueError("the tokenizer's offsets do not describe its tokens")
    ends = char_start[spans[:, 1]]
    covered = np.maximum.accumulate(np.concatenate([[0], ends]))  # bytes covered so far
    token_bytes = np.maximum(0, ends - covered[:-1])
    starts = np.minimum(char_start[spans[:, 0]], len(raw))
    if int(token_bytes.sum()) != len(raw):
        raise ValueError(
            f"the tokenizer's tokens cover {int(token_bytes.sum())} of the document's "
            f"{len(raw)} bytes (a normalizer that drops or rewrites text?)"
        )
    return ids, token_bytes, starts


class TokenCorpus:
    """A `ByteCorpus` tokenized by one tokenizer; its splits are `Split` s of token ids with
    each token's bytes and byte offset (module docstring), made on first use (only the splits a
    run evaluates are tokenized).

    Args:
      corpus: the byte corpus.
      encode: ``encode(text) -> (ids, offsets)`` of one document (no special tokens).
      separator_id: the token that joins documents (the model's end-of-text token).
      tokenizer_sha256: recorded in `provenance`.
      vocab_size: the model's vocabulary.
    """

    def __init__(
        self,
        corpus: Any,
        encode: Encoder,
        *,
        separator_id: int,
        tokenizer_sha256: str,
        vocab_size: int,
    ) -> None:
        self.corpus = corpus
        self.name = corpus.name
        self.encode = encode
        self.separator_id = int(separator_id)
        self.tokenizer_sha256 = tokenizer_sha256
        self.vocab_size = vocab_size
        self._splits: dict[str, Split] = {}

    def __repr__(self) -> str:
        return f"TokenCorpus({self.corpus!r}, tokenizer={self.tokenizer_sha256[:15]})"

    def split(self, name: str) -> Split:
        if name not in self._splits:
            self._splits[name] = self._tokenize(self.corpus.split(name))
        return self._splits[name]

    def _tokenize(self, split: Split) -> Split:
        raw = np.asarray(split.data).tobytes()
        sep = bytes([store.SEPARATOR])
        has_separators = self.corpus.provenance().get("separator") is not None
        documents = raw.split(sep) if has_separators else [raw]
        ids, nbytes, offsets, scored = [], [], [], []
        position = 0
        for k, doc in enumerate(documents):
            if doc:
                try:
                    t, b, o = tokenize_document(doc, self.encode)
                except ValueError as e:
                    raise ValueError(
                        f"corpus {self.name!r} split {split.name!r}, document {k} (byte "
                        f"{position}): {e}"
                    ) from None
                ids.append(t)
                nbytes.append(b)
                offsets.append(o + position)
                scored.append(np.ones(t.shape[0], bool))
            position += len(doc)
            if has_separators and k < len(documents) - 1:  # the 0x00 after the document
                ids.append(np.asarray([self.separator_id], np.int32))
                nbytes.append(np.zeros(1, np.int64))
                offsets.append(np.asarray([position], np.int64))
                scored.append(np.zeros(1, bool))
                position += 1
        cat = lambda xs, dtype: np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)
        return Split(
            cat(ids, np.int32),
            token_bytes=cat(nbytes, np.int64),
            token_offset=cat(offsets, np.int64),
            scored=cat(scored, bool),
            name=split.name,
            corpus=self.name,
            num_files=split.num_files,
            num_text_bytes=sum(len(d) for d in documents),
        )

    def provenance(self) -> dict:
        """The byte corpus's provenance plus the tokenizer's hash."""
        return self.corpus.provenance() | {"tokenizer_sha256": self.tokenizer_sha256}


def tokens_digest(split: Split) -> str:
    """``sha256:`` of a split's token ids (a check that two runs scored the same tokens)."""
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(split.data).tobytes()).hexdigest()
