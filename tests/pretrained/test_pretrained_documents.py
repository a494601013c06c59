"""How a pretrained model sees a corpus's documents (`Checkpoint.separator_id`, `bos_id`,
`scored_text`): the separator and the BOS token each family was pretrained with, fed as context
and never scored; the first token of text scored like every other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from flaxformer_lite.pretrained import PretrainedError
from flaxformer_lite.pretrained.load import open_checkpoint

HF = Path(__file__).parent / "hf_models"
GGUF = Path(__file__).parent / "gguf_models"
DOCS = ["hello world", "def f(x):\n    return x", "é日 done"]


class _Split:
    def __init__(self, raw: bytes, num_files: int):
        self.data, self.name, self.num_files = np.frombuffer(raw, np.uint8), "validation", num_files


class Corpus:
    """A byte corpus of documents joined by 0x00 (what `ByteCorpus` gives for a folder)."""

    name = "docs"

    def __init__(self, docs):
        self._split = _Split(b"".join(d.encode() + b"\0" for d in docs), len(docs))

    def split(self, name):
        return self._split

    def provenance(self):
        return {"sha256": "x", "separator": 0}


def _copy(tmp_path: Path, case: str, **config) -> Path:
    """A copy of a tiny model folder with ``config.json`` fields replaced."""
    folder = tmp_path / case
    shutil.copytree(HF / case, folder)
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return folder


def _layout(checkpoint, docs=DOCS):
    """The split's tokens as (id, scored) and the expected layout built from the tokenizer."""
    split = checkpoint.scored_text(Corpus(docs)).split("validation")
    tok = checkpoint.tokenizer
    sep, bos = checkpoint.separator_id, checkpoint.bos_id
    want_ids, want_scored = [], []
    for k, doc in enumerate(docs):
        start = (
            ([bos] if bos is not None else [sep])
            if k == 0
            else ([] if bos in (None, sep) else [bos])
        )
        ids = tok.encode(doc)
        want_ids += [*start, *ids, sep]
        want_scored += [False] * len(start) + [True] * len(ids) + [False]
    return split, want_ids, want_scored


def test_gpt2_joins_documents_with_endoftext_and_starts_with_it():
    checkpoint = open_checkpoint(HF / "gpt2")
    assert checkpoint.separator_id == checkpoint.tokenizer.backend.token_to_id("<|endoftext|>")
    assert checkpoint.bos_id is None
    split, ids, scored = _layout(checkpoint)
    assert split.data.tolist() == ids and split.scored.tolist() == scored
    # every byte of text is scored: the first token too (it has the separator as context)
    assert int(split.token_bytes[split.scored].sum()) == sum(len(d.encode()) for d in DOCS)


def test_endoftext_is_the_separator_even_when_eos_names_another_token(tmp_path):
    # SmolLM2: config.json's eos_token_id is <|im_end|>; it was pretrained with
    # <|endoftext|> between documents
    checkpoint = open_checkpoint(_copy(tmp_path, "llama", eos_token_id=5))
    assert checkpoint.separator_id == checkpoint.tokenizer.backend.token_to_id("<|endoftext|>")
    # OPT's rule is its eos (</s>), whatever the vocabulary holds
    assert open_checkpoint(_copy(tmp_path, "opt", eos_token_id=5)).separator_id == 5


def test_a_family_without_a_separator_is_refused(tmp_path):
    checkpoint = open_checkpoint(_copy(tmp_path, "opt", eos_token_id=None))
    with pytest.raises(PretrainedError, match="no token to join documents"):
        checkpoint.separator_id  # noqa: B018


def test_llama_follows_its_tokenizer_on_bos(tmp_path):
    # the tiny Llama's tokenizer adds no BOS (as SmolLM2's): none is fed
    assert open_checkpoint(HF / "llama").bos_id is None
    # a tokenizer that prepends one (Llama, Mistral: <s>): each document starts with it
    folder = _copy(tmp_path, "llama")
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}},
    }
    path.write_text(json.dumps(tok))
    checkpoint = open_checkpoint(folder)
    assert checkpoint.bos_id == 7
    split, ids, scored = _layout(checkpoint)
    assert split.data.tolist() == ids and split.scored.tolist() == scored
    assert split.data[0] == 7 and (split.data == 7).sum() >= len(DOCS)
    # a document is its tokens and its separator; the BOS belongs to the document it starts
    ends = np.flatnonzero(split.data == checkpoint.separator_id)
    assert split.document_of(ends).tolist() == [0, 1, 2]
    assert split.document_of(ends[:2] + 1).tolist() == [1, 2]


def test_gemma_starts_every_document_with_bos(tmp_path):
    # the GGUF file's metadata: eos 1 joins, bos 2 starts (its tokenizer adds it too)
    checkpoint = open_checkpoint(GGUF / "gemma3_mixed")
    assert (checkpoint.separator_id, checkpoint.bos_id) == (1, 2)
    split, ids, scored = _layout(checkpoint)
    assert split.data.tolist() == ids and split.scored.tolist() == scored
    assert [int(t) for t in split.data[:1]] == [2]
    assert (split.data == 2).sum() == len(DOCS)
    # the rule is the family's, not its tokenizer's: a folder whose tokenizer adds none
    assert open_checkpoint(_copy(tmp_path, "gemma3_text", bos_token_id=3)).bos_id == 3


def test_bos_equal_to_the_separator_is_fed_once(tmp_path):
    # OPT: bos_token_id and eos_token_id are both </s>: one token between documents
    checkpoint = open_checkpoint(_copy(tmp_path, "opt", bos_token_id=2, eos_token_id=2))
    assert checkpoint.bos_id == checkpoint.separator_id == 2
    split, ids, _ = _layout(checkpoint)
    assert split.data.tolist() == ids
    assert (split.data == 2).sum() == 1 + len(DOCS)  # the split's first token, then one each
