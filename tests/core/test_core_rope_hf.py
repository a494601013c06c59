"""RoPE scalings against Hugging Face transformers: inverse frequencies and attention factor.

tests/core/rope_goldens.json holds transformers' numbers for a grid of configs (every
rope_type HF ships, both config formats; scripts/make_rope_goldens.py regenerates it). Each
config goes through `rope_options_from_hf` and `RotaryEncoding`, so the mapping and the
frequency functions are checked together, to 1e-6 relative.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.core import rotary
from flaxformer_lite.nn.encodings.base import ModelDims
from flaxformer_lite.nn.encodings.rotary import RotaryEncoding
from flaxformer_lite.pretrained.hf_rope import rope_options_from_hf

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDENS = json.loads((ROOT / "tests" / "core" / "rope_goldens.json").read_text())["cases"]
RTOL = 1e-6
FORMATS = ("config", "legacy_config")


def _library(config: dict, length: int) -> tuple[np.ndarray, float]:
    head_dim = config["head_dim"]
    options = rope_options_from_hf(config, head_dim=head_dim)
    enc = RotaryEncoding(ModelDims(head_dim, 1, head_dim), options, rngs=nnx.Rngs(0))
    positions = jnp.arange(length, dtype=jnp.int32)[None]
    inv = np.asarray(enc.inv_frequencies(positions), np.float64)
    return inv.reshape(-1, inv.shape[-1])[0], float(enc.attention_factor)


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want) / np.abs(want)))


def _check(case: dict, fmt: str, results: list[dict]) -> None:
    for r in results:
        inv, factor = _library(case[fmt], r["length"])
        want = np.asarray(r["inv_freq"], np.float64)
        err = _max_rel(inv, want)
        assert err <= RTOL, f"{case['name']} ({fmt}) at length {r['length']}: rel err {err:.2e}"
        assert factor == pytest.approx(r["attention_factor"], rel=RTOL), (case["name"], fmt)


def test_goldens_cover_every_hf_rope_type():
    types = {c["config"]["rope_parameters"]["rope_type"] for c in GOLDENS}
    assert types == {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}
    assert any(c["legacy_config"]["rope_scaling"] for c in GOLDENS)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", GOLDENS, ids=[c["name"] for c in GOLDENS])
def test_matches_transformers_goldens(case, fmt):
    _check(case, fmt, case["results"])


def test_length_dependent_goldens_straddle_the_original_length():
    for case in GOLDENS:
        if case["config"]["rope_parameters"]["rope_type"] in ("dynamic", "longrope"):
            freqs = {tuple(r["inv_freq"]) for r in case["results"]}
            assert len(freqs) >= 2, case["name"]  # short and long differ


def test_core_functions_directly_match_goldens():
    """The core functions alone (no config mapping) on three of the configs."""
    by_name = {c["name"]: c for c in GOLDENS}
    llama = by_name["llama3_hd128_llama3.1"]["results"][0]["inv_freq"]
    got = rotary.llama3_inv_frequencies(128, scale=8.0, original_length=8192, base=5e5)
    assert _max_rel(np.asarray(got, np.float64), np.asarray(llama)) <= RTOL
    case = by_name["yarn_hd64_no_truncate_gptoss"]
    got = rotary.yarn_inv_frequencies(
        64, scale=32.0, original_length=4096, base=150000.0, truncate=False
    )
    want = np.asarray(case["results"][0]["inv_freq"])
    assert _max_rel(np.asarray(got, np.float64), want) <= RTOL
    case = by_name["longrope_hd64_factor4"]
    rope = case["config"]["rope_parameters"]
    for r in case["results"]:
        got = rotary.longrope_inv_frequencies(
            jnp.arange(r["length"])[None],
            64,
            original_length=2048,
            short_factor=tuple(rope["short_factor"]),
            long_factor=tuple(rope["long_factor"]),
        )
        assert _max_rel(np.asarray(got, np.float64)[0], np.asarray(r["inv_freq"])) <= RTOL
    assert rotary.longrope_attention_factor(4.0, 2048) == pytest.approx(
        case["results"][0]["attention_factor"], rel=RTOL
    )


def _golden_script():
    spec = importlib.util.spec_from_file_location(
        "make_rope_goldens", ROOT / "scripts" / "make_rope_goldens.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_live_against_transformers():
    """The same grid recomputed by the installed transformers (skipped without it)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    script = _golden_script()
    for case in script.cases():
        config = case["config"]
        lengths = script._lengths(config["rope_parameters"]["rope_type"], script._original(config))
        for fmt in FORMATS:
            _check(case, fmt, script.hf_results(case[fmt], lengths))


def test_goldens_are_what_the_script_writes_today():
    """The JSON's configs are the script's grid (regenerate after editing either)."""
    script = _golden_script()
    grid = script.cases()
    assert [c["name"] for c in grid] == [c["name"] for c in GOLDENS]
    for case, golden in zip(grid, GOLDENS, strict=True):
        assert case["config"] == golden["config"], case["name"]
        assert case["legacy_config"] == golden["legacy_config"], case["name"]
