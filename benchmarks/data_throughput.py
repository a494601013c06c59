"""Data-layer throughput: batch generation vs a plain numpy copy of the same bytes, one run.

    .venv/bin/python benchmarks/data_throughput.py [--corpus stdlib] [--batch 32] \\
        [--length 512] [--seconds 1] [--rounds 5]

Numpy only (no jax). Times, interleaved round by round so that load from other processes hits
both alike, after one warm-up call each:

* `split("train").sample_batch`: batches/s and tokens/s;
* the floor of that work: one numpy fancy-index gather of the same ``[batch, length + 1]``
  windows from the same bytes, cast to int32 (what any batcher has to do);
* `split("validation").eval_batches` (non-overlapping windows): windows/s of one pass.

Prints the median of the rounds of each, the ratio sample_batch / gather (1.0x: the data layer
adds nothing to the copy), and the machine's f32 matmul ceiling (numpy's BLAS, 1024 x 1024)
beside them, so a run on a slower or busier machine reads as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from flaxformer_lite.data import get_corpus


def calls_per_second(fn: Callable[[], object], seconds: float) -> float:
    """How many times per second ``fn()`` runs, over about ``seconds`` of calls."""
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        count += 1
    return count / elapsed


def matmul_gflops(n: int = 1024, repeats: int = 3) -> float:
    """GFLOP/s of the fastest of ``repeats`` numpy ``a @ b`` of two ``n x n`` float32 matrices."""
    a = np.full((n, n), 0.01, np.float32)
    a @ a  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="stdlib", help="a registered corpus name")
    parser.add_argument("--batch", type=int, default=32, help="windows per batch")
    parser.add_argument("--length", type=int, default=512, help="tokens per window")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per timed block")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    args = parser.parse_args(argv)

    corpus = get_corpus(args.corpus)
    prov = corpus.provenance()
    train, valid = corpus.split("train"), corpus.split("validation")
    data = np.asarray(train.data)
    print(
        f"corpus {prov['name']} sha256 {prov['sha256'][:16]}...; train {train.num_bytes} bytes; "
        f"batch {args.batch} x length {args.length}; {args.rounds} rounds of ~{args.seconds:g} s"
    )

    rng = np.random.default_rng(0)
    offsets = np.arange(args.length + 1)

    def gather() -> np.ndarray:
        starts = rng.integers(0, data.shape[0] - args.length - 1, args.batch)
        return data[starts[:, None] + offsets].astype(np.int32)

    def one_eval_pass() -> int:
        return sum(b["inputs"].shape[0] for b in valid.eval_batches(args.length, args.batch))

    contestants = {
        "sample_batch": lambda: train.sample_batch(rng, args.batch, args.length),
        "gather": gather,
        "eval_batches": one_eval_pass,
    }
    for fn in contestants.values():
        fn()  # warm-up (page cache, first touch of the memory map)
    rates: dict[str, list[float]] = {name: [] for name in contestants}
    ceilings = []
    for r in range(args.rounds):
        ceilings.append(matmul_gflops())
        order = list(contestants) if r % 2 == 0 else list(contestants)[::-1]
        for name in order:
            rates[name].append(calls_per_second(contestants[name], args.seconds))
    med = {name: statistics.median(v) for name, v in rates.items()}
    tokens = args.batch * args.length
    windows = valid.num_eval_windows(args.length)
    ratios = [s / g for s, g in zip(rates["sample_batch"], rates["gather"], strict=True)]
    print(
        f"f32 matmul ceiling (numpy, 1024^2): {statistics.median(ceilings):.0f} GFLOP/s "
        f"(median of rounds, {min(ceilings):.0f}-{max(ceilings):.0f})"
    )
    print(
        f"sample_batch: {med['sample_batch']:,.0f} batches/s "
        f"({med['sample_batch'] * tokens / 1e6:,.1f} M tokens/s)"
    )
    print(
        f"numpy gather: {med['gather']:,.0f} batches/s "
        f"({med['gather'] * tokens / 1e6:,.1f} M tokens/s)"
    )
    print(
        f"sample_batch / gather: {med['sample_batch'] / med['gather']:.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    print(
        f"eval_batches length={args.length}: {med['eval_batches'] * windows:,.0f} windows/s "
        f"({windows} windows per pass over validation)"
    )


if __name__ == "__main__":
    main()
