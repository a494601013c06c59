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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from flaxformer_lite.data import store
from flaxformer_lite.data.corpus import ByteSplit

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


class TokenSplit(ByteSplit):
    """A split as token ids, with each token's bytes and byte offset (module docstring).

    Behaves as a `ByteSplit` for the evaluation protocols (``data`` holds the token ids, so
    windows, strides and lengths are in tokens); `eval_batches` and `context_batches` also
    give ``target_bytes`` (bytes of each target token, 0 where not scored) and
    ``target_offset`` (its byte offset in the byte split, for statistics blocks), and mask out
    separator targets.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        token_bytes: np.ndarray,
        token_offset: np.ndarray,
        scored: np.ndarray,
        *,
        name: str,
        corpus: str,
        num_files: int,
        num_text_bytes: int,
    ) -> None:
        super().__init__(tokens, name=name, corpus=corpus, num_files=num_files)
        self.token_bytes = token_bytes
        self.token_offset = token_offset
        self.scored = scored
        self.num_text_bytes = num_text_bytes

    def __repr__(self) -> str:
        return (
            f"TokenSplit({self.corpus!r}, {self.name!r}, tokens={self.num_bytes}, "
            f"text_bytes={self.num_text_bytes})"
        )

    def _separator_positions(self) -> np.ndarray:
        """Token positions of the separators between documents (the unscored tokens)."""
        return np.flatnonzero(~np.asarray(self.scored, bool))

    def _targets(self, batch: dict[str, np.ndarray], positions: np.ndarray) -> dict:
        """Add ``target_bytes`` / ``target_offset`` for target token ``positions`` ``[b, L]``
        and drop separators from ``loss_mask``."""
        n = self.data.shape[0]
        inside = positions < n
        safe = np.clip(positions, 0, n - 1)
        mask = batch["loss_mask"] * (self.scored[safe] & inside)
        out = dict(batch, loss_mask=mask.astype(np.float32))
        out["target_bytes"] = np.where(mask > 0, self.token_bytes[safe], 0).astype(np.float32)
        out["target_offset"] = np.where(inside, self.token_offset[safe], 0).astype(np.int64)
        return out

    def eval_batches(
        self,
        length: int,
        batch_size: int,
        *,
        stride: int | None = None,
        max_bytes: int | None = None,
        max_windows: int | None = None,
        pad_batch: bool = False,
    ) -> Iterator[dict[str, np.ndarray]]:
        """`ByteSplit.eval_batches` in tokens (``max_bytes``: the first that many tokens),
        plus ``target_bytes`` and ``target_offset``."""
        data, stride_, count = self._eval_plan(length, stride, max_bytes, max_windows)
        for batch, first in ByteSplit._iter_batches_with_ids(
            data, int(length), stride_, count, batch_size, pad_batch
        ):
            rows = first + np.arange(batch["inputs"].shape[0])
            positions = rows[:, None] * stride_ + np.arange(1, int(length) + 1)[None, :]
            yield self._targets(batch, positions)

    def context_batches(
        self, starts: np.ndarray, context: int, block: int, batch_size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """`ByteSplit.context_batches` plus ``target_bytes`` and ``target_offset``."""
        starts = np.asarray(starts, np.int64)
        length = context + block - 1
        for first, batch in zip(
            range(0, max(starts.shape[0], 1), batch_size),
            super().context_batches(starts, context, block, batch_size),
            strict=False,
        ):
            rows = starts[first : first + batch_size]
            rows = np.concatenate([rows, np.full(batch_size - rows.shape[0], context)])
            positions = (rows - context + 1)[:, None] + np.arange(length)[None, :]
            yield self._targets(batch, positions)


class TokenCorpus:
    """A `ByteCorpus` tokenized by one tokenizer; its splits are `TokenSplit` s, made on
    first use (only the splits a run evaluates are tokenized).

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
        self._splits: dict[str, TokenSplit] = {}

    def __repr__(self) -> str:
        return f"TokenCorpus({self.corpus!r}, tokenizer={self.tokenizer_sha256[:15]})"

    def split(self, name: str) -> TokenSplit:
        if name not in self._splits:
            self._splits[name] = self._tokenize(self.corpus.split(name))
        return self._splits[name]

    def _tokenize(self, split: ByteSplit) -> TokenSplit:
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
        return TokenSplit(
            cat(ids, np.int32),
            cat(nbytes, np.int64),
            cat(offsets, np.int64),
            cat(scored, bool),
            name=split.name,
            corpus=self.name,
            num_files=split.num_files,
            num_text_bytes=sum(len(d) for d in documents),
        )

    def provenance(self) -> dict:
        """The byte corpus's provenance plus the tokenizer's hash."""
        return self.corpus.provenance() | {"tokenizer_sha256": self.tokenizer_sha256}


def tokens_digest(split: TokenSplit) -> str:
    """``sha256:`` of a split's token ids (a check that two runs scored the same tokens)."""
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(split.data).tobytes()).hexdigest()
