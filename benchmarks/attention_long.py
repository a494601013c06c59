"""Long-context attention benchmark: forward time and peak memory, "xla" vs "chunked".

Every configuration runs in a fresh child process, so its peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``) belongs to that configuration alone: it includes the
Python + JAX runtime floor (reported separately as "floor", measured in the child right
before compiling) and the inputs. In each child the jitted forward is compiled and run once,
then timed as the median of up to ``--repeats`` further runs (``block_until_ready``),
stopping early once ``--time-budget`` seconds of timed runs have accumulated.

Plain attention materialises ``[batch, heads, L, L]`` float32 scores several times over
(about 15 bytes per score at 16k tokens); cases whose estimate exceeds ``--memory-limit-gb``
or the memory currently available are skipped with the estimate printed, never attempted.

    .venv/bin/python benchmarks/attention_long.py                 # 1k, 4k, 16k, 64k tokens
    .venv/bin/python benchmarks/attention_long.py --lengths 1024 4096 --repeats 5

Prints a Markdown table (and the machine, its f32 matmul ceiling, JAX version and git commit)
on stdout; the ratios of "chunked" to "xla" come from the same run, case by case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

IMPLS = ("xla", "chunked")
BIASES = ("none", "alibi")
# Peak bytes per score element of the plain path (measured 15.6 GB at 4 heads x 16k^2).
XLA_BYTES_PER_SCORE = 15.0


def run_case(args: argparse.Namespace) -> dict:
    """Child process: build inputs, compile, time; return the measurements."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flaxformer_lite.core import attention, attention_bias

    length, heads, head_dim = args.length, args.heads, args.head_dim
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (1, length, heads, head_dim), jnp.float32) for key in keys)
    positions = jnp.arange(length, dtype=jnp.int32)[None, :]
    slopes = attention_bias.alibi_slopes(heads)
    bias_fn = None
    if args.bias == "alibi":
        bias_fn = lambda qp, kp: attention_bias.alibi_bias(qp, kp, slopes, causal=True)

    def forward(q, k, v):
        if args.impl == "chunked":
            from flaxformer_lite.core.chunked_attention import chunked_attention

            return chunked_attention(
                q,
                k,
                v,
                q_positions=positions,
                k_positions=positions,
                bias_fn=bias_fn,
                causal=True,
                block_q=args.block_q,
                block_k=args.block_k,
            )
        return attention.attend(
            q,
            k,
            v,
            q_positions=positions,
            k_positions=positions,
            bias_fn=bias_fn,
            causal=True,
            implementation=args.impl,
        )

    jax.block_until_ready((q, k, v))
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fn = jax.jit(forward)
    start = time.perf_counter()
    jax.block_until_ready(fn(q, k, v))
    first = time.perf_counter() - start
    times: list[float] = []
    while len(times) < args.repeats and sum(times) < args.time_budget:
        start = time.perf_counter()
        out = jax.block_until_ready(fn(q, k, v))
        times.append(time.perf_counter() - start)
    assert bool(jnp.all(jnp.isfinite(out)))
    return {
        "first_s": first,
        "median_s": float(np.median(times)),
        "runs": len(times),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "floor_rss": floor,
    }


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def matmul_gflops(rounds: int = 3) -> list[float]:
    """GFLOP/s of a jitted float32 ``jnp.dot`` of two 2048 x 2048 matrices, once per round
    (the machine's matmul ceiling, printed beside the table)."""
    import jax
    import jax.numpy as jnp

    n = 2048
    x = jnp.full((n, n), 0.01, jnp.float32)
    f = jax.jit(jnp.dot)
    f(x, x).block_until_ready()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        f(x, x).block_until_ready()
        out.append(2 * n**3 / (time.perf_counter() - start) / 1e9)
    return out


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-q", type=int, default=None, help="chunked; default: library's")
    parser.add_argument("--block-k", type=int, default=None, help="chunked; default: library's")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case (median)")
    parser.add_argument("--time-budget", type=float, default=60.0, help="s of timed runs")
    parser.add_argument("--memory-limit-gb", type=float, default=24.0)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--biases", nargs="+", default=list(BIASES), choices=BIASES)
    # Internal: run one case and print its JSON (the parent re-invokes this script).
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--bias", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.block_q is None or args.block_k is None:
        from flaxformer_lite.core import chunked_attention

        args.block_q = args.block_q or chunked_attention.DEFAULT_BLOCK_Q
        args.block_k = args.block_k or chunked_attention.DEFAULT_BLOCK_K
    if args.child:
        print(json.dumps(run_case(args)))
        return

    import jax

    ceiling = matmul_gflops()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"batch 1, {args.heads} heads x {args.head_dim} dims, causal, float32, forward only; "
        f"chunked blocks {args.block_q} x {args.block_k}; jax {jax.__version__}; "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); "
        f"commit {commit or '?'}; f32 jnp.dot 2048^2 ceiling "
        f"{statistics.median(ceiling):.0f} GFLOP/s (median of {len(ceiling)})\n",
        flush=True,
    )
    header = (
        "| tokens | bias | impl | compile + 1st run (s) | forward (s, median) | runs "
        "| peak RSS (GiB) | floor (GiB) | time vs xla | peak vs xla |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for length in args.lengths:
        for bias in args.biases:
            results = {}
            for impl in args.impls:
                row = f"| {length} | {bias} | {impl} |"
                need = XLA_BYTES_PER_SCORE * args.heads * length * length
                if impl == "xla" and need > min(args.memory_limit_gb * 2**30, available_bytes()):
                    print(f"{row} skipped: would need ~{gib(need)} GiB | | | | | | |", flush=True)
                    continue
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    f"--length={length}",
                    f"--impl={impl}",
                    f"--bias={bias}",
                    f"--heads={args.heads}",
                    f"--head-dim={args.head_dim}",
                    f"--block-q={args.block_q}",
                    f"--block-k={args.block_k}",
                    f"--repeats={args.repeats}",
                    f"--time-budget={args.time_budget}",
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    err = (proc.stderr.strip().splitlines() or ["?"])[-1][:80]
                    print(f"{row} failed (rc {proc.returncode}): {err} | | | | | | |", flush=True)
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                results[impl] = r
                ratios = "| |"
                if impl != "xla" and "xla" in results:
                    x = results["xla"]
                    ratios = (
                        f"{r['median_s'] / x['median_s']:.3f}x | "
                        f"{r['peak_rss'] / x['peak_rss']:.3f}x |"
                    )
                print(
                    f"{row} {r['first_s']:.2f} | {r['median_s']:.3f} | {r['runs']} | "
                    f"{gib(r['peak_rss'])} | {gib(r['floor_rss'])} | {ratios}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
