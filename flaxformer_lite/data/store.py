"""On-disk byte store: cache location, content hashing and atomic split files.

A multi-file corpus is stored as one contiguous file per split, so that it can be memory-mapped
with `np.memmap` and never loaded into RAM:

    <cache root>/<prefix>-<key>/
        train.bin  validation.bin  test.bin   documents in order, each followed by SEPARATOR
        manifest.json                          byte/file counts and sha256 of every split file

`key` is a fingerprint of the inputs (relative names, sizes, mtimes, split of each file and this
layout's version), so a changed input gets a fresh directory. A build writes into a hidden temporary
directory next to the final one and renames it into place only when every file (manifest last) has
been written and fsync-ed: a killed process leaves at most a `.<name>.tmp-*` directory, never a torn
cache.

Content hash (`content_sha256`): sha256 over the ordered file list, where each file contributes
`len(name) (8 bytes, little-endian) | name (UTF-8) | len(data) (8 bytes, little-endian) | data`.
The length prefixes make the encoding unambiguous (no two different file lists hash alike by
shifting bytes between a name and its data).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
"""The split names every corpus has, in storage order."""

SEPARATOR = 0x00
"""Byte written after every document of a multi-file corpus (NUL: Python source never contains it;
the compiler rejects it). A single-file corpus is one document and gets no separator."""

CACHE_ENV = "FLAXFORMER_LITE_CACHE"
"""Environment variable that overrides the default cache root `~/.cache/flaxformer_lite`."""

FORMAT_VERSION = 1
"""Version of the on-disk layout; part of every cache key."""

_CHUNK = 1 << 20


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: `cache_dir` if given, else `$FLAXFORMER_LITE_CACHE`, else
    `~/.cache/flaxformer_lite`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "flaxformer_lite"


@dataclass(frozen=True)
class Document:
    """One input file of a multi-file corpus: its relative `name`, `path` on disk and `split`."""

    name: str
    path: Path
    split: str


class ContentHasher:
    """Incremental `content_sha256`: call `add(name, size)` then `update(chunk)` for each file."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, name: str, size: int) -> None:
        encoded = name.encode("utf-8", "surrogateescape")
        self._h.update(len(encoded).to_bytes(8, "little"))
        self._h.update(encoded)
        self._h.update(int(size).to_bytes(8, "little"))

    def update(self, chunk: bytes) -> None:
        self._h.update(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _read_chunks(path: Path, size: int) -> Iterable[bytes]:
    """Yields the bytes of `path` and checks that exactly `size` bytes were read."""
    seen = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            seen += len(chunk)
            yield chunk
    if seen != size:
        raise RuntimeError(
            f"file {path} changed while being read: expected {size} bytes, read {seen}"
        )


_HASHED: dict[tuple, str] = {}  # content_sha256 of files unchanged since, in this process


def content_sha256(files: Sequence[tuple[str, Path]]) -> str:
    """sha256 over an ordered list of `(relative name, path)` (see module docstring).

    Remembered for this process while every file keeps its size, mtime and inode, so a
    study that opens the corpus once per cell reads it once."""
    key = []
    for name, path in files:
        st = Path(path).stat()
        key.append((name, os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino))
    key = tuple(key)
    if key not in _HASHED:
        _HASHED[key] = _content_sha256(files)
    return _HASHED[key]


def _content_sha256(files: Sequence[tuple[str, Path]]) -> str:
    hasher = ContentHasher()
    for name, path in files:
        size = Path(path).stat().st_size
        hasher.add(name, size)
        for chunk in _read_chunks(Path(path), size):
            hasher.update(chunk)
    return hasher.hexdigest()


def fingerprint(documents: Sequence[Document], extra: dict) -> str:
    """Cache key: sha256 of names, sizes, mtimes and splits of `documents`, plus `extra`."""
    rows = []
    for doc in documents:
        st = doc.path.stat()
        rows.append([doc.name, st.st_size, st.st_mtime_ns, doc.split])
    payload = json.dumps(
        {"format_version": FORMAT_VERSION, "separator": SEPARATOR, "files": rows, "extra": extra},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8", "surrogateescape")).hexdigest()


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a complete cache directory, or None when it is missing or inconsistent
    (a split file whose size differs from the manifest counts as inconsistent)."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        for split in SPLITS:
            expected = manifest["splits"][split]["num_bytes"]
            if (directory / f"{split}.bin").stat().st_size != expected:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest


def build_split_files(
    directory: Path, documents: Sequence[Document], *, meta: dict, replace: bool = False
) -> dict:
    """Atomically writes `directory` with one contiguous file per split; returns its manifest.

    Documents are appended to their split's file in the given order, each followed by one
    SEPARATOR byte. The manifest records `meta`, the corpus content hash (over all documents in
    the given order), and per split: num_bytes, num_files and the sha256 of the split file.
    An existing complete `directory` is kept (another process built it) unless `replace`.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        outs = {s: open(tmp / f"{s}.bin", "wb") for s in SPLITS}
        split_hash = {s: hashlib.sha256() for s in SPLITS}
        stats = {s: {"num_bytes": 0, "num_files": 0} for s in SPLITS}
        content = ContentHasher()
        sep = bytes([SEPARATOR])
        try:
            for doc in documents:
                size = doc.path.stat().st_size
                content.add(doc.name, size)
                out, h = outs[doc.split], split_hash[doc.split]
                for chunk in _read_chunks(doc.path, size):
                    content.update(chunk)
                    h.update(chunk)
                    out.write(chunk)
                out.write(sep)
                h.update(sep)
                stats[doc.split]["num_bytes"] += size + 1
                stats[doc.split]["num_files"] += 1
            for out in outs.values():
                out.flush()
                os.fsync(out.fileno())
        finally:
            for out in outs.values():
                out.close()
        manifest = dict(meta)
        manifest.update(
            format_version=FORMAT_VERSION,
            separator=SEPARATOR,
            sha256=content.hexdigest(),
            num_files=len(documents),
            num_bytes=sum(v["num_bytes"] for v in stats.values()),
            splits={s: dict(stats[s], sha256=split_hash[s].hexdigest()) for s in SPLITS},
        )
        # The manifest is written last: a directory with a valid manifest is complete.
        with open(tmp / "manifest.json", "w") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        _install(tmp, directory, replace=replace)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _install(tmp: Path, directory: Path, *, replace: bool) -> None:
    """Renames the finished `tmp` onto `directory`, replacing an old one if it is inconsistent or
    `replace`."""
    try:
        os.rename(tmp, directory)
        return
    except OSError:
        if not directory.exists():
            raise
    if not replace and read_manifest(directory) is not None:
        return  # another process finished the same build first; keep its copy
    stale = Path(tempfile.mkdtemp(prefix=f".{directory.name}.stale-", dir=directory.parent))
    os.rename(directory, stale / "old")
    shutil.rmtree(stale, ignore_errors=True)
    os.rename(tmp, directory)


def load_or_build(
    root: Path, prefix: str, documents: Sequence[Document], *, meta: dict, rebuild: bool = False
) -> tuple[Path, dict]:
    """The cache directory for `documents` under `root` (built if missing, inconsistent or
    `rebuild`) and its manifest."""
    key = fingerprint(documents, meta)[:16]
    directory = root / f"{prefix}-{key}"
    manifest = None if rebuild else read_manifest(directory)
    if manifest is None:
        manifest = build_split_files(directory, documents, meta=meta, replace=True)
    return directory, manifest
