"""Models with different tokenizers, evaluated with the same ``eval.max_bytes``, score exactly the
same bytes, so their statistics blocks pair: `significance.compare` gives a paired difference."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from flaxformer_lite.data.corpus import ByteCorpus
from flaxformer_lite.evaluation.protocols import Windows
from flaxformer_lite.evaluation.score import score
from flaxformer_lite.pretrained.load import open_checkpoint
from flaxformer_lite.results import significance

HERE = Path(__file__).parent.parent / "pretrained"
# byte-level BPE (vocabulary 300) and SentencePiece BPE with byte fallback (vocabulary 400)
MODELS = {"gpt2": HERE / "hf_models" / "gpt2", "gemma3": HERE / "gguf_models" / "gemma3_mixed"}
MAX_BYTES = 12_500  # 13 blocks of 1024 bytes, the last one partial


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    text = Path(inspect.getsourcefile(inspect)).read_bytes()[:40_000]
    files = {}
    for k, name in enumerate(("train", "validation", "test")):
        files[name] = folder / f"{name}.txt"
        files[name].write_bytes(text[k * 13_000 : (k + 1) * 13_000 + 500])
    return ByteCorpus.from_split_files(files, name="inspect")


def _evaluate(name, corpus):
    checkpoint = open_checkpoint(MODELS[name])
    split = checkpoint.scored_text(corpus, max_bytes=MAX_BYTES).split("validation")
    result = score(checkpoint.load(), Windows(16, max_bytes=MAX_BYTES), split, batch_size=64)
    return split, result


def test_two_tokenizers_score_the_same_bytes_and_their_blocks_pair(corpus):
    key = dict(study="s", run="r", seed=0, protocol="nonoverlapping", eval_length=16)
    rows, records, splits, results = [], [], {}, {}
    for name in MODELS:
        splits[name], results[name] = _evaluate(name, corpus)
        rows.append(key | {"encoding": name, "value": results[name]["bits_per_byte"]})
        records.append(rows[-1] | {"blocks": results[name]["blocks"]})
    # different tokenizations of the same text ...
    assert splits["gpt2"].num_tokens != splits["gemma3"].num_tokens
    # ... scoring exactly the first MAX_BYTES bytes each, in the same 13 byte blocks
    for name in MODELS:
        assert results[name]["scored_bytes"] == MAX_BYTES
        assert len(results[name]["blocks"]["bytes"]) == 13
        assert sum(results[name]["blocks"]["bytes"]) == MAX_BYTES
    index = significance.BlockIndex(records)
    grids = {r["encoding"]: index.grid([r], "bits_per_byte") for r in rows}
    diff = significance.compare(grids["gpt2"], grids["gemma3"])
    assert diff is not None
    # the paired difference is the difference of the two bits per byte (the same bytes)
    want = results["gpt2"]["bits_per_byte"] - results["gemma3"]["bits_per_byte"]
    assert diff["delta"] == pytest.approx(want, rel=1e-6)


def test_without_the_same_bytes_the_comparison_says_why(corpus):
    _, result = _evaluate("gpt2", corpus)
    blocks = result["blocks"]
    short = {k: v[:-2] if isinstance(v, list) else v for k, v in blocks.items()}
    row = dict(study="s", run="r", seed=0, encoding="a")
    index = significance.BlockIndex(
        [row | {"blocks": blocks}, row | {"encoding": "b", "blocks": short}]
    )
    a, b = (index.grid([row | {"encoding": e}], "bits_per_byte") for e in "ab")
    assert np.isfinite(a.values).all()
    with pytest.raises(significance.PairingError, match="13 vs 11 scored blocks"):
        significance.compare(a, b)
