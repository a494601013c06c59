"""Measures batch-generation throughput of the data layer (numpy only, one CPU thread).

    python scripts/data_throughput.py [--corpus stdlib] [--batch 32] [--length 512] [--seconds 3]

Prints batches/s and bytes/s for `split("train").sample_batch`, and windows/s for
`split("validation").eval_batches` (non-overlapping), after one warm-up pass.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaxformer_lite.data import get_corpus


def _rate(fn, seconds: float) -> tuple[int, float]:
    fn()  # warm-up (page cache, first-touch of the memory map)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        count += 1
    return count, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="stdlib")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    corpus = get_corpus(args.corpus)
    prov = corpus.provenance()
    print(
        f"corpus {prov['name']} sha256 {prov['sha256'][:16]}... "
        f"train {corpus.split('train').num_bytes} bytes"
    )

    train = corpus.split("train")
    rng = np.random.default_rng(0)
    count, elapsed = _rate(lambda: train.sample_batch(rng, args.batch, args.length), args.seconds)
    rate = count / elapsed
    print(
        f"sample_batch batch={args.batch} length={args.length}: {rate:,.0f} batches/s "
        f"({rate * args.batch * args.length / 1e6:,.1f} M tokens/s)"
    )

    valid = corpus.split("validation")

    def one_eval_pass():
        return sum(b["inputs"].shape[0] for b in valid.eval_batches(args.length, args.batch))

    windows = valid.num_eval_windows(args.length)
    count, elapsed = _rate(one_eval_pass, args.seconds)
    print(
        f"eval_batches length={args.length}: {count * windows / elapsed:,.0f} windows/s "
        f"({windows} windows per pass over validation)"
    )


if __name__ == "__main__":
    main()
