"""How often the results tables' 95 % intervals cover the truth, and how often their paired
tests reject a true null, in simulated studies with a known answer.

Each simulated cell is a crossed ``[seeds, blocks]`` grid, as a study records it (every seed
scored on the same blocks): a seed effect per seed (training noise), a block effect shared by
every seed (which bytes are hard) and noise per seed and block; the true mean is 0. In the
clustered cases the blocks belong to files and the block effect is a file effect plus a block-
within-file effect, with the intra-file correlation ``icc`` of the block effects (0.31;
0.33-0.35 for the block losses of the `quick` rows at 1x: 258 blocks of 1,024 bytes in 32
files). For each case the script prints the share of simulated studies whose interval covers 0
(or, for the paired cases, whose p-value is below 0.05 when the two encodings have the same
expected loss) with files as the sampling unit (`flaxformer_lite.results.stats`, ``units`` =
each block's file) and with blocks as independent units (``units=None``)::

    .venv/bin/python scripts/interval_coverage.py --studies 400
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flaxformer_lite.results import stats

# The stdlib validation split's 258 blocks of 1,024 bytes per file, largest first (32 files hold a
# block's first byte; the committed rows' blocks record each block's file): Kish's effective number
# of files, (sum n)^2 / sum n^2, is 16.1 of 32.
STDLIB_VALIDATION_BLOCKS = (38, 23, 21, 17, 15, 14, 12, 11, 11, 9, 9, 9, 9, 8, 7, 6, 6, 6, 5)
STDLIB_VALIDATION_BLOCKS += (3, 3, 3, 3, 2) + (1,) * 8
REAL = "real"  # `files` of a case: the files and blocks of STDLIB_VALIDATION_BLOCKS

# name, seeds, seed sd, block sd, noise sd, files, blocks, icc (files = blocks: independent)
INTERVAL_CASES = [
    ("seeds only", 2, 1.0, 0.0, 0.5, 50, 50, 0.0),
    ("seeds only", 3, 1.0, 0.0, 0.5, 50, 50, 0.0),
    ("seeds only", 5, 1.0, 0.0, 0.5, 50, 50, 0.0),
    ("seeds only", 10, 1.0, 0.0, 0.5, 50, 50, 0.0),
    ("blocks only", 1, 0.0, 1.0, 0.0, 50, 50, 0.0),
    ("blocks only", 5, 0.0, 1.0, 0.0, 50, 50, 0.0),
    ("16 blocks", 1, 0.0, 1.0, 0.0, 16, 16, 0.0),
    ("16 blocks", 5, 0.0, 1.0, 0.2, 16, 16, 0.0),
    ("both", 5, 0.3, 1.0, 0.5, 50, 50, 0.0),
    ("files (stdlib-like)", 1, 0.0, 1.0, 0.0, 33, 258, 0.31),
    ("files (stdlib-like)", 5, 0.05, 1.0, 0.2, 33, 258, 0.31),
    ("files, 16 blocks", 5, 0.05, 1.0, 0.2, 12, 16, 0.31),
    ("files, the validation split's sizes", 1, 0.0, 1.0, 0.0, REAL, REAL, 0.31),
    ("files, the validation split's sizes", 5, 0.05, 1.0, 0.2, REAL, REAL, 0.31),
]
# name, seeds, seed sd, interaction sd (encoding x block), files, blocks, icc of the interaction
PAIRED_CASES = [
    ("seed noise", 2, 0.05, 0.0, 50, 50, 0.0),
    ("seed noise", 3, 0.05, 0.0, 50, 50, 0.0),
    ("seed noise", 5, 0.05, 0.0, 50, 50, 0.0),
    ("encoding x block", 3, 0.0, 0.3, 50, 50, 0.0),
    ("encoding x block", 5, 0.0, 0.3, 50, 50, 0.0),
    ("encoding x file (stdlib-like)", 5, 0.01, 0.3, 33, 258, 0.31),
    ("encoding x file, the validation split's sizes", 5, 0.01, 0.3, REAL, REAL, 0.31),
]


def file_of_blocks(files: int | str, blocks: int | str, rng: np.random.Generator) -> np.ndarray:
    """``[blocks]`` file labels: every file has a block, the rest fall to files at random
    (unequal file sizes, as in a corpus of source files); `REAL`: the validation split's."""
    if files == REAL:
        return np.repeat(np.arange(len(STDLIB_VALIDATION_BLOCKS)), STDLIB_VALIDATION_BLOCKS)
    labels = np.concatenate([np.arange(files), rng.integers(0, files, blocks - files)])
    return np.sort(labels)


def _size(files: int | str, blocks: int | str) -> str:
    """The ``files | blocks`` cells of a case's row."""
    if files == REAL:
        return f"{len(STDLIB_VALIDATION_BLOCKS)} | {sum(STDLIB_VALIDATION_BLOCKS)}"
    return f"{files} | {blocks}"


def block_effects(sd: float, units: np.ndarray, icc: float, rng) -> np.ndarray:
    """``[blocks]`` effects of variance ``sd**2``, ``icc`` of it shared within a file."""
    files = int(units.max()) + 1
    shared = rng.normal(0, sd * np.sqrt(icc), files)[units]
    return shared + rng.normal(0, sd * np.sqrt(1.0 - icc), units.shape[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=400, help="simulated studies per case")
    p.add_argument("--replicates", type=int, default=500, help="bootstrap replicates per call")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.studies < 1 or args.replicates < 2:
        p.error(
            f"--studies must be >= 1 and --replicates >= 2; got {args.studies}, {args.replicates}"
        )
    rng = np.random.default_rng(args.seed)
    n = args.studies
    print(f"{n} simulated studies per case, {args.replicates} replicates per interval.\n")
    print("| case | seeds | files | blocks | icc | coverage: files as units | blocks as units |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, seeds, sd_seed, sd_block, sd_noise, files, blocks, icc in INTERVAL_CASES:
        hits = [0, 0]
        for _ in range(n):
            units = file_of_blocks(files, blocks, rng)
            grid = (
                rng.normal(0, sd_seed, (seeds, 1))
                + block_effects(sd_block, units, icc, rng)
                + rng.normal(0, sd_noise, (seeds, units.shape[0]))
            )
            draw = int(rng.integers(2**31))
            for k, u in enumerate((units, None)):
                _, low, high = stats.bootstrap_interval(
                    grid, np.ones_like(grid), replicates=args.replicates, seed=draw, units=u
                )
                hits[k] += low <= 0.0 <= high
        print(
            f"| {name} | {seeds} | {_size(files, blocks)} | {icc:g} | {hits[0] / n:.3f} | "
            f"{hits[1] / n:.3f} |"
        )
    print(
        "\n| paired case (no true difference) | seeds | files | blocks | icc "
        "| p < 0.05: files as units | blocks as units |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, seeds, sd_seed, sd_inter, files, blocks, icc in PAIRED_CASES:
        rejections = [0, 0]
        for _ in range(n):
            units = file_of_blocks(files, blocks, rng)
            shared = block_effects(1.0, units, icc, rng)
            a, b = (
                shared
                + rng.normal(0, sd_seed, (seeds, 1))
                + block_effects(sd_inter, units, icc, rng)
                + rng.normal(0, 0.01, (seeds, units.shape[0]))
                for _ in range(2)
            )
            ones = np.ones_like(a)
            draw = int(rng.integers(2**31))
            for k, u in enumerate((units, None)):
                r = stats.paired_difference(
                    a, ones, b, ones, replicates=args.replicates, seed=draw, units=u
                )
                rejections[k] += r["p"] < 0.05
        print(
            f"| {name} | {seeds} | {_size(files, blocks)} | {icc:g} | {rejections[0] / n:.3f} | "
            f"{rejections[1] / n:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
