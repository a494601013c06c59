"""Uncertainty and tests from the recorded per-block sums (``blocks.jsonl`` beside the rows).

Every finished cell of a study records, next to its rows, its per-block sums over the
evaluation data (`flaxformer_lite.evaluation.blocks`). From them:

* a table cell's interval (`stats.bootstrap_interval`) adds the seeds' spread and a
  bootstrap of the evaluation files, each with all its blocks (the same draw for every seed:
  the blocks are the same bytes), with Welch-Satterthwaite degrees of freedom: it covers
  training noise and the finite evaluation set, as a sample of files like these. Blocks
  recorded without their file, or from a split of one file, are their own units
  (`Grid.unit_name` says which);
* two encodings are compared *paired* -- the same seeds (same data order) and the same
  blocks (same bytes) -- by `stats.paired_difference`, and a family of comparisons is
  corrected with Holm's method;
* a table marks its best row bold only when it is significantly better than every other row
  of its column; rows that are not significantly different from the best are a tie; a column
  where the best mean is significantly worse than another row on their shared seeds, or where
  a comparison cannot be made (a diverged run), is not marked.

Rows and blocks are matched by (study, run, seed, encoding, protocol, evaluation length, task,
training length). Metrics without per-block sums (the loss buckets), and evaluations with
fewer than `MIN_BLOCKS` blocks, fall back to a Student-t interval over seeds and are not
tested.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from flaxformer_lite.data.windows import KEY_NGRAM  # noqa: F401  (the report's key-metric caption)
from flaxformer_lite.results import stats

ALPHA = 0.05
# Fewer blocks than this say too little about the data's variation for a bootstrap (smoke
# presets with a few thousand targets): such cells fall back to Student t over seeds.
MIN_BLOCKS = 10
# metric -> (block field summed, block field counted, scale of the ratio, transform)
METRIC_BLOCKS: dict[str, tuple[str, str, float, Any]] = {
    "bits_per_byte": ("loss", "count", 1.0 / math.log(2.0), None),
    # the context protocol's key targets: bits over the bytes they cover
    "key_bits_per_byte": ("key_loss", "key_bytes", 1.0 / math.log(2.0), None),
    "loss": ("loss", "count", 1.0, None),
    "perplexity": ("loss", "count", 1.0, np.exp),
    "accuracy": ("correct", "count", 1.0, None),
    "exact_match": ("exact", "examples", 1.0, None),
}


def block_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        row.get("study"),
        row.get("run"),
        row.get("seed"),
        row.get("encoding"),
        row.get("protocol"),
        row.get("eval_length"),
        row.get("task"),
        row.get("train_length"),
    )


@dataclasses.dataclass(frozen=True)
class Grid:
    """One table cell's per-block data: ``values``/``counts`` ``[seeds, blocks]``."""

    seeds: tuple[Any, ...]
    values: np.ndarray
    counts: np.ndarray
    block_size: int
    unit: str
    transform: Any = None
    units: np.ndarray | None = None  # [blocks] the file of each block; None: blocks are units

    @property
    def unit_name(self) -> str:
        """What the data part of an interval resamples: "files" or "blocks"."""
        return "blocks" if self.units is None else "files"

    @property
    def num_units(self) -> int:
        return self.values.shape[1] if self.units is None else stats.num_units(self.units)

    @property
    def effective_units(self) -> float:
        """Kish's effective number of the sampling units (`stats.effective_units`)."""
        n = self.values.shape[1]
        return float(n) if self.units is None else stats.effective_units(self.units)

    def select(self, seeds: Sequence[Any]) -> Grid:
        idx = [self.seeds.index(s) for s in seeds]
        return dataclasses.replace(
            self, seeds=tuple(seeds), values=self.values[idx], counts=self.counts[idx]
        )


class BlockIndex:
    """The per-block records of a set of rows, looked up by the rows they belong to."""

    def __init__(self, records: Iterable[Mapping[str, Any]] = ()):
        self._records = {block_key(r): r["blocks"] for r in records if "blocks" in r}

    def grid(self, rows: Sequence[Mapping[str, Any]], metric: str) -> Grid | None:
        """The ``[seeds, blocks]`` grid of one cell's rows (one per seed), or None when a row
        has no block record, the metric has none, the seeds repeat or the blocks differ."""
        spec = METRIC_BLOCKS.get(metric)
        if spec is None or not rows:
            return None
        field, count_field, scale, transform = spec
        records = [self._records.get(block_key(r)) for r in rows]
        if (
            metric == "bits_per_byte"
            and records
            and all(b is not None and "bytes" in b for b in records)
        ):
            count_field = "bytes"  # tokenized text: bits over the bytes the tokens cover
        seeds = tuple(r.get("seed") for r in rows)
        if any(b is None or field not in b or count_field not in b for b in records):
            return None
        if len(set(seeds)) != len(seeds):
            return None
        sizes = {len(b[field]) for b in records} | {len(b[count_field]) for b in records}
        if len(sizes) != 1 or len({b["size"] for b in records}) != 1:
            return None
        order = sorted(range(len(rows)), key=lambda i: _seed_key(seeds[i]))
        values = np.array([records[i][field] for i in order], np.float64) * scale
        counts = np.array([records[i][count_field] for i in order], np.float64)
        keep = counts.sum(axis=0) > 0  # blocks no seed scored (an unused tail) carry nothing
        if keep.sum() < MIN_BLOCKS:
            return None
        return Grid(
            tuple(seeds[i] for i in order),
            values[:, keep],
            counts[:, keep],
            int(records[0]["size"]),
            str(records[0].get("unit", "")),
            transform,
            _files(records, keep),
        )


def _files(records: Sequence[Mapping[str, Any]], keep: np.ndarray) -> np.ndarray | None:
    """The file of each kept block, when every record names the same files and there are
    two or more (one file: its blocks are the units)."""
    files = [b.get("file") for b in records]
    if any(f is None or len(f) != keep.shape[0] for f in files) or any(
        f != files[0] for f in files
    ):
        return None
    units = np.asarray(files[0], np.int64)[keep]
    return units if stats.num_units(units) > 1 else None


def _seed_key(seed: Any) -> tuple[int, Any]:
    return (0, seed) if isinstance(seed, int | float) else (1, str(seed))


def interval(grid: Grid, confidence: float) -> tuple[float, float, float]:
    return stats.bootstrap_interval(
        grid.values,
        grid.counts,
        confidence=confidence,
        transform=grid.transform,
        units=grid.units,
    )


class PairingError(ValueError):
    """Two cells that should be compared pairwise did not score the same blocks of data."""


def compare(a: Grid, b: Grid, confidence: float = 0.95) -> dict[str, float] | None:
    """`stats.paired_difference` of two cells on their common seeds; None when they share no
    seed (nothing to pair).

    Raises `PairingError`, saying why, when their blocks differ (their number, their size or
    their files): the two evaluations did not score the same data (for models with different
    tokenizers, evaluate both with the same ``eval.max_bytes``: `flaxformer_lite.data.tokens`
    makes every tokenizer score exactly the same bytes), and a paired test of blocks that are
    not the same bytes would be wrong rather than merely missing."""
    common = [s for s in a.seeds if s in b.seeds]
    if not common:
        return None
    why = None
    if a.block_size != b.block_size:
        why = f"blocks of {a.block_size} vs {b.block_size} {a.unit or 'targets'}"
    elif a.values.shape[1] != b.values.shape[1]:
        why = f"{a.values.shape[1]} vs {b.values.shape[1]} scored blocks of {a.block_size}"
    elif (a.units is None) != (b.units is None) or (
        a.units is not None and not np.array_equal(a.units, b.units)
    ):
        why = f"their blocks lie in different files ({a.unit_name} vs {b.unit_name})"
    if why is not None:
        raise PairingError(
            f"cannot pair two cells ({why}): they did not score the same data; evaluate both "
            "on the same split with the same eval.max_bytes (every tokenizer then scores the "
            "same bytes)"
        )
    a, b = a.select(common), b.select(common)
    return stats.paired_difference(
        a.values,
        a.counts,
        b.values,
        b.counts,
        confidence=confidence,
        transform=a.transform,
        units=a.units,
    )


def column_marks(
    grids: Mapping[str, Grid], means: Mapping[str, float], better: str, alpha: float = ALPHA
) -> tuple[str, frozenset[str]] | None:
    """How to mark the best of one table column: ``("best", {e})`` when ``e`` is
    significantly better than every other row (paired tests, Holm over the column's
    comparisons), ``("tie", {...})`` with the rows not significantly different from the best
    otherwise; None when there is nothing to compare or a row has no block data."""
    if better not in ("lower", "higher") or len(means) < 2 or set(grids) != set(means):
        return None
    pick = min if better == "lower" else max
    best = pick(means, key=lambda e: means[e])
    others = [e for e in means if e != best]
    results = [compare(grids[best], grids[e]) for e in others]  # PairingError: not the same data
    if any(r is None for r in results):
        return None
    adjusted = stats.holm([r["p"] for r in results])
    if any(math.isnan(p) for p in adjusted):
        return None  # a comparison could not be made (a diverged run): no claim
    # "best" is chosen by the means over each row's own seeds; the tests pair the seeds two
    # rows share. Where such a test finds the best row significantly *worse*, the column has
    # no best to mark.
    deltas = [r["delta"] for r in results]  # best - other
    sign = 1.0 if better == "lower" else -1.0  # sign * delta > 0: best is the worse of the two
    if any(p < alpha and sign * d > 0 for d, p in zip(deltas, adjusted, strict=True)):
        return None
    tied = {e for e, p in zip(others, adjusted, strict=True) if p >= alpha}
    if not tied:
        return ("best", frozenset({best}))
    return ("tie", frozenset({best} | tied))


@dataclasses.dataclass(frozen=True)
class Pair:
    """One paired comparison: ``encoding`` minus ``reference`` at one column."""

    encoding: str
    reference: str
    eval_length: int
    delta: float
    low: float
    high: float
    p: float
    p_holm: float
    seeds: int
    blocks: int
    files: int = 0  # evaluation files resampled (0: the blocks were the units)
