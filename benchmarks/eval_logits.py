"""Scoring a long window: the evaluation step with its logits a slice at a time vs all at once.

Builds one Llama-shaped model with random weights (``ModelConfig``: hidden 512, 8 heads,
feed-forward 1408, vocabulary 16384, RoPE, chunked attention; ``--layers``, default 1) and
times the jitted evaluation step (`evaluation.step.make_eval_step`: the per-token loss,
correctness and argmax of one window, batch 1) at each ``--lengths`` twice, each in a fresh
process: with the logits mapped ``LOGIT_CHUNK`` (512) positions at a time, and with
``logit_chunk`` larger than the window (the whole ``[length, vocabulary]`` logits at once, as
a plain forward pass makes them). Compile is excluded (``lower(...).compile()`` and one untimed
call); each process then times ``--rounds`` calls and reports the median wall and CPU seconds
and its peak resident memory (``ru_maxrss``). Prints a Markdown table on stdout with the
ratios (all at once / sliced) and the machine's matmul rate (a jitted 2048^2 float32 dot).

    python benchmarks/eval_logits.py                      # 8192 and 16384 tokens
    python benchmarks/eval_logits.py --lengths 4096 --layers 4
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys


def _worker(length: int, chunk: int, layers: int, rounds: int) -> dict:
    import resource
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from flaxformer_lite.evaluation import step
    from flaxformer_lite.nn.model_config import ModelConfig
    from flaxformer_lite.nn.models import DecoderOnlyLM

    cfg = ModelConfig(
        vocab_size=16384,
        d_model=512,
        num_heads=8,
        d_ff=1408,
        num_decoder_layers=layers,
        positional="rope",
        attention_impl="chunked",
    )
    graphdef, params, rest = step.split_model(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    batch = {
        "inputs": jnp.asarray(rng.integers(0, 16384, (1, length)), jnp.int32),
        "targets": jnp.asarray(rng.integers(0, 16384, (1, length)), jnp.int32),
        "loss_mask": jnp.ones((1, length), jnp.float32),
        "positions": jnp.arange(length, dtype=jnp.int32)[None],
    }
    fn = jax.jit(step.make_eval_step(graphdef, logit_chunk=chunk))
    fn = fn.lower(params, rest, batch).compile()
    jax.block_until_ready(fn(params, rest, batch))
    walls, cpus = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(fn(params, rest, batch))
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "wall": statistics.median(walls),
        "cpu": statistics.median(cpus),
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "loss": float(out["loss_sum"].sum()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", nargs=4, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT" + json.dumps(_worker(*args.worker)))
        return
    from flaxformer_lite.evaluation.step import LOGIT_CHUNK

    rows = []
    for length in args.lengths:
        got = {}
        for name, chunk in (("sliced", LOGIT_CHUNK), ("all at once", length + 1)):
            print(f"{length} tokens, logits {name} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--worker", str(length), str(chunk)]
            cmd += [str(args.layers), str(args.rounds)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got[name] = json.loads(proc.stdout.split("RESULT", 1)[1])
        rows.append((length, got["sliced"], got["all at once"]))
    from flaxformer_lite.train.cost import matmul_rate

    rate = matmul_rate(2048) / 1e9
    print(
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"matmul {rate:.0f} GFLOP/s (2048^2 float32), {args.layers} layer(s), "
        f"median of {args.rounds} calls"
    )
    print()
    print(
        "| tokens | sliced: wall s / CPU s / peak GiB | all at once: wall s / CPU s / peak GiB "
        "| time ratio | memory ratio | loss difference |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    for length, a, b in rows:
        print(
            f"| {length} | {a['wall']:.2f} / {a['cpu']:.2f} / {a['peak_gib']:.2f} "
            f"| {b['wall']:.2f} / {b['cpu']:.2f} / {b['peak_gib']:.2f} "
            f"| {b['wall'] / a['wall']:.1f}x | {b['peak_gib'] / a['peak_gib']:.1f}x "
            f"| {abs(a['loss'] - b['loss']):.1e} |"
        )


if __name__ == "__main__":
    main()
