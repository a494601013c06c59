"""How often the results tables' 95 % intervals cover the truth, and how often their paired
tests reject a true null, in simulated studies with a known answer.

Each simulated cell is a crossed ``[seeds, blocks]`` grid, as a study records it (every seed
scored on the same blocks): a seed effect per seed (training noise), a block effect shared by
every seed (which bytes are hard), and noise per seed and block; the true mean is 0. For each
case the script prints the share of simulated studies whose interval covers 0 (or, for the
paired cases, whose p-value is below 0.05 when the two encodings have the same expected loss)
for the library's method (`flaxformer_lite.experiments.stats`) and for the first version's
(a percentile bootstrap that resampled seeds, then blocks afresh for every drawn seed, with a
bootstrap p-value; used for tables built before commit fbd0143, reimplemented here)::

    .venv/bin/python scripts/interval_coverage.py --studies 300
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flaxformer_lite.experiments import stats

BLOCKS = 50
# name, seeds, seed sd, block sd, noise sd
INTERVAL_CASES = [
    ("seeds only", 2, 1.0, 0.0, 0.5),
    ("seeds only", 3, 1.0, 0.0, 0.5),
    ("seeds only", 5, 1.0, 0.0, 0.5),
    ("seeds only", 10, 1.0, 0.0, 0.5),
    ("blocks only", 1, 0.0, 1.0, 0.0),
    ("blocks only", 5, 0.0, 1.0, 0.0),
    ("both", 3, 0.3, 1.0, 0.5),
    ("both", 5, 0.3, 1.0, 0.5),
]
# name, seeds, seed sd, interaction sd (encoding x block)
PAIRED_CASES = [
    ("seed noise", 2, 0.05, 0.0),
    ("seed noise", 3, 0.05, 0.0),
    ("seed noise", 5, 0.05, 0.0),
    ("encoding x block", 3, 0.0, 0.3),
    ("encoding x block", 5, 0.0, 0.3),
]


def _first_version_replicates(values: np.ndarray, replicates: int, rng) -> np.ndarray:
    """The statistic over the first version's draws: seeds with replacement, then, for every
    drawn seed, its own draw of blocks (equal counts: the mean of the drawn blocks)."""
    s, b = values.shape
    seeds = rng.integers(0, s, size=(replicates, s))
    blocks = rng.integers(0, b, size=(replicates, s, b))
    return values[seeds[..., None], blocks].mean(axis=(1, 2))


def first_version_interval(values: np.ndarray, replicates: int, rng) -> tuple[float, float]:
    reps = _first_version_replicates(values, replicates, rng)
    low, high = np.quantile(reps, [0.025, 0.975])
    return float(low), float(high)


def first_version_p(a: np.ndarray, b: np.ndarray, replicates: int, rng) -> float:
    # equal counts: the replicates' difference of means is the mean of the drawn differences
    reps = _first_version_replicates(a - b, replicates, rng)
    below = (1 + np.sum(reps <= 0.0)) / (replicates + 1)
    above = (1 + np.sum(reps >= 0.0)) / (replicates + 1)
    return float(min(1.0, 2.0 * min(below, above)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=300, help="simulated studies per case")
    p.add_argument("--replicates", type=int, default=500, help="bootstrap replicates per call")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.studies < 1 or args.replicates < 2:
        p.error(
            f"--studies must be >= 1 and --replicates >= 2; got {args.studies}, {args.replicates}"
        )
    rng = np.random.default_rng(args.seed)
    n = args.studies
    print(f"{n} simulated studies per case, {BLOCKS} blocks, {args.replicates} replicates.\n")
    print("| case | seeds | coverage of the 95 % interval: library | first version |")
    print("|---|--:|--:|--:|")
    for name, seeds, sd_seed, sd_block, sd_noise in INTERVAL_CASES:
        hits = [0, 0]
        for _ in range(n):
            shared = rng.normal(0, sd_block, BLOCKS)
            grid = (
                rng.normal(0, sd_seed, (seeds, 1))
                + shared
                + rng.normal(0, sd_noise, (seeds, BLOCKS))
            )
            _, low, high = stats.bootstrap_interval(
                grid, np.ones_like(grid), replicates=args.replicates, seed=int(rng.integers(2**31))
            )
            hits[0] += low <= 0.0 <= high
            low, high = first_version_interval(grid, args.replicates, rng)
            hits[1] += low <= 0.0 <= high
        print(f"| {name} | {seeds} | {hits[0] / n:.3f} | {hits[1] / n:.3f} |")
    print("\n| paired case (no true difference) | seeds | p < 0.05: library | first version |")
    print("|---|--:|--:|--:|")
    for name, seeds, sd_seed, sd_inter in PAIRED_CASES:
        rejections = [0, 0]
        for _ in range(n):
            shared = rng.normal(0, 1.0, BLOCKS)
            a = shared + rng.normal(0, sd_seed, (seeds, 1)) + rng.normal(0, sd_inter, BLOCKS)
            a = a + rng.normal(0, 0.01, (seeds, BLOCKS))
            b = shared + rng.normal(0, sd_seed, (seeds, 1)) + rng.normal(0, sd_inter, BLOCKS)
            b = b + rng.normal(0, 0.01, (seeds, BLOCKS))
            ones = np.ones_like(a)
            r = stats.paired_difference(
                a, ones, b, ones, replicates=args.replicates, seed=int(rng.integers(2**31))
            )
            rejections[0] += r["p"] < 0.05
            rejections[1] += first_version_p(a, b, args.replicates, rng) < 0.05
        print(f"| {name} | {seeds} | {rejections[0] / n:.3f} | {rejections[1] / n:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
