"""Token splits (`flaxformer_lite.data.tokens`): every byte of text counted once, whatever the
tokenizer does with multi-byte characters, separators never scored, blocks are byte ranges."""

from __future__ import annotations

import numpy as np
import pytest

from flaxformer_lite.data.tokens import TokenCorpus, tokenize_document


def char_encoder(text: str):
    """One token per character (id = code point mod 97), like a character-level tokenizer."""
    return [ord(c) % 97 for c in text], [(i, i + 1) for i in range(len(text))]


def split_chars_encoder(text: str):
    """Byte-level BPE's habit: a multi-byte character becomes two tokens with the same
    character offsets (as `tokenizers` reports them)."""
    ids, offsets = [], []
    for i, c in enumerate(text):
        ids.append(ord(c) % 97)
        offsets.append((i, i + 1))
        if len(c.encode()) > 1:
            ids.append(96)
            offsets.append((i, i + 1))
    return ids, offsets


def test_bytes_per_token_follow_utf8_and_sum_to_the_document():
    raw = "aé日\n".encode()  # 1 + 2 + 3 + 1 bytes
    _, nbytes, starts = tokenize_document(raw, char_encoder)
    assert nbytes.tolist() == [1, 2, 3, 1] and starts.tolist() == [0, 1, 3, 6]
    _, nbytes, starts = tokenize_document(raw, split_chars_encoder)
    # the split characters' bytes go to their first token; the second covers none
    assert nbytes.tolist() == [1, 2, 0, 3, 0, 1]
    assert nbytes.sum() == len(raw) and starts.tolist() == [0, 1, 1, 3, 3, 6]


def test_invalid_utf8_bytes_keep_their_byte_count():
    raw = b"ab\xff\xfecd"
    ids, nbytes, _ = tokenize_document(raw, char_encoder)
    assert len(ids) == 6 and nbytes.tolist() == [1] * 6


def test_a_tokenizer_that_drops_text_is_refused():
    def lossy(text):
        return [1], [(0, 1)]

    with pytest.raises(ValueError, match="cover 1 of the document's 3 bytes"):
        tokenize_document(b"abc", lossy)


class _Split:
    def __init__(self, data, num_files):
        self.data, self.name, self.num_files = (
            np.frombuffer(data, np.uint8),
            "validation",
            num_files,
        )


class _Corpus:
    name = "toy"

    def __init__(self, data, separator=True):
        self._split = _Split(data, data.count(b"\0") if separator else 1)
        self._separator = separator

    def split(self, name):
        return self._split

    def provenance(self):
        return {"sha256": "x", "separator": 0 if self._separator else None}


def test_documents_are_joined_by_an_unscored_separator_token():
    corpus = TokenCorpus(
        _Corpus("ab\0é\0".encode()),
        char_encoder,
        separator_id=95,
        tokenizer_sha256="sha256:t",
        vocab_size=97,
    )
    split = corpus.split("validation")
    assert split.data.tolist() == [97 % 97, 98 % 97, 95, 233 % 97, 95]
    assert split.token_bytes.tolist() == [1, 1, 0, 2, 0]
    assert split.token_offset.tolist() == [0, 1, 2, 3, 5]  # byte positions in the split
    assert split.scored.tolist() == [True, True, False, True, False]
    (batch,) = list(split.eval_batches(4, 1))
    # targets are tokens 1..4: "b", separator (not scored), "é", separator (not scored)
    assert batch["loss_mask"].tolist() == [[1, 0, 1, 0]]
    assert batch["target_bytes"].tolist() == [[1, 0, 2, 0]]
    assert batch["target_offset"].tolist() == [[1, 2, 3, 5]]
    assert corpus.provenance()["tokenizer_sha256"] == "sha256:t"
