"""A Hugging Face checkpoint folder, read as untrusted input (numpy only, no torch).

Nothing in a folder is executed or unpickled: weights come only from safetensors files
(``model.safetensors`` or the shards a ``model.safetensors.index.json`` names), and a folder
that has only pickled PyTorch weights (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) is
refused with one line that names the file. A shard index may name only plain file names
inside the folder (no ``/``, no ``..``). The files themselves may be links, as in the Hugging
Face hub cache, whose ``snapshots/<revision>/`` entries link to ``blobs/<sha256>``.

Reading is lazy: `CheckpointFiles` knows every tensor's name, dtype and shape from the
safetensors headers (a few KB) before any tensor is read, so shapes are checked against the
model config before anything large is allocated.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth", "*.ckpt", "*.bin")
# safetensors dtype names -> numpy dtypes (little-endian); bfloat16 from ml_dtypes, which
# jax depends on
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class PretrainedError(ValueError):
    """A checkpoint folder or config that cannot be loaded; the message is one line."""


# The deepest nesting a model folder's JSON may have (a config.json is 3 or 4 levels deep).
MAX_JSON_DEPTH = 32


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which JSON does not allow (a number must be finite)")


def read_json(path: Path, what: str = "JSON file") -> Any:
    """The JSON value in ``path``, read as untrusted input: one-line `PretrainedError` for an
    unreadable file, invalid JSON, ``NaN`` / ``Infinity`` (not JSON), or nesting deeper than
    `MAX_JSON_DEPTH` (checked without recursion)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        pass  # nested deeper than the parser goes: refused below
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise PretrainedError(f"{path}: not a readable {what} ({e})") from None
    else:
        if json_depth(value) <= MAX_JSON_DEPTH:
            return value
    raise PretrainedError(
        f"{path}: not a usable {what} (nested deeper than {MAX_JSON_DEPTH} levels)"
    )


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]
    return deepest


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict (one-line errors for a missing or bad file,
    `read_json`); the families check each field's type as they read it."""
    path = folder / CONFIG
    if not path.is_file():
        raise PretrainedError(f"{folder}: no {CONFIG} (a Hugging Face model folder has one)")
    config = read_json(path)
    if not isinstance(config, dict):
        raise PretrainedError(f"{path}: must hold a JSON object, not {type(config).__name__}")
    return config


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: ``{name: {dtype, shape, data_offsets}}``, each
    entry checked by shape (an object with a known dtype, a shape of non-negative ints,
    ``data_offsets`` two ints ``0 <= begin <= end`` whose span is exactly the tensor's bytes,
    inside the file), no two tensors sharing bytes (the format forbids overlap), plus
    ``start``: where each tensor's data begins in the file."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            total = path.stat().st_size
            if not 0 < size <= min(total - 8, 100 * 2**20):
                raise PretrainedError(f"{path}: not a safetensors file (header size {size})")
            header = json.loads(f.read(size), parse_constant=_refuse_constant)
    except RecursionError:
        raise PretrainedError(
            f"{path}: not a safetensors file (its header nests too deeply)"
        ) from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError are ValueErrors
        raise PretrainedError(f"{path}: not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise PretrainedError(
            f"{path}: not a safetensors file (its header is a JSON {type(header).__name__}, "
            "not an object)"
        )
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise PretrainedError(f"{path}: __metadata__ must be an object, not {metadata!r:.80}")
    data_size = total - 8 - size
    spans = []
    for name, info in header.items():
        problem = _entry_problem(info, data_size)
        if problem:
            raise PretrainedError(f"{path}: tensor {name!r:.80} {problem}")
        begin, end = info["data_offsets"]
        info["start"] = 8 + size + begin
        if end > begin:
            spans.append((begin, end, name))
    reach, first = 0, None  # the furthest end so far, and whose it is
    for begin, end, name in sorted(spans):
        if begin < reach:
            raise PretrainedError(
                f"{path}: tensors {first!r:.80} and {name!r:.80} share bytes (the safetensors "
                "format forbids overlapping tensors)"
            )
        reach, first = end, name
    return header


def _entry_problem(info: Any, data_size: int) -> str | None:
    """Why a safetensors header entry is not ``{dtype, shape, data_offsets}`` describing
    bytes inside a data section of ``data_size`` bytes (None: it is)."""
    if not isinstance(info, dict):
        return f"is described by a JSON {type(info).__name__}, not an object"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        return f"has dtype {dtype!r:.80}; allowed: {sorted(_DTYPES)}"
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        return f"has shape {shape!r:.80}; a shape is a list of non-negative ints"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(n) for n in offsets)
        or offsets[0] > offsets[1]
    ):
        return f"has data_offsets {offsets!r:.80}; they are two ints [begin, end], begin <= end"
    begin, end = offsets
    nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
    if end - begin != nbytes:
        return f"of {dtype}{shape} needs {nbytes} bytes, its data_offsets span {end - begin}"
    if end > data_size:
        return f"ends at byte {end}, past the file's {data_size} bytes of data"
    return None


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``: ``model.safetensors``, or the shards its index
    names (plain names inside the folder only). Pickled weights alone are refused."""
    if (folder / INDEX).is_file():
        index = read_json(folder / INDEX, "safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, Mapping):
            raise PretrainedError(f"{folder / INDEX}: weight_map must be an object")
        files = []
        for tensor, name in weight_map.items():
            if (
                not isinstance(name, str)
                or not name
                or Path(name).name != name
                or name in (".", "..")
                or not name.endswith(".safetensors")
            ):
                raise PretrainedError(
                    f"{folder / INDEX}: tensor {tensor!r} points to {name!r}; a shard must be a "
                    "plain .safetensors file name inside the model folder"
                )
            if name not in files:
                files.append(name)
        paths = [folder / name for name in files]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise PretrainedError(f"{folder}: the index names missing shard(s) {missing}")
        return paths
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    pickles = sorted({p.name for pattern in PICKLES for p in folder.glob(pattern)})
    if pickles:
        raise PretrainedError(
            f"{folder / pickles[0]}: pickled PyTorch weights are not loaded (unpickling can run "
            "code); use the model's safetensors files (model.safetensors), e.g. from the hub's "
            "safetensors revision or converted with transformers' save_pretrained"
        )
    raise PretrainedError(f"{folder}: no {SINGLE} or {INDEX}")


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    """``name`` without the first of ``prefixes`` it starts with (a model's base prefix)."""
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class TensorIndex:
    """What every checkpoint reader shares (`CheckpointFiles`, `gguf.GGUFCheckpoint`): the
    stored tensors by name (``where``), the names `get` has read (``used``), and the
    one-line refusal of a name it does not hold (``source``: the file or folder it names,
    ``missing``: what it says)."""

    where: dict[str, Any]
    used: set[str]
    source: Path
    missing = "the checkpoint has no tensor"

    def names(self) -> list[str]:
        return sorted(self.where)

    def has(self, name: str) -> bool:
        return name in self.where

    def _check(self, name: str) -> str:
        if name not in self.where:
            raise PretrainedError(f"{self.source}: {self.missing} {name!r}")
        return name

    def unused(self) -> list[str]:
        return sorted(set(self.where) - self.used)

    def location(self, name: str) -> tuple[Path, str]:
        """``(file, name stored there)`` of tensor ``name``, for messages."""
        path, stored = self.where[self._check(name)]
        return path, stored


class CheckpointFiles(TensorIndex):
    """The tensors of a checkpoint, by name, read lazily from its safetensors files.

    ``strip`` prefixes (a model's base prefix such as ``"transformer."``) are removed from
    the stored names, so a family's mapping sees one spelling whether the checkpoint was
    saved from the bare model or the LM head model. `get` records what was read, so the
    loader can refuse a checkpoint with tensors that nothing mapped.
    """

    def __init__(self, folder: Path, *, strip: tuple[str, ...] = ()):
        self.folder = self.source = folder
        self.files = weight_files(folder)
        self.where: dict[str, tuple[Path, str]] = {}
        self.info: dict[str, tuple[str, tuple[int, ...], int]] = {}
        for path in self.files:
            for stored, meta in _header(path).items():
                name = strip_prefix(stored, strip)
                if name in self.where:
                    raise PretrainedError(f"{path}: tensor {name!r} is stored twice")
                self.where[name] = (path, stored)
                self.info[name] = (meta["dtype"], tuple(meta["shape"]), meta["start"])
        self.used: set[str] = set()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info[self._check(name)][1]

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a read-only numpy array mapped from its file (bfloat16 as
        ``ml_dtypes.bfloat16``); nothing is read until the array is used."""
        path, _ = self.where[self._check(name)]
        dtype, shape, start = self.info[name]
        self.used.add(name)
        if not math.prod(shape):
            return np.zeros(shape, _DTYPES[dtype])
        return np.memmap(path, dtype=_DTYPES[dtype], mode="r", offset=start, shape=shape)


def non_finite(files: TensorIndex, parameter: str, value: np.ndarray) -> str:
    """Why ``value`` (parameter ``parameter`` as placed, with a NaN or Inf in it) is refused:
    the first stored tensor read so far that holds a non-finite value, with its file, index
    and value; or, when every stored value is finite, the cast that overflowed."""
    for name in sorted(files.used):
        stored = np.asarray(files.get(name))
        if stored.dtype.kind != "f" and stored.dtype != _DTYPES["BF16"]:
            continue
        bad = ~np.isfinite(stored)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            path, key = files.location(name)
            return (
                f"{path}: tensor {key!r} {tuple(stored.shape)} holds {int(bad.sum())} non-finite "
                f"value(s), the first {stored[index]} at index {index}; a model with NaN or Inf "
                "weights gives no scores"
            )
    index = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
    return (
        f"parameter {parameter} holds {value[index]} at index {index} once cast to "
        f"{value.dtype} (its stored values are out of that dtype's range); load it in a wider "
        "param_dtype"
    )


# content_hash's answers in this process, by the files' paths, sizes and modification times
_HASHED: dict[tuple, str] = {}


def content_hash(paths: list[Path]) -> str:
    """``sha256:<hex>`` over the files' contents in order (the hub cache's blob names are
    the sha256 of each file, so linked blobs are read once more only to be sure). Read once
    per process while the files keep their sizes and modification times (a run's identity
    and its loaded model's info ask for the same files)."""
    key = tuple((str(Path(p).resolve()), *_stat(p)) for p in paths)
    if key in _HASHED:
        return _HASHED[key]
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    _HASHED[key] = "sha256:" + digest.hexdigest()
    return _HASHED[key]


def _stat(path: Path) -> tuple[int, int]:
    info = Path(path).stat()
    return info.st_size, info.st_mtime_ns


def file_stats(folder: Path, paths: list[Path]) -> dict[str, list[int]]:
    """``{name inside folder: [size, mtime_ns]}`` of ``paths`` (links followed, as they are
    read): what a resume compares before hashing the files again (`content_hash`); the names
    are relative, so a folder moved as a whole keeps them."""
    return {str(path.relative_to(folder)): list(_stat(path)) for path in paths}
