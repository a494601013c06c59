"""Per-block sums of an evaluation, kept so that every statistic can be recomputed from data.

The targets of an evaluation set are grouped into fixed blocks (corpus: ``size`` consecutive
target bytes of the split, e.g. 1024; the context protocol: groups of its target blocks;
tasks: groups of examples). Every cell records, per block, the summed loss (nats), the
number of correct argmax predictions, the number of scored targets and, for tasks, of exact
matches and examples. Blocks are the same for every encoding and seed of a study, so
comparisons can be paired over seeds *and* data (`flaxformer_lite.results.stats`).

Corpus blocks also record ``file``: the document (file) of the split that holds the block's
first target (`flaxformer_lite.data.corpus.Split.document_of`). Blocks of one file are
correlated (the same code, the same style), so the statistics resample files, each with all
its blocks, rather than blocks one by one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

DEFAULT_BLOCK_TOKENS = 1024  # target bytes per statistics block (corpus protocols)
DEFAULT_BLOCK_EXAMPLES = 8  # examples per statistics block (tasks)
# "bytes": the UTF-8 bytes the scored tokens cover (tokenized corpora; for byte-level models
# every target is one byte and "count" is the bytes)
# "key_*": the context protocol's key targets only (`evaluation.protocols.Context.key_near`)
FIELDS = (
    "loss",
    "correct",
    "count",
    "bytes",
    "exact",
    "examples",
    "key_loss",
    "key_count",
    "key_bytes",
)


class BlockSums:
    """Sums per block, grown as blocks appear; `to_dict` gives plain lists for JSON."""

    def __init__(self, size: int, unit: str):
        self.size, self.unit = int(size), unit
        self.sums = {f: np.zeros(0, np.float64) for f in FIELDS}
        self.added: set[str] = set()  # fields measured (an all-zero one is still a measurement)
        self.first = np.zeros(0, np.int64)  # per block: its smallest target position

    def _grow(self, n: int) -> None:
        for f, a in self.sums.items():
            if a.shape[0] < n:
                self.sums[f] = np.concatenate([a, np.zeros(n - a.shape[0], np.float64)])
        if self.first.shape[0] < n:
            tail = np.full(n - self.first.shape[0], np.iinfo(np.int64).max, np.int64)
            self.first = np.concatenate([self.first, tail])

    def add(self, field: str, block_ids: np.ndarray, values: np.ndarray) -> None:
        """Add ``values`` (any shape) into the blocks ``block_ids`` (same shape, int >= 0)."""
        block_ids = np.asarray(block_ids, np.int64).reshape(-1)
        values = np.asarray(values, np.float64).reshape(-1)
        self.added.add(field)
        if block_ids.size:
            self._grow(int(block_ids.max()) + 1)
            np.add.at(self.sums[field], block_ids, values)

    def note_positions(self, block_ids: np.ndarray, positions: np.ndarray) -> None:
        """Record target ``positions`` (split positions, same shape as ``block_ids``) so that
        `to_dict` can name the file of each block's first target."""
        block_ids = np.asarray(block_ids, np.int64).reshape(-1)
        positions = np.asarray(positions, np.int64).reshape(-1)
        if block_ids.size:
            self._grow(int(block_ids.max()) + 1)
            np.minimum.at(self.first, block_ids, positions)

    def to_dict(self, document_of: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
        """Plain lists for JSON: ``size``, ``unit``, every measured field (zeros included: a
        task nobody solved has "exact" all 0) and, given ``document_of`` (a split's
        `~flaxformer_lite.data.corpus.Split.document_of`) and noted positions, ``file``:
        the file of each block's first target (-1 for a block with no target)."""
        used = [f for f in FIELDS if f in self.added] or ["count"]
        out = {"size": self.size, "unit": self.unit} | {
            f: [float(v) for v in self.sums[f]] for f in used
        }
        if document_of is not None and self.first.shape[0]:
            empty = self.first == np.iinfo(np.int64).max
            files = np.asarray(document_of(np.where(empty, 0, self.first)), np.int64)
            out["file"] = [int(f) for f in np.where(empty, -1, files)]
        return out
