"""Byte-level corpora (vocabulary 256, no tokenizer): splits, memory-mapping, batches, provenance.

A `ByteCorpus` has three `Split`s ("train", "validation", "test"), each a read-only uint8
`np.memmap` (or a slice of one), so corpora of gigabytes never load into RAM. Bytes are never
decoded: any file, UTF-8 or not, is a valid corpus.

Split rules (`ByteCorpus.from_path`):
* **one file**: contiguous byte ranges, by default the first 90 % of the bytes for train, the next
  5 % for validation, the last 5 % for test (boundaries `round(n * 0.9)`, `round(n * 0.95)`; for
  enwik8's 10^8 bytes this is the standard 90M / 5M / 5M split).
* **a folder or a list of files**: by file. A file goes to the split picked by the first 8 bytes of
  `sha256(relative name)` read as a big-endian integer `h`: train if `h / 2^64 < 0.9`, validation if
  `< 0.95`, else test (`split_for_name`). The rule depends on the name only, so adding or removing
  a file never moves another one. The files of a split are concatenated, each followed by the
  separator byte `store.SEPARATOR` (0x00), into one cached file per split (see `store`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from flaxformer_lite.base.checks import check_positive_int
from flaxformer_lite.data import store, windows

SPLITS = store.SPLITS
DEFAULT_FRACTIONS = (0.90, 0.05, 0.05)
VOCAB_SIZE = 256


def split_for_name(name: str, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
    """The split of a file in a by-file split, from its relative name alone (module docstring)."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < fractions[0]:
        return "train"
    if u < fractions[0] + fractions[1]:
        return "validation"
    return "test"


def check_fractions(split) -> tuple[float, float, float]:
    """Checks `split` = (train, validation, test) fractions: three positive numbers summing to 1."""
    try:
        fractions = tuple(float(f) for f in split)
    except (TypeError, ValueError):
        fractions = ()
    if len(fractions) != 3 or min(fractions) <= 0 or not math.isclose(sum(fractions), 1.0):
        raise ValueError(
            f"split must be three positive fractions (train, validation, test) summing to 1, "
            f"e.g. {DEFAULT_FRACTIONS}; got {split!r}"
        )
    return fractions


class Split:
    """One split of a corpus: token ids, each with the bytes of text it covers.

    A byte corpus is its own tokenizer: every token is one byte of the split and covers that
    byte (the 0x00 separators between documents too: a byte model predicts them). A split
    tokenized by a model's tokenizer (`flaxformer_lite.data.tokens.TokenCorpus`) gives, per
    token, the bytes of text it covers (``token_bytes``), the byte offset of its first byte
    (``token_offset``) and whether it is a target at all (``scored``: False for the separator
    token joining documents, which covers no text). So bits per byte has one formula for every
    split -- summed ``-log2 p`` over the bytes the scored tokens cover -- and statistics blocks
    are byte ranges of the same text for every tokenizer.

    Attributes:
      name: "train", "validation" or "test".
      corpus: name of the corpus it belongs to (for error messages).
      data: the token ids ``[num_tokens]`` (uint8 bytes of a byte corpus, usually a read-only
        `np.memmap`; int32 ids of a tokenized split).
      num_files: number of documents in the split.
      token_bytes, token_offset, scored: int64 / int64 / bool ``[num_tokens]``, or None for a
        byte corpus (each token is one byte at its own offset, every token scored).
      num_text_bytes: bytes of text of the split (a byte corpus: ``num_tokens``).
      document_ends: int64 ``[documents - 1]``, a tokenized split's position of the token
        that ends each document but the last (its separator); None: every unscored token
        (a byte corpus: every 0x00).
    """

    def __init__(
        self,
        data: np.ndarray,
        *,
        name: str,
        corpus: str,
        num_files: int,
        token_bytes: np.ndarray | None = None,
        token_offset: np.ndarray | None = None,
        scored: np.ndarray | None = None,
        num_text_bytes: int | None = None,
        document_ends: np.ndarray | None = None,
    ) -> None:
        self.data = data
        self.name = name
        self.corpus = corpus
        self.num_files = num_files
        arrays = (token_bytes, token_offset, scored)
        if any(a is None for a in arrays) and not all(a is None for a in arrays):
            raise ValueError("token_bytes, token_offset and scored are given together or not")
        self.token_bytes, self.token_offset, self.scored = arrays
        self.num_text_bytes = self.num_tokens if num_text_bytes is None else int(num_text_bytes)
        # `document_of`'s, found on first use unless given
        self._separators = None if document_ends is None else np.asarray(document_ends, np.int64)
        self._text_end: np.ndarray | None = None  # `tokens_within`'s, found on first use
        self._key_targets: dict[tuple, np.ndarray] = {}  # `context_key_targets`'s

    @property
    def is_bytes(self) -> bool:
        """Whether the tokens are the bytes themselves (a byte corpus)."""
        return self.token_bytes is None

    @property
    def num_tokens(self) -> int:
        return int(self.data.shape[0])

    @property
    def unit(self) -> str:
        """What one position of ``data`` is: "bytes" or "tokens" (for messages)."""
        return "bytes" if self.is_bytes else "tokens"

    def _separator_positions(self) -> np.ndarray:
        """Positions in ``data`` of the separators that end each document, ascending (none
        for a split of one document)."""
        if not self.is_bytes:
            return np.flatnonzero(~np.asarray(self.scored, bool))
        if self.num_files <= 1:
            return np.zeros(0, np.int64)
        return np.flatnonzero(np.asarray(self.data) == store.SEPARATOR)

    def document_of(self, positions: np.ndarray) -> np.ndarray:
        """The document (file) index of each position of ``data`` (int ``[...]``, the shape of
        ``positions``): the number of separators before it, so document ``k`` is its tokens
        and the separator after them. Evaluation blocks record the document of their first
        target: files, not blocks, are the sampling unit of the statistics
        (`flaxformer_lite.results.stats`)."""
        if self._separators is None:
            self._separators = self._separator_positions()
        return np.searchsorted(self._separators, np.asarray(positions, np.int64), side="left")

    def __repr__(self) -> str:
        if self.is_bytes:
            return f"Split({self.corpus!r}, {self.name!r}, bytes={self.num_tokens})"
        return (
            f"Split({self.corpus!r}, {self.name!r}, tokens={self.num_tokens}, "
            f"text_bytes={self.num_text_bytes})"
        )

    def require(self, length: int, *, limit: int | None = None, what: str = "a window") -> None:
        """Raises a ValueError unless the split (or its first ``limit`` tokens) has
        ``length + 1`` tokens."""
        have = self.num_tokens if limit is None else limit
        if have < length + 1:
            scope = "" if limit is None else " (limited by max_bytes)"
            raise ValueError(
                f"split {self.name!r} of corpus {self.corpus!r} has {have} {self.unit}{scope}; "
                f"{what} of length={length} needs at least {length + 1} {self.unit} (length + 1 "
                f"for the shifted targets). Use a shorter length or a larger corpus."
            )

    def tokens_within(self, max_bytes: int) -> int:
        """How many leading tokens of the split score ``max_bytes`` bytes of text. A byte
        corpus: ``max_bytes + 1`` (targets: bytes ``1 .. max_bytes``; byte 0 has no context);
        a tokenized split, which starts with a context token: the tokens whose text ends
        within the first ``max_bytes`` bytes (targets: bytes ``0 .. max_bytes - 1``, exactly
        those for every tokenizer when it was tokenized with a boundary there:
        `flaxformer_lite.data.tokens.TokenCorpus` ``cut_bytes``)."""
        max_bytes = check_positive_int("max_bytes", max_bytes)
        if self.is_bytes:
            return min(max_bytes + 1, self.num_tokens)
        if self._text_end is None:
            ends = np.asarray(self.token_offset, np.int64) + np.asarray(self.token_bytes, np.int64)
            self._text_end = np.maximum.accumulate(ends) if ends.size else ends
        return int(np.searchsorted(self._text_end, max_bytes, side="right"))

    def sample_batch(
        self, rng: np.random.Generator, batch_size: int, length: int
    ) -> dict[str, np.ndarray]:
        """A training batch of random windows of `length + 1` tokens.

        Returns `inputs` int32 `[batch_size, length]`, `targets` int32 `[batch_size, length]`
        (`targets[:, t] == inputs[:, t + 1]`), `loss_mask` float32 `[batch_size, length]` (ones).
        Deterministic given the state of `rng`, which it advances.
        """
        windows.check_generator(rng)
        batch_size = check_positive_int("batch_size", batch_size)
        length = check_positive_int("length", length)
        self.require(length, what="a training window")
        return windows.sample_windows(self.data, rng, batch_size, length)

    def _eval_plan(self, length, stride, max_bytes, max_windows) -> tuple[np.ndarray, int, int]:
        length = check_positive_int("length", length)
        stride = length if stride is None else check_positive_int("stride", stride)
        if stride > length:
            raise ValueError(
                f"stride must be between 1 and length={length} (a larger stride would skip "
                f"tokens), got stride={stride}"
            )
        data = self.data
        if max_bytes is not None:
            data = data[: self.tokens_within(max_bytes)]
        self.require(
            length,
            limit=None if data.shape[0] == self.num_tokens else data.shape[0],
            what="an evaluation window",
        )
        count = windows.num_windows(data.shape[0], length, stride)
        if max_windows is not None:
            count = min(count, check_positive_int("max_windows", max_windows))
        return data, stride, count

    def num_eval_windows(
        self,
        length: int,
        *,
        stride: int | None = None,
        max_bytes: int | None = None,
        max_windows: int | None = None,
    ) -> int:
        """How many windows `eval_windows` yields for these arguments."""
        return self._eval_plan(length, stride, max_bytes, max_windows)[2]

    def _targets(self, batch: dict[str, np.ndarray], positions: np.ndarray) -> dict:
        """``batch`` with what its targets are, for target positions ``[b, L]`` of ``data``:
        ``target_position`` (int64: the position, for the document of a block),
        ``target_offset`` (int64: the byte offset of its text, for statistics blocks) and
        ``target_bytes`` (float32: the bytes of text it covers; 0 where not scored); a
        separator of a tokenized split is dropped from ``loss_mask``."""
        n = self.num_tokens
        inside = (positions >= 0) & (positions < n)
        safe = np.clip(positions, 0, max(n - 1, 0))
        mask = batch["loss_mask"]
        if self.is_bytes:
            offset = np.where(inside, positions, 0)
            nbytes = mask
        else:
            mask = mask * (np.asarray(self.scored)[safe] & inside)
            offset = np.where(inside, np.asarray(self.token_offset)[safe], 0)
            nbytes = np.where(mask > 0, np.asarray(self.token_bytes)[safe], 0)
        return dict(
            batch,
            loss_mask=mask.astype(np.float32),
            target_position=np.where(inside, positions, 0).astype(np.int64),
            target_offset=offset.astype(np.int64),
            target_bytes=np.asarray(nbytes, np.float32),
        )

    def eval_batches(
        self,
        length: int,
        batch_size: int,
        *,
        stride: int | None = None,
        max_bytes: int | None = None,
        max_windows: int | None = None,
        pad_batch: bool = False,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Evaluation windows in batches: dicts of `inputs`, `targets` int32 `[b, length]`,
        `loss_mask` float32 `[b, length]` and what each target is (`target_position`,
        `target_offset`, `target_bytes`: `_targets`); `b = batch_size` except possibly for the
        last batch.

        The protocols (non-overlapping for `stride=None`, sliding window for `stride < length`)
        and the exact coverage guarantee are described in `flaxformer_lite.data.windows`: over all
        batches, the scored targets (`loss_mask == 1`) are the tokens at positions
        `1 .. n-1` of the split (or of its tokens that score its first `max_bytes` bytes of
        text: `tokens_within`), each exactly once. `max_windows` keeps only the first windows
        (then a prefix of those positions is scored). `pad_batch=True` fills the last batch up
        to `batch_size` with all-zero rows (loss_mask 0), so every batch has the same shape.
        Arguments are checked when this is called, not when the first batch is drawn.
        """
        batch_size = check_positive_int("batch_size", batch_size)
        data, stride, count = self._eval_plan(length, stride, max_bytes, max_windows)
        return self._iter_batches(data, int(length), stride, count, batch_size, pad_batch)

    def _iter_batches(self, data, length, stride, count, batch_size, pad_batch):
        for first in range(0, count, batch_size):
            ids = np.arange(first, min(first + batch_size, count))
            batch = windows.window_arrays(data, ids, length, stride)
            short = batch_size - ids.shape[0]
            if pad_batch and short:
                batch = {
                    k: np.concatenate([v, np.zeros((short, length), v.dtype)])
                    for k, v in batch.items()
                }
            rows = first + np.arange(batch["inputs"].shape[0])
            positions = rows[:, None] * stride + np.arange(1, length + 1)[None, :]
            yield self._targets(batch, positions)

    def context_starts(self, *, max_context: int, block: int, blocks: int) -> np.ndarray:
        """First target positions of the context protocol's target blocks
        (`windows.context_block_starts`): the same for every context length."""
        return windows.context_block_starts(
            self.num_tokens, max_context=max_context, block=block, blocks=blocks
        )

    def context_key_targets(
        self, starts: np.ndarray, *, block: int, near: int, far: int
    ) -> np.ndarray:
        """`windows.copy_key_targets` of this split (bool ``[blocks, block]``), computed once
        per set of blocks: every context length of a study asks for the same."""
        starts = np.asarray(starts, np.int64)
        key = (starts.tobytes(), block, near, far)
        if key not in self._key_targets:
            self._key_targets[key] = windows.copy_key_targets(
                self.data, starts, block=block, near=near, far=far
            )
        return self._key_targets[key]

    def context_batches(
        self, starts: np.ndarray, context: int, block: int, batch_size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """Context-protocol windows (`windows.context_window_arrays`) in batches of
        ``batch_size`` (the last one padded with all-zero rows, loss_mask 0), with what each
        target is (`_targets`)."""
        check_positive_int("context", context)
        check_positive_int("block", block)
        batch_size = check_positive_int("batch_size", batch_size)
        starts = np.asarray(starts, np.int64)
        length = context + block - 1
        for first in range(0, starts.shape[0], batch_size):
            rows = starts[first : first + batch_size]
            batch = windows.context_window_arrays(self.data, rows, context, block)
            short = batch_size - rows.shape[0]
            if short:
                batch = {
                    k: np.concatenate([v, np.zeros((short, v.shape[1]), v.dtype)])
                    for k, v in batch.items()
                }
                rows = np.concatenate([rows, np.full(short, context)])
            positions = (rows - context + 1)[:, None] + np.arange(length)[None, :]
            yield self._targets(batch, positions)

    def eval_windows(
        self,
        length: int,
        *,
        stride: int | None = None,
        max_windows: int | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The windows of `eval_batches` one at a time: dicts of `inputs`, `targets` int32
        `[length]`, `loss_mask` float32 `[length]` and the targets' `target_*` fields. Same
        protocols and guarantee."""
        batches = self.eval_batches(
            length, 256, stride=stride, max_bytes=max_bytes, max_windows=max_windows
        )
        return (
            {k: v[i] for k, v in batch.items()}
            for batch in batches
            for i in range(batch["inputs"].shape[0])
        )


def _memmap(path: Path) -> np.ndarray:
    return np.memmap(path, dtype=np.uint8, mode="r")


class ByteCorpus:
    """A byte-level corpus with "train", "validation" and "test" splits.

    Build one with `ByteCorpus.from_path`, `ByteCorpus.from_split_files`, `stdlib_corpus` or
    `get_corpus(name)`. `provenance()` says exactly which bytes it holds.
    """

    vocab_size: int = VOCAB_SIZE

    def __init__(
        self,
        name: str,
        splits: Mapping[str, Split],
        *,
        info: dict,
        hash_files: Sequence[tuple[str, Path]] | None = None,
    ) -> None:
        """Low-level constructor. `info` is the provenance; if it lacks "sha256", it is computed
        on the first `provenance()` call from `hash_files` (ordered `(name, path)` pairs)."""
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"splits must contain {SPLITS}; missing {missing}")
        for split in splits.values():
            if split.num_tokens == 0:
                raise ValueError(
                    f"split {split.name!r} of corpus {name!r} is empty (0 bytes); every split "
                    f"needs data"
                )
        self.name = name
        self._splits = dict(splits)
        self._info = dict(info)
        self._hash_files = hash_files

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={self._splits[s].num_tokens}" for s in SPLITS)
        return f"ByteCorpus({self.name!r}, {sizes})"

    def split(self, name: str) -> Split:
        """The split called `name`, one of "train", "validation", "test"."""
        if name not in self._splits:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        return self._splits[name]

    def provenance(self) -> dict:
        """What the corpus is: name, sha256 content hash (see `store`), total num_bytes and
        num_files, per split num_bytes and num_files, the split rule, the separator byte (None
        for a single document per split), the source, plus corpus-specific fields (e.g.
        python_version for the stdlib corpus). Computing the hash reads the files once (cached)."""
        if "sha256" not in self._info:
            self._info["sha256"] = store.content_sha256(self._hash_files or [])
        info = dict(self._info)
        info["splits"] = {s: dict(v) for s, v in info["splits"].items()}
        return info

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_cache_dir(cls, directory: Path, manifest: dict, *, name: str, **info) -> ByteCorpus:
        """A corpus stored by `store.build_split_files` in `directory`."""
        splits = {
            s: Split(
                _memmap(directory / f"{s}.bin")
                if manifest["splits"][s]["num_bytes"]
                else np.zeros(0, np.uint8),
                name=s,
                corpus=name,
                num_files=manifest["splits"][s]["num_files"],
            )
            for s in SPLITS
        }
        recorded = ("sha256", "num_bytes", "num_files", "splits", "separator", "format_version")
        full = {"name": name, **{k: manifest[k] for k in recorded}, "cache_dir": str(directory)}
        return cls(name, splits, info=full | info)

    @classmethod
    def from_split_files(
        cls, files: Mapping[str, str | os.PathLike], *, name: str, **info
    ) -> ByteCorpus:
        """A corpus whose splits are given as one file each, e.g.
        `{"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}`.
        Each file is memory-mapped as is (one document, no separator)."""
        paths = {}
        for s in SPLITS:
            if s not in files:
                raise ValueError(f"files must map each of {list(SPLITS)} to a file; missing {s!r}")
            paths[s] = Path(files[s]).expanduser()
            if not paths[s].is_file():
                raise FileNotFoundError(f"files[{s!r}]: no such file: {paths[s]}")
            if paths[s].stat().st_size == 0:
                raise ValueError(f"files[{s!r}]: empty corpus file (0 bytes): {paths[s]}")
        splits = {s: Split(_memmap(p), name=s, corpus=name, num_files=1) for s, p in paths.items()}
        full = {
            "name": name,
            "num_bytes": sum(sp.num_tokens for sp in splits.values()),
            "num_files": len(SPLITS),
            "splits": {s: {"num_bytes": sp.num_tokens, "num_files": 1} for s, sp in splits.items()},
            "split_rule": "one file per split",
            "separator": None,
            "source": {s: str(p) for s, p in paths.items()},
        }
        full.update(info)
        hash_files = [(paths[s].name, paths[s]) for s in SPLITS]
        return cls(name, splits, info=full, hash_files=hash_files)

    @classmethod
    def from_path(
        cls,
        path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        split: Sequence[float] = DEFAULT_FRACTIONS,
        name: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        rebuild: bool = False,
    ) -> ByteCorpus:
        """A corpus from one file, a folder, or a list of files (split rules: module docstring).

        Args:
          path_or_paths: a file (split by contiguous byte ranges, memory-mapped in place), a
            folder (every non-hidden regular file below it, sorted by relative path, split by
            file), or a list of files (in the given order, names relative to their common parent,
            split by file).
          split: (train, validation, test) fractions, of bytes for one file, of the hash range
            for several files.
          name: corpus name for provenance and messages (default: the file or folder name).
          cache_dir: cache root for the concatenated split files of a multi-file corpus
            (default `$FLAXFORMER_LITE_CACHE` or `~/.cache/flaxformer_lite`).
          rebuild: rebuild the cached split files even if they look complete.
        """
        fractions = check_fractions(split)
        if isinstance(path_or_paths, str | os.PathLike):
            path = Path(path_or_paths).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"path_or_paths: no such file or directory: {path}")
            if path.is_file():
                return cls._from_file(path, fractions, name or path.name)
            documents = _folder_documents(path, fractions)
            source = str(path)
            name = name or path.name
        else:
            paths = [Path(p).expanduser() for p in path_or_paths]
            if not paths:
                raise ValueError("path_or_paths: empty list of files; give at least one file")
            for p in paths:
                if not p.is_file():
                    kind = "is a directory, not a file" if p.is_dir() else "no such file"
                    raise FileNotFoundError(f"path_or_paths: {kind}: {p}")
            if len(set(map(os.path.abspath, paths))) != len(paths):
                raise ValueError(f"path_or_paths: the list names a file twice: {paths}")
            if len(paths) == 1:
                return cls._from_file(paths[0], fractions, name or paths[0].name)
            absolute = [Path(os.path.abspath(p)) for p in paths]
            parent = Path(os.path.commonpath(absolute))
            rel = [a.relative_to(parent).as_posix() for a in absolute]
            documents = [
                store.Document(r, p, split_for_name(r, fractions))
                for r, p in zip(rel, paths, strict=True)
            ]
            source = [str(p) for p in paths]
            name = name or parent.name or "files"
        return cls.from_documents(
            documents,
            name=name,
            fractions=fractions,
            cache_dir=cache_dir,
            rebuild=rebuild,
            info={"source": source},
        )

    @classmethod
    def _from_file(cls, path: Path, fractions, name: str) -> ByteCorpus:
        n = path.stat().st_size
        if n == 0:
            raise ValueError(f"path_or_paths: empty corpus file (0 bytes): {path}")
        a = round(n * fractions[0])
        b = round(n * (fractions[0] + fractions[1]))
        if not 0 < a < b < n:
            raise ValueError(
                f"path_or_paths: file {path} has {n} bytes, too few to split into non-empty "
                f"train/validation/test byte ranges with split={fractions}"
            )
        data = _memmap(path)
        bounds = {"train": (0, a), "validation": (a, b), "test": (b, n)}
        splits = {
            s: Split(data[lo:hi], name=s, corpus=name, num_files=1)
            for s, (lo, hi) in bounds.items()
        }
        info = {
            "name": name,
            "num_bytes": n,
            "num_files": 1,
            "splits": {
                s: {"num_bytes": hi - lo, "num_files": 1, "byte_range": [lo, hi]}
                for s, (lo, hi) in bounds.items()
            },
            "split_rule": f"contiguous bytes, fractions {list(fractions)}",
            "separator": None,
            "source": str(path),
        }
        return cls(name, splits, info=info, hash_files=[(path.name, path)])

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[store.Document],
        *,
        name: str,
        fractions: Sequence[float] | None,
        cache_dir: str | os.PathLike | None,
        rebuild: bool,
        info: dict,
        prefix: str | None = None,
        split_rule: str | None = None,
    ) -> ByteCorpus:
        """A multi-file corpus whose documents already carry their split: concatenated into one
        cached file per split under `cache_dir` (directory `<prefix>-<key>`) and memory-mapped.
        `split_rule` (default: the by-file hash rule with `fractions`) goes into provenance."""
        total = sum(d.path.stat().st_size for d in documents)
        if not documents or total == 0:
            raise ValueError(
                f"empty corpus {name!r}: {len(documents)} files with {total} bytes in all "
                f"(source: {info.get('source')})"
            )
        if split_rule is None:
            split_rule = f"by file: sha256(relative name)[:8] / 2^64 vs fractions {list(fractions)}"
        counts = {s: sum(d.split == s for d in documents) for s in SPLITS}
        for s, c in counts.items():
            if c == 0:
                raise ValueError(
                    f"split {s!r} of corpus {name!r} would be empty: the split rule ({split_rule}) "
                    f"assigned none of its {len(documents)} files to it; use more files, or a "
                    f"single file to split by bytes"
                )
        meta = {"name": name, "split_rule": split_rule}
        prefix = prefix or "files-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "corpus")
        directory, manifest = store.load_or_build(
            store.cache_root(cache_dir), prefix, documents, meta=meta, rebuild=rebuild
        )
        return cls.from_cache_dir(directory, manifest, name=name, split_rule=split_rule, **info)


def _folder_documents(folder: Path, fractions) -> list[store.Document]:
    """Every non-hidden regular file under `folder`, sorted by relative POSIX path."""
    names = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            p = Path(dirpath) / f
            if not f.startswith(".") and p.is_file():
                names.append(p.relative_to(folder).as_posix())
    if not names:
        raise ValueError(f"path_or_paths: empty corpus: folder {folder} contains no files")
    return [store.Document(n, folder / n, split_for_name(n, fractions)) for n in sorted(names)]
