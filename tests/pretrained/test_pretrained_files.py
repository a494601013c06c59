"""A model folder is untrusted input: what `load_pretrained` refuses, each in one line.

Each case copies a real fixture folder (tests/pretrained/hf_models/) and damages it the way
a careless or hostile folder would; the error must be a `PretrainedError` whose message is
one line naming the file, tensor or field, and nothing may be left at a random
initialisation.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from flaxformer_lite.pretrained import PretrainedError, load_pretrained, model_config
from flaxformer_lite.pretrained.files import CheckpointFiles

MODELS = Path(__file__).parent / "hf_models"


def _copy(tmp_path: Path, case: str = "gpt2") -> Path:
    dst = tmp_path / case
    shutil.copytree(MODELS / case, dst)
    return dst


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file written by hand (the format: 8-byte header size, JSON, bytes)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, "<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _refused(folder: Path, *patterns: str) -> str:
    with pytest.raises(PretrainedError) as info:
        load_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_the_reader_agrees_with_the_file_format(tmp_path):
    """A hand-written file reads back exactly (dtype, shape, values), through a memory map."""
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones((4,), np.float32)}
    _write_safetensors(tmp_path / "model.safetensors", tensors)
    files = CheckpointFiles(tmp_path)
    assert files.names() == ["a", "b"] and files.shape("a") == (2, 3)
    np.testing.assert_array_equal(files.get("a"), tensors["a"])
    assert files.unused() == ["b"]


def test_pickled_weights_are_refused_naming_the_file(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    _refused(folder, "pytorch_model.bin", "pickled", "safetensors")


def test_an_index_pointing_outside_the_folder_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "outside.safetensors")
    index = {"weight_map": {"transformer.wte.weight": "../outside.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(folder, "../outside.safetensors", "plain .safetensors file name")


def test_a_sharded_index_loads(tmp_path):
    """The shards an index names are read together (a real sharded layout)."""
    folder = _copy(tmp_path)
    files = CheckpointFiles(folder)
    names = files.names()
    half = len(names) // 2
    parts = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, keys in parts.items():
        _write_safetensors(folder / shard, {k: np.asarray(files.get(k)) for k in keys})
        weight_map |= {k: shard for k in keys}
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    golden = np.load(folder / "golden.npz")
    logits = np.asarray(load_pretrained(folder).model(golden["input_ids"]))
    assert np.abs(logits - golden["logits"]).max() < 1e-4


def test_an_unmapped_tensor_is_refused(tmp_path):
    folder = _copy(tmp_path)
    files = CheckpointFiles(folder)
    tensors = {k: np.asarray(files.get(k)) for k in files.names()}
    tensors["transformer.h.0.attn.extra_scale"] = np.ones((4,), np.float32)
    _write_safetensors(folder / "model.safetensors", tensors)
    _refused(folder, "map to no parameter", "h.0.attn.extra_scale")


def test_a_missing_tensor_is_refused_not_left_random(tmp_path):
    folder = _copy(tmp_path)
    files = CheckpointFiles(folder)
    tensors = {k: np.asarray(files.get(k)) for k in files.names() if "ln_f.bias" not in k}
    _write_safetensors(folder / "model.safetensors", tensors)
    _refused(folder, "gpt2", "no tensor 'ln_f.bias'")


def test_a_shape_mismatch_is_refused_naming_parameter_and_shapes(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, n_positions=128)  # the table in the file has 64 rows
    _refused(folder, "decoder.pe.table", "(128, 32)", "(64, 32)")


def test_absurd_sizes_meet_the_memory_estimate_before_any_allocation(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, n_layer=10**7, n_embd=2**16, n_head=2**10)
    _refused(folder, "gpt2", "need", "is free", "bfloat16")


def test_an_unsupported_architecture_is_refused_listing_the_supported(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, model_type="t5", architectures=["T5ForConditionalGeneration"])
    _refused(folder, "model_type='t5'", "supported", "gpt2", "llama")


@pytest.mark.parametrize(
    ("case", "changes", "pattern"),
    [
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gpt2", {"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
        ("opt", {"word_embed_proj_dim": 16}, "word_embed_proj_dim=16"),
        ("llama", {"head_dim": 16}, "head_dim=16"),
        ("llama", {"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "mrope"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
        ("mpt", {"attn_config": {"alibi": False}}, "alibi"),
        ("mpt", {"expansion_ratio": 2}, "expansion_ratio=2"),
        ("bloom", {"apply_residual_connection_post_layernorm": True}, "post_layernorm"),
        ("gpt2", {"architectures": ["GPT2ForSequenceClassification"]}, "not a causal LM"),
    ],
)
def test_config_fields_the_library_cannot_honour_are_refused(case, changes, pattern):
    config = json.loads((MODELS / case / "config.json").read_text()) | changes
    with pytest.raises(PretrainedError, match=r"^[^\n]*$") as info:
        model_config(config)
    assert pattern in str(info.value)


def test_an_offline_hub_id_says_what_to_download(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    pytest.importorskip("huggingface_hub")
    with pytest.raises(PretrainedError) as info:
        load_pretrained("EleutherAI/pythia-160m")
    message = str(info.value)
    assert "\n" not in message
    assert "EleutherAI/pythia-160m" in message and "download" in message and "HF_HOME" in message


def test_a_hub_cache_snapshot_loads_offline(monkeypatch, tmp_path):
    """A hub id found in the Hugging Face cache (snapshots link to blobs) loads offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    hub = tmp_path / "hf" / "hub" / "models--tiny--gpt2"
    blobs, snap = hub / "blobs", hub / "snapshots" / ("0" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("0" * 40)
    for f in (MODELS / "gpt2").iterdir():
        blob = blobs / f.name
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(blob)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    lm = load_pretrained("tiny/gpt2")
    assert lm.info.revision == "0" * 40 and lm.info.family == "gpt2"


def test_content_hash_reads_files_once_while_their_size_and_time_hold(tmp_path):
    """A run's identity and its loaded model's info hash the same weights: the second asks
    get the first answer while the files keep their sizes and modification times, and a
    file changed (its time moves) is read again."""
    import hashlib
    import os

    from flaxformer_lite.pretrained.files import content_hash

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"first file")
    b.write_bytes(b"second")
    want = "sha256:" + hashlib.sha256(b"first filesecond").hexdigest()
    assert content_hash([a, b]) == want
    stat = a.stat()
    a.write_bytes(b"FIRST FILE")  # same size; its time set back: taken as unchanged
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert content_hash([a, b]) == want
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert content_hash([a, b]) == "sha256:" + hashlib.sha256(b"FIRST FILEsecond").hexdigest()
