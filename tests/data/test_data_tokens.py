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
    # the split starts with the separator (lm-evaluation-harness's prefix token), so "a" is
    # scored too
    assert split.data.tolist() == [95, 97 % 97, 98 % 97, 95, 233 % 97, 95]
    assert split.token_bytes.tolist() == [0, 1, 1, 0, 2, 0]
    assert split.token_offset.tolist() == [0, 0, 1, 2, 3, 5]  # byte positions in the split
    assert split.scored.tolist() == [False, True, True, False, True, False]
    assert split.document_of(np.arange(6)).tolist() == [0, 0, 0, 0, 1, 1]
    batch = next(iter(split.eval_batches(4, 1)))
    # targets are tokens 1..4: "a", "b", separator (not scored), "é"
    assert batch["loss_mask"].tolist() == [[1, 1, 0, 1]]
    assert batch["target_bytes"].tolist() == [[1, 1, 0, 2]]
    assert batch["target_offset"].tolist() == [[0, 1, 2, 3]]
    assert corpus.provenance()["tokenizer_sha256"] == "sha256:t"


TEXT = "def f(x):\n    return  x + 1\n\n\nclass A:\n    pass  # é日\n"


def _corpus_of(tokenizer, **kwargs):
    """The toy corpus (two documents) through a `tokenizers` tokenizer, decode checked."""

    def encode(text):
        e = tokenizer.encode(text, add_special_tokens=False)
        return e.ids, e.offsets

    return TokenCorpus(
        _Corpus((TEXT + "\0" + TEXT.upper() + "\0").encode()),
        encode,
        separator_id=0,
        tokenizer_sha256="sha256:t",
        vocab_size=tokenizer.get_vocab_size(),
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
        model="toy-model",
        **kwargs,
    )


def _trained(normalizer=None, *, byte_level=True):
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token=None if byte_level else "[UNK]"))
    if byte_level:
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.normalizer = normalizer
        tok.pre_tokenizer = tk.pre_tokenizers.Metaspace()
        tok.decoder = tk.decoders.Metaspace()
        alphabet = []
    trainer = tk.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "[UNK]"], initial_alphabet=alphabet
    )
    tok.train_from_iterator([TEXT * 5], trainer)
    return tok


def test_an_exact_bpe_tokenizer_reproduces_every_byte():
    split = _corpus_of(_trained()).split("validation")
    assert int(split.token_bytes[split.scored].sum()) == 2 * len(TEXT.encode())


def test_a_whitespace_collapsing_tokenizer_is_refused_with_its_coverage():
    tk = pytest.importorskip("tokenizers")
    collapse = tk.normalizers.Replace(tk.Regex(r"\s+"), " ")
    tok = _trained(collapse, byte_level=False)
    with pytest.raises(ValueError) as e:
        _corpus_of(tok).split("validation")
    message = str(e.value)
    assert "\n" not in message and message.startswith("toy-model: its tokens do not reproduce")
    # the bytes it keeps: everything but the collapsed whitespace (decoded text aligned with
    # the original); "(x):\n    return" loses the newline and 3 spaces at least
    fraction = float(message.split("decode to ")[1].split("%")[0]) / 100
    total = 2 * len(TEXT.encode())
    lost = sum(len(m) - 1 for m in __import__("re").findall(r"\s+", TEXT)) * 2
    assert fraction <= (total - lost) / total + 1e-4 and fraction > 0.5
    assert "document 0, byte 9: " in message  # the first difference: the newline after ':'


def test_an_unk_tokenizer_is_refused():
    tk = pytest.importorskip("tokenizers")
    # the characters of TEXT but 日: the upper-case document is mostly unknown
    vocab = {c: i for i, c in enumerate(["<|endoftext|>", "[?]", *sorted(set(TEXT) - {"日"})])}
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[], unk_token="[?]"))
    tok.decoder = tk.decoders.Fuse()
    with pytest.raises(ValueError) as e:
        _corpus_of(tok).split("validation")
    docs = TEXT + TEXT.upper()
    known = sum(len(c.encode()) for c in docs if c in vocab) / len(docs.encode())
    assert f"decode to {known:.2%} of its {len(docs.encode())} bytes" in str(e.value)
    assert "(document 0, byte 53: '日\\n' decodes as '[?]\\n')" in str(e.value)


def test_a_cut_gives_every_tokenizer_the_same_bytes():
    # two tokenizers, a cut inside a word and one inside a 3-byte character: the tokens that
    # end within the cut cover exactly its bytes for both
    tk = pytest.importorskip("tokenizers")
    coarse = _trained()  # merges trained on the text
    fine = tk.Tokenizer(tk.models.BPE())
    fine.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    fine.decoder = tk.decoders.ByteLevel()
    fine.train_from_iterator(  # no merges: one token per byte
        ["x"], tk.trainers.BpeTrainer(initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    )
    doc = len(TEXT.encode())
    for cut in (17, doc - 3, doc + 1 + 12):  # "ret|urn", inside 日, in the second document
        scored = []
        for tok in (coarse, fine):
            split = _corpus_of(tok, cut_bytes=cut).split("validation")
            n = split.tokens_within(cut)
            mask = split.scored[:n]
            scored.append(int(split.token_bytes[:n][mask].sum()))
        # bytes of text: the cut moved back to the start of 日; the 0x00 between the
        # documents is a byte of the split but not of text
        want = {17: 17, doc - 3: doc - 4}.get(cut, cut - 1)
        assert scored == [want, want]
