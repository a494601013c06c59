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

Documents are joined by the model's end-of-text token (``separator_id``); where the model was
trained with a beginning-of-sequence token (``bos_id``), each document starts with it. The split
starts with one of them too (the BOS, else the separator: lm-evaluation-harness's prefix token),
so the first token of text is scored like every other. These tokens are fed as context but never
scored and cover no bytes (the byte corpus's 0x00 separators are not text). Windows are cut in
token space, so a token never spans a window edge: every scored token is scored once, with all
its bytes, at every evaluation length.

Two checks keep bits per byte honest across tokenizers:

* **coverage**: given the tokenizer's ``decode``, each document's tokens must decode to exactly
  its text; a lossy tokenizer (a normalizer that collapses whitespace, an ``<unk>`` token) is
  refused in one line with the fraction of bytes its tokens reproduce and an example, never
  counted (its bits per byte would be credited with bytes it did not predict).
* **the same bytes**: with ``cut_bytes`` (the evaluation's ``max_bytes``) the text is tokenized
  with a token boundary forced at that byte (moved back to the start of its UTF-8 character),
  so the tokens within the first ``cut_bytes`` bytes (`Split.tokens_within`) cover exactly the
  same bytes for every tokenizer.

Bytes that are not valid UTF-8 (the byte corpora accept any file) become U+FFFD for the
tokenizer and keep their own byte count.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flaxformer_lite.data import store
from flaxformer_lite.data.corpus import Split

# encode(text) -> (token ids, [(start, end) character offsets]) for one document
Encoder = Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]]
# decode(token ids) -> text
Decoder = Callable[[Sequence[int]], str]
# documents longer than this (characters, both sides) are not aligned character by character
# when measuring a lossy tokenizer's coverage: their differing lines count as not reproduced
_ALIGN_CHARS = 20_000


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


def reproduced_bytes(
    raw: bytes, ids: Sequence[int], decode: Decoder
) -> tuple[int, tuple[int, str] | None]:
    """``(bytes of raw its tokens reproduce, (byte, description) of the first difference or
    None)``:
    ``decode(ids)`` against the document's text (`_char_bytes`); equal -> ``len(raw)``.
    Otherwise the bytes of the text in common, aligned line by line then character by
    character within differing lines (`difflib.SequenceMatcher`)."""
    text, char_start = _char_bytes(raw)
    decoded = decode(list(ids))
    if decoded == text:
        return len(raw), None
    i = len(_common_prefix(text, decoded))
    example = (int(char_start[i]), f"{text[i : i + 24]!r} decodes as {decoded[i : i + 24]!r}")
    a, b = text.splitlines(keepends=True), decoded.splitlines(keepends=True)
    a_pos = np.concatenate([[0], np.cumsum([len(x) for x in a])]).astype(np.int64)
    matched = 0
    lines = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in lines.get_opcodes():
        lo, hi = int(a_pos[i1]), int(a_pos[i2])
        if tag == "equal":
            matched += int(char_start[hi] - char_start[lo])
        elif tag == "replace":
            x, y = text[lo:hi], "".join(b[j1:j2])
            if len(x) + len(y) <= _ALIGN_CHARS:
                chars = difflib.SequenceMatcher(None, x, y, autojunk=False)
                for k, _, n in chars.get_matching_blocks():
                    matched += int(char_start[lo + k + n] - char_start[lo + k])
    return matched, example


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _char_boundary(raw: bytes, cut: int) -> int:
    """``cut`` moved back to the start of the UTF-8 character it falls in (continuation bytes
    are 0b10xxxxxx), at most 3 bytes."""
    k = cut
    while 0 < k < len(raw) and cut - k < 3 and (raw[k] & 0xC0) == 0x80:
        k -= 1
    return k if 0 <= k < len(raw) and (raw[k] & 0xC0) != 0x80 else cut


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
      bos_id: the token that starts each document (and the split), or None: the split starts
        with ``separator_id``.
      decode: ``decode(ids) -> text``: checks that the tokens reproduce the text (module
        docstring); None: not checked.
      cut_bytes: force a token boundary at this byte of each split (the evaluation's
        ``max_bytes``), so every tokenizer's tokens within it cover the same bytes.
      model: what the tokenizer belongs to, for messages.
    """

    def __init__(
        self,
        corpus: Any,
        encode: Encoder,
        *,
        separator_id: int,
        tokenizer_sha256: str,
        vocab_size: int,
        bos_id: int | None = None,
        decode: Decoder | None = None,
        cut_bytes: int | None = None,
        model: str = "the tokenizer",
    ) -> None:
        self.corpus = corpus
        self.name = corpus.name
        self.encode = encode
        self.decode = decode
        self.separator_id = int(separator_id)
        self.bos_id = None if bos_id is None else int(bos_id)
        self.cut_bytes = None if not cut_bytes else int(cut_bytes)
        self.model = model
        self.tokenizer_sha256 = tokenizer_sha256
        self.vocab_size = vocab_size
        self._splits: dict[str, Split] = {}

    def __repr__(self) -> str:
        return f"TokenCorpus({self.corpus!r}, tokenizer={self.tokenizer_sha256[:15]})"

    def split(self, name: str) -> Split:
        if name not in self._splits:
            self._splits[name] = self._tokenize(self.corpus.split(name))
        return self._splits[name]

    def _document(self, doc: bytes, position: int, where: str):
        """``(ids, bytes, offsets, bytes reproduced, first difference)`` of one document at byte
        ``position`` of the split, split in two at ``cut_bytes`` when it falls inside."""
        pieces = [doc]
        if self.cut_bytes is not None and position < self.cut_bytes < position + len(doc):
            cut = _char_boundary(doc, self.cut_bytes - position)
            pieces = [doc[:cut], doc[cut:]] if 0 < cut < len(doc) else [doc]
        ids, nbytes, offsets, good, example, at = [], [], [], 0, None, position
        for piece in pieces:
            try:
                t, b, o = tokenize_document(piece, self.encode)
            except ValueError as e:
                raise ValueError(f"{self.model}: {where}: {e}") from None
            ids.append(t)
            nbytes.append(b)
            offsets.append(o + at)
            if self.decode is not None:
                n, ex = reproduced_bytes(piece, t, self.decode)
                good += n
                if ex is not None and example is None:
                    example = f"byte {ex[0] + at}: {ex[1]}"
            at += len(piece)
        return ids, nbytes, offsets, good, example

    def _tokenize(self, split: Split) -> Split:
        raw = np.asarray(split.data).tobytes()
        sep = bytes([store.SEPARATOR])
        has_separators = self.corpus.provenance().get("separator") is not None
        documents = raw.split(sep) if has_separators else [raw]
        start = self.separator_id if self.bos_id is None else self.bos_id
        bos = [] if self.bos_id in (None, self.separator_id) else [self.bos_id]
        # unscored context tokens covering no bytes, at byte ``at``
        context = lambda tokens, at: (
            np.asarray(tokens, np.int32),
            np.zeros(len(tokens), np.int64),
            np.full(len(tokens), at, np.int64),
            np.zeros(len(tokens), bool),
        )
        parts = [context([start], 0)]
        boundaries = []  # the position of each separator (the token that ends a document)
        count, position, reproduced, example = 1, 0, 0, None
        for k, doc in enumerate(documents):
            if doc:
                if k and bos:  # the first document's BOS is the split's first token
                    parts.append(context(bos, position))
                    count += 1
                where = f"corpus {self.name!r} split {split.name!r}, document {k} (byte {position})"
                ids, nbytes, offsets, good, ex = self._document(doc, position, where)
                reproduced += good
                if ex is not None and example is None:
                    example = f"document {k}, {ex}"
                for t, b, o in zip(ids, nbytes, offsets, strict=True):
                    parts.append((t, b, o, np.ones(t.shape[0], bool)))
                    count += t.shape[0]
            position += len(doc)
            if has_separators and k < len(documents) - 1:  # the 0x00 after the document
                boundaries.append(count)
                parts.append(context([self.separator_id], position))
                count += 1
                position += 1
        text_bytes = sum(len(d) for d in documents)
        if self.decode is not None and reproduced != text_bytes:
            raise ValueError(
                f"{self.model}: its tokens do not reproduce the text of corpus {self.name!r} "
                f"split {split.name!r}: they decode to {reproduced / max(text_bytes, 1):.2%} of "
                f"its {text_bytes} bytes ({example}); bits per byte would credit the model "
                "with bytes it did not predict: use a tokenizer that keeps the text (no "
                "normalizer that rewrites it, no <unk>)"
            )
        ids, nbytes, offsets, scored = (np.concatenate(x) for x in zip(*parts, strict=True))
        return Split(
            ids.astype(np.int32),
            token_bytes=nbytes.astype(np.int64),
            token_offset=offsets.astype(np.int64),
            scored=scored.astype(bool),
            document_ends=np.asarray(boundaries, np.int64),
            name=split.name,
            corpus=self.name,
            num_files=split.num_files,
            num_text_bytes=text_bytes,
        )

    def provenance(self) -> dict:
        """The byte corpus's provenance plus the tokenizer's hash."""
        return self.corpus.provenance() | {"tokenizer_sha256": self.tokenizer_sha256}
