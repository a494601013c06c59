"""The on-disk store: atomic builds, torn caches, cache location."""

import numpy as np
import pytest

from flaxformer_lite.data import store


def _documents(root, count=30):
    rng = np.random.default_rng(0)
    docs = []
    for i in range(count):
        path = root / f"f{i:02d}.txt"
        path.write_bytes(rng.integers(0, 256, size=100, dtype=np.uint8).tobytes())
        docs.append(store.Document(path.name, path, store.SPLITS[i % 3]))
    return docs


def _visible(root):
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _hidden(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_cache_root_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "env"))
    assert store.cache_root() == tmp_path / "env"
    assert store.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv(store.CACHE_ENV)
    assert str(store.cache_root()).endswith(".cache/flaxformer_lite")


def test_build_writes_complete_directory(tmp_path):
    (tmp_path / "src").mkdir()
    docs = _documents(tmp_path / "src")
    root = tmp_path / "cache"
    directory, manifest = store.load_or_build(root, "x", docs, meta={"name": "x"})
    assert _visible(root) == [directory.name] and _hidden(root) == []
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json",
        "test.bin",
        "train.bin",
        "validation.bin",
    ]
    assert manifest["splits"]["train"]["num_files"] == 10
    assert manifest["splits"]["train"]["num_bytes"] == 10 * 101
    assert store.read_manifest(directory) == manifest


def test_killed_build_leaves_no_cache_and_next_build_succeeds(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    docs = _documents(tmp_path / "src")
    root = tmp_path / "cache"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill before the rename")

    # A kill runs no cleanup: disable it so the half-written temporary directory stays behind.
    monkeypatch.setattr(store, "_install", killed)
    monkeypatch.setattr(store.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        store.load_or_build(root, "x", docs, meta={})
    assert _visible(root) == []  # no final directory, only a hidden temporary one
    assert len(_hidden(root)) == 1 and ".tmp-" in _hidden(root)[0]
    monkeypatch.undo()
    directory, manifest = store.load_or_build(root, "x", docs, meta={})
    assert _visible(root) == [directory.name]
    assert store.read_manifest(directory) == manifest


def test_torn_cache_is_detected_and_rebuilt(tmp_path):
    (tmp_path / "src").mkdir()
    docs = _documents(tmp_path / "src")
    root = tmp_path / "cache"
    directory, manifest = store.load_or_build(root, "x", docs, meta={})
    good = (directory / "train.bin").read_bytes()
    with open(directory / "train.bin", "r+b") as f:
        f.truncate(len(good) // 2)
    assert store.read_manifest(directory) is None
    again, manifest2 = store.load_or_build(root, "x", docs, meta={})
    assert again == directory and manifest2 == manifest
    assert (directory / "train.bin").read_bytes() == good
    (directory / "manifest.json").write_text("{not json")
    assert store.read_manifest(directory) is None
    store.load_or_build(root, "x", docs, meta={})
    assert (directory / "train.bin").read_bytes() == good
    assert _hidden(root) == []


def test_concurrent_builder_keeps_existing_copy(tmp_path):
    (tmp_path / "src").mkdir()
    docs = _documents(tmp_path / "src")
    directory = tmp_path / "cache" / "x-key"
    store.build_split_files(directory, docs, meta={})
    inode = (directory / "train.bin").stat().st_ino
    store.build_split_files(directory, docs, meta={})  # loses the race: keeps the first copy
    assert (directory / "train.bin").stat().st_ino == inode
    store.build_split_files(directory, docs, meta={}, replace=True)
    assert (directory / "train.bin").stat().st_ino != inode
    assert _hidden(directory.parent) == []


def test_changed_input_gets_new_directory(tmp_path):
    (tmp_path / "src").mkdir()
    docs = _documents(tmp_path / "src")
    root = tmp_path / "cache"
    first, _ = store.load_or_build(root, "x", docs, meta={})
    docs[0].path.write_bytes(b"changed contents, different size")
    second, manifest = store.load_or_build(root, "x", docs, meta={})
    assert first != second
    assert (
        manifest["splits"]["train"]["num_bytes"]
        == 9 * 101 + len(b"changed contents, different size") + 1
    )
