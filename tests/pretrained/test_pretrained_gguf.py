"""GGUF files (llama.cpp's format): parity with transformers' GGUF loading, and refusals.

Three sources of truth, none of them this library:

* ``gguf_models/<case>/``: tiny quantized files (``scripts/make_gguf_goldens.py``) with the
  logits, greedy tokens and tokenizer ids transformers computed from each file alone;
* ``hf_models/<case>/``: the safetensors fixtures, converted here to float32 GGUF as
  llama.cpp's converter would (``gguf_convert.py``: gguf-py's tensor names, the converter's
  permutations), which must give back transformers' golden logits of the folder -- every
  family's mapping, permutation and re-ordering undone;
* gguf-py's own tensor-name table, which every entry of the name mapping must agree with.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import flaxformer_lite as ffl
from flaxformer_lite.pretrained import (
    PretrainedError,
    generate_ids,
    gguf_tokenizer,
    load_pretrained,
)
from flaxformer_lite.pretrained import gguf as ggufmod
from tests.pretrained.gguf_convert import convert, permute, qkv_to_gpt_layout

gguf = pytest.importorskip("gguf")

HERE = Path(__file__).parent
GGUF_MODELS = HERE / "gguf_models"
HF_MODELS = HERE / "hf_models"
QUANTIZED = ["llama_q8_0", "llama_mixed"]
CONVERTED = ["llama", "mistral", "qwen2", "gpt2", "bloom", "gpt_neox", "gpt_neox_sequential", "mpt"]
TOL = 1e-4
TEXT = (
    "Attention lets every position look back.  Twice  spaced,\tthen a tab.\n\n"
    "def f(x):\n    return x ** 2  # squares\n\n"
    "naïve café, Größe, 日本語, emoji 🤖 and   three spaces   here.\n"
)
SNIPPET = (
    "The transformer computes, for each position, a distribution over the next token from the "
    "tokens that came before it, and attention lets every position look back."
)


def _golden(case: str) -> dict[str, np.ndarray]:
    with np.load(GGUF_MODELS / case / "golden.npz") as z:
        return dict(z)


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = load_pretrained(GGUF_MODELS / case / "model.gguf")
        return cache[case]

    return get


def _refused(path, *patterns: str) -> str:
    with pytest.raises(PretrainedError) as info:
        load_pretrained(path)
    message = str(info.value)
    assert "\n" not in message, message
    for pattern in patterns:
        assert pattern in message, message
    return message


# ------------------------------------------------------------------------- the mapping


@pytest.mark.parametrize("arch", sorted(ggufmod.ARCHITECTURES))
def test_tensor_names_agree_with_gguf_py(arch):
    """Every GGUF -> Hugging Face name of the table is what gguf-py (llama.cpp's converter's
    name map) calls that Hugging Face tensor."""
    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(enum, 4)
    for gguf_name, hf_name in ggufmod.ARCHITECTURES[arch].names.items():
        hf = hf_name.format(i=3)
        got = names.get_name(hf)
        if got is None and hf.startswith("transformer."):  # BLOOM's converter drops it
            got = names.get_name(hf[len("transformer.") :])
        assert got == gguf_name.format(i=3), (arch, hf, got)


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    for heads, kv in ((4, 4), (4, 2), (6, 1)):
        for shape in ((kv * 8, 5), (kv * 8,)):
            x = rng.normal(size=shape).astype(np.float32)
            stored = permute(x, heads, kv)
            assert not np.array_equal(stored, x)
            np.testing.assert_array_equal(ggufmod.unpermute_rows(stored, kv), x)


def test_qkv_per_head_inverts_the_converters_reordering():
    x = np.arange(3 * 4 * 6 * 2, dtype=np.float32).reshape(3 * 4 * 6, 2)
    np.testing.assert_array_equal(ggufmod.qkv_per_head(qkv_to_gpt_layout(x, 4), 4), x)


@pytest.mark.parametrize("case", CONVERTED)
def test_converted_safetensors_fixture_gives_transformers_logits(case, tmp_path):
    """A float32 GGUF written as llama.cpp's converter writes it loads to the folder's own
    transformers logits: names, permutations, re-orderings and config keys undone."""
    path = convert(HF_MODELS / case, tmp_path / f"{case}.gguf")
    lm = load_pretrained(path)
    with np.load(HF_MODELS / case / "golden.npz") as z:
        golden = dict(z)
    err = np.abs(np.asarray(lm.model(jnp.asarray(golden["input_ids"]))) - golden["logits"]).max()
    assert err < TOL, f"{case}: max |logit - transformers| = {err:.2e}"
    assert lm.tokenizer.encode(SNIPPET)[:40] == golden["input_ids"][0].tolist()
    assert lm.info.weights_format == "gguf F32 dequantized to float32"


@pytest.mark.parametrize("case", [*QUANTIZED, "gemma3_mixed"])
def test_config_matches_transformers_gguf_config(case):
    """The config dict equals the one transformers builds from the same metadata, on every
    key both have (transformers' full config, defaults filled in)."""
    opened = ggufmod.open_gguf(GGUF_MODELS / case / "model.gguf")
    theirs = json.loads((GGUF_MODELS / case / "transformers_config.json").read_text())["config"]
    mine = opened.hf_config
    compared = 0
    for key, value in mine.items():
        if key == "architectures" or key not in theirs:
            continue
        compared += 1
        if isinstance(value, float):
            assert value == pytest.approx(theirs[key], rel=1e-12), key
        else:
            assert value == theirs[key], (key, value, theirs[key])
    assert compared >= 12


# ------------------------------------------------------------ quantized files vs transformers


@pytest.mark.parametrize("case", QUANTIZED)
def test_quantized_logits_match_transformers_gguf(case, loaded):
    golden, lm = _golden(case), loaded(case)
    logits = np.asarray(lm.model(jnp.asarray(golden["input_ids"])))
    err = np.abs(logits - golden["logits"]).max()
    assert err < TOL, f"{case}: max |logit - transformers| = {err:.2e}"
    assert lm.info.weights_format.startswith("gguf ") and "dequantized to float32" in (
        lm.info.weights_format
    )


@pytest.mark.parametrize("case", QUANTIZED)
def test_quantized_generation_matches_transformers_gguf(case, loaded):
    """Greedy tokens; and with the stop token, the tokens up to and including its first
    occurrence, as transformers' generate with that ``eos_token_id``."""
    golden, lm = _golden(case), loaded(case)
    prompt, generated = golden["prompt_ids"], golden["generated_ids"]
    tokens = ffl.generate(lm.model, jnp.asarray(prompt), max_new_tokens=generated.shape[1])
    np.testing.assert_array_equal(np.asarray(tokens), generated)
    stop = int(golden["stop_token"])
    got = generate_ids(lm, prompt[0].tolist(), max_new_tokens=generated.shape[1], stop_token=stop)
    assert got == golden["stopped_ids"][0].tolist()
    assert got[-1] == stop and stop not in got[:-1]


@pytest.mark.parametrize("case", [*QUANTIZED, "gemma3_mixed"])
def test_tokenizer_ids_match_transformers_gguf(case):
    """Byte-level BPE (llama files) and Gemma's SentencePiece BPE with byte fallback: the ids
    of prose, code, unicode and whitespace runs, special tokens included (Gemma's BOS)."""
    golden = _golden(case)
    tok = gguf_tokenizer.load_tokenizer(ggufmod.open_gguf(GGUF_MODELS / case / "model.gguf"))
    assert tok.encode(TEXT, add_special_tokens=True) == golden["text_ids"].tolist()
    for row in golden["input_ids"]:
        text = tok.decode(row.tolist())
        assert tok.encode(text)[: len(row)] == row.tolist()
    assert tok.sha256.startswith("sha256:")


def test_hashes_name_the_file_and_the_tokenizer_metadata(loaded):
    lm = loaded("llama_q8_0")
    path = GGUF_MODELS / "llama_q8_0" / "model.gguf"
    assert lm.info.weights_sha256 == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert lm.info.tokenizer_sha256 == lm.tokenizer.sha256 != lm.info.weights_sha256
    other = gguf_tokenizer.load_tokenizer(
        ggufmod.open_gguf(GGUF_MODELS / "llama_mixed" / "model.gguf")
    )
    assert other.sha256 == lm.tokenizer.sha256  # the same vocabulary, other weights


def test_a_folder_with_one_gguf_and_no_config_loads(tmp_path):
    shutil.copy(GGUF_MODELS / "llama_q8_0" / "model.gguf", tmp_path / "m.gguf")
    lm = load_pretrained(tmp_path, tokenizer=False)
    assert lm.info.family == "llama" and lm.info.folder == str(tmp_path)
    shutil.copy(tmp_path / "m.gguf", tmp_path / "n.gguf")
    _refused(tmp_path, "2 GGUF files", "m.gguf", "n.gguf")


# ------------------------------------------------------------------------------ refusals


def _write(path: Path, arch: str = "llama", *, tensors=(), keys=None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (keys or {}).items():
        if isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    for name, array in tensors:
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_not_a_gguf_file_is_refused(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    _refused(tmp_path / "x.gguf", "x.gguf", "not a GGUF file")
    _refused(tmp_path / "missing.gguf", "missing.gguf", "no such GGUF file")


def test_a_truncated_file_is_refused(tmp_path):
    data = (GGUF_MODELS / "llama_q8_0" / "model.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 1000])
    _refused(tmp_path / "cut.gguf", "cut.gguf", "truncated", "needs bytes", "the file has")


def test_a_header_declaring_more_than_the_file_holds_is_refused(tmp_path):
    data = bytearray((GGUF_MODELS / "llama_q8_0" / "model.gguf").read_bytes())
    data[8:16] = struct.pack("<Q", 2**40)  # tensor count
    (tmp_path / "h.gguf").write_bytes(bytes(data))
    _refused(tmp_path / "h.gguf", "h.gguf", "1099511627776 tensors", "more than")


def test_absurd_tensor_sizes_are_answered_by_arithmetic(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "big.gguf"), "llama")
    w.add_tensor_info("token_embd.weight", (2**30, 2**30), np.dtype(np.float32), 2**62)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    _refused(tmp_path / "big.gguf", "big.gguf", "token_embd.weight", "absurd")


def test_more_float32_than_the_host_has_is_refused(monkeypatch):
    monkeypatch.setattr(ggufmod, "host_available", lambda: (1000, "test budget"))
    _refused(
        GGUF_MODELS / "llama_q8_0" / "model.gguf", "model.gguf", "dequantized to float32", "1000 B"
    )


def test_loading_holds_one_dequantized_tensor_at_a_time(monkeypatch):
    """Each tensor is dequantized, checked and placed before the next is read: when a tensor
    is dequantized no earlier one is still alive on the host (they used to be held all
    together, doubling the loading peak), and the model is still the golden one."""
    import weakref

    alive: list[weakref.ref] = []
    get = ggufmod.GGUFCheckpoint.get

    def watched(self, name):
        held = [r for r in alive if r() is not None]
        assert not held, f"{len(held)} dequantized tensor(s) still held when {name} is read"
        array = get(self, name)
        alive.append(weakref.ref(array))
        return array

    monkeypatch.setattr(ggufmod.GGUFCheckpoint, "get", watched)
    lm = load_pretrained(GGUF_MODELS / "llama_q8_0" / "model.gguf")
    assert len(alive) > 10
    gold = _golden("llama_q8_0")
    logits = np.asarray(lm.model(jnp.asarray(gold["input_ids"])))
    np.testing.assert_allclose(logits, gold["logits"], atol=TOL, rtol=0)


def test_a_non_finite_weight_is_refused_naming_the_file_and_its_gguf_tensor(tmp_path):
    """A NaN stored in a GGUF file is one line naming the file, the tensor as the file names
    it, its shape and the index (as for safetensors), not a crash while composing it."""
    src = GGUF_MODELS / "llama_q8_0" / "model.gguf"
    (tensor,) = [t for t in gguf.GGUFReader(src).tensors if t.name == "blk.0.attn_norm.weight"]
    assert tensor.tensor_type.name == "F32"
    data = bytearray(src.read_bytes())
    offset = tensor.data_offset + 4 * 5  # the sixth value
    data[offset : offset + 4] = struct.pack("<f", float("nan"))
    (tmp_path / "nan.gguf").write_bytes(bytes(data))
    _refused(
        tmp_path / "nan.gguf",
        "nan.gguf: tensor 'blk.0.attn_norm.weight' (32,) holds 1 non-finite value(s)",
        "the first nan at index (5,)",
    )


def test_an_unknown_architecture_is_refused_listing_the_supported(tmp_path):
    path = _write(tmp_path / "t5.gguf", "t5", tensors=[("x.weight", np.ones(4, np.float32))])
    _refused(path, "general.architecture='t5'", "supported", "gemma3", "llama", "gptneox")


def test_an_unsupported_tensor_type_is_refused_naming_tensor_and_type(tmp_path):
    src = GGUF_MODELS / "llama_q8_0" / "model.gguf"
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(tmp_path / "i8.gguf"), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, kind)
    for t in reader.tensors:
        if t.name == "output_norm.weight":
            w.add_tensor(t.name, np.ones(t.data.shape, np.int8))
        else:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path / "i8.gguf", "'output_norm.weight'", "I8", "dequantize does not support")


@pytest.mark.parametrize(
    ("key", "value", "pattern"),
    [
        ("llama.expert_count", 8, "mixtures of experts"),
        ("llama.attention.clamp_kqv", 8.0, "llama.attention.clamp_kqv=8.0 is not supported"),
        ("llama.rope.scaling.type", "longrope", "supported: none, linear, yarn"),
        ("llama.rope.scaling.attn_factor", 2.0, "rope.scaling.attn_factor"),
    ],
)
def test_metadata_that_nothing_maps_is_refused(tmp_path, key, value, pattern):
    dims = {
        "llama.embedding_length": 32,
        "llama.attention.head_count": 4,
        "llama.feed_forward_length": 64,
        "llama.block_count": 1,
        "llama.context_length": 64,
        "llama.attention.layer_norm_rms_epsilon": 1e-6,
        "llama.vocab_size": 8,
    }
    path = _write(tmp_path / "m.gguf", keys=dims | {key: value})
    with pytest.raises(PretrainedError, match=r"^[^\n]*$") as info:
        ggufmod.open_gguf(path)
    assert pattern in str(info.value) and "m.gguf" in str(info.value)


def test_llama3_frequency_factors_are_refused(tmp_path):
    src = convert(HF_MODELS / "llama", tmp_path / "a.gguf")
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(tmp_path / "l3.gguf"), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                w.add_array(key, field.contents())
            else:
                w.add_key_value(key, field.contents(), field.types[0])
    for t in reader.tensors:
        w.add_tensor(t.name, t.data)
    w.add_tensor("rope_freqs.weight", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path / "l3.gguf", "rope_freqs.weight", "llama 3")


# ------------------------------------------------------ Gemma 3 (needs the gemma3_text family)


def test_gemma3_quantized_file_matches_transformers_gguf(loaded):
    """Gemma 3 from a GGUF file: norms stored as w + 1, 5 local layers (window 4) and 1 global,
    q/k norms, GeGLU, tied embeddings scaled by sqrt(d). Needs the library's gemma3_text
    family (a GGUF file maps onto the families; without it the load is refused in one line)."""
    golden, lm = _golden("gemma3_mixed"), loaded("gemma3_mixed")
    logits = np.asarray(lm.model(jnp.asarray(golden["input_ids"])))
    err = np.abs(logits - golden["logits"]).max()
    assert err < TOL, f"gemma3_mixed: max |logit - transformers| = {err:.2e}"
    prompt, generated = golden["prompt_ids"], golden["generated_ids"]
    tokens = ffl.generate(lm.model, jnp.asarray(prompt), max_new_tokens=generated.shape[1])
    np.testing.assert_array_equal(np.asarray(tokens), generated)
    got = generate_ids(
        lm,
        prompt[0].tolist(),
        max_new_tokens=generated.shape[1],
        stop_token=int(golden["stop_token"]),
    )
    assert got == golden["stopped_ids"][0].tolist()
