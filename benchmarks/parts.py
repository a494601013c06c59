"""Issue 15's micro-measurements: where the train step's time goes, part by part (one run).

Prints Markdown tables (medians of ``--rounds`` interleaved rounds, each timing ``--calls``
calls of a jitted function after a warm-up call) for the figures docs/performance.md quotes:

* parts: forward + backward of one layer's feed-forward sublayer (pre-LN, 256 -> 1024, GELU,
  1024 -> 256, residual) and attention sublayer (pre-LN, projections, causal attention, out
  projection, residual) of the reference model of `train_speed` at ``[16, 256, 256]``, of the
  causal attention core at ``[16, 256, 4, 64]`` (JAX with 1, 2 and 4 query blocks), of a layer
  norm and a tanh-GELU, of one whole decoder block and of four blocks chained (per block: what a
  block costs inside a deeper stack); the train step with 0 layers (embedding, positions, final
  norm, tied logits, loss and their optimizer update), with 4, and the per-layer / rest split
  from 1- and 4-layer steps (``(t4 - t1) / 3`` and ``t1 - that``). PyTorch eager's same parts
  (``F.scaled_dot_product_attention(is_causal=True)``, a fused q/k/v projection as in
  `train_speed`) run in a child process (``--torch-python``, default this interpreter);
  ``--no-torch`` leaves them out.
* kernel gradients: the float32 product ``xᵀ g`` as the plain ``dot_general`` and swapped
  (``(gᵀ x)ᵀ`` behind an optimization barrier, `mixed_precision._kernel_gradient`'s CPU form)
  at six shapes, and whether the two agree bit for bit;
* bf16: GELU forward on ``[16, 256, 1024]`` as the bf16 chain, through float32
  (`mixed_precision.elementwise_in_float32`) and for float32 input; causal attention forward
  + backward on bf16 ``[16, 256, 4, 64]`` with bf16 products (`attend` as before ``8a8333d``,
  `ab_step`'s "bf16-before" variant) and as `attend` computes it on CPU (in float32).

    .venv/bin/python benchmarks/parts.py                 # everything, 7 rounds (~3 min)
    .venv/bin/python benchmarks/parts.py --rounds 5 --no-torch
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_step, train_speed

B, T, D_MODEL, HEADS, HEAD_DIM, D_FF = 16, 256, 256, 4, 64, 1024
KERNEL_SHAPES = [(4096, 1024, 256), (2048, 256, 64), (4096, 256, 64), (4096, 512, 256)]
KERNEL_SHAPES += [(4096, 256, 256), (2048, 64, 64)]  # square: the swap does not pay


def _timed(fns: dict, *, rounds: int, calls: int, block) -> dict[str, float]:
    """Median ms per call of each zero-argument ``fns[name]``, rounds interleaved."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            block(fn())
            t0 = time.perf_counter()
            for _ in range(calls):
                out = fn()
            block(out)
            times[name].append((time.perf_counter() - t0) / calls * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


STEP_LAYERS = (0, 1, 4)
CHAINED = "4 decoder blocks chained, per block"


def _step_split(trainers: dict[int, object], rounds: int) -> dict[str, float]:
    """ms of a train step with 0 and 4 layers, and the per-layer / rest split from 1 and 4."""
    ms = train_speed.measure(list(trainers.values()), rounds=rounds, steps=lambda c: 2)
    t0, t1, t4 = (statistics.median(ms[trainers[n].label]) * 1e3 for n in STEP_LAYERS)
    per_layer = (t4 - t1) / 3
    return {
        "train step, 0 layers": t0,
        "train step, 4 layers": t4,
        "step per layer": per_layer,
        "step rest": t1 - per_layer,
    }


# --------------------------------------------------------------------------- PyTorch


def torch_parts(rounds: int, calls: int) -> dict[str, float]:
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(0)
    ln1, ln2 = nn.LayerNorm(D_MODEL, eps=1e-6), nn.LayerNorm(D_MODEL, eps=1e-6)
    qkv, out = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
    wi, wo = nn.Linear(D_MODEL, D_FF), nn.Linear(D_FF, D_MODEL)
    x = torch.randn(B, T, D_MODEL, requires_grad=True)
    h = torch.randn(B, T, D_FF, requires_grad=True)
    q, k, v = (torch.randn(B, HEADS, T, HEAD_DIM, requires_grad=True) for _ in range(3))

    def attention_sublayer():
        b, t, _ = x.shape
        qq, kk, vv = qkv(ln1(x)).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        return x + out(a.transpose(1, 2).reshape(b, t, D_MODEL))

    blocks = train_speed._torch_model(train_speed.REFERENCE).blocks  # the benchmark's own

    def chained():
        y = x
        for block in blocks:
            y = block(y)
        return y

    forwards = {
        "feed-forward sublayer": lambda: x + wo(F.gelu(wi(ln2(x)), approximate="tanh")),
        "attention sublayer": attention_sublayer,
        "attention core": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "layer norm [16,256,256]": lambda: ln1(x),
        "tanh-GELU [16,256,1024]": lambda: F.gelu(h, approximate="tanh"),
        "decoder block": lambda: blocks[0](x),
        CHAINED: chained,
    }

    def fwd_bwd(f):
        def run():
            y = f()
            y.backward(torch.ones_like(y))
            return y

        return run

    got = _timed(
        {n: fwd_bwd(f) for n, f in forwards.items()}, rounds=rounds, calls=calls, block=lambda y: y
    )
    got[CHAINED] /= len(blocks)
    trainers = {
        n: train_speed.TorchTrainer(
            dataclasses.replace(train_speed.REFERENCE, num_layers=n), dtype="float32"
        )
        for n in STEP_LAYERS
    }
    for n, tr in trainers.items():
        tr.label = f"{n} layers"
    return got | _step_split(trainers, rounds)


# --------------------------------------------------------------------------- JAX


def jax_parts(rounds: int, calls: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flaxformer_lite.core import attention
    from flaxformer_lite.nn import layers
    from flaxformer_lite.nn.models import DecoderOnlyLM

    cfg = train_speed.model_config(
        train_speed.REFERENCE, positional="sinusoidal", dtype="float32", impl="xla"
    )
    rngs = nnx.Rngs(0)
    keys = iter(jax.random.split(jax.random.key(0), 8))
    x = jax.random.normal(next(keys), (B, T, D_MODEL))
    h = jax.random.normal(next(keys), (B, T, D_FF))
    q, k, v = (jax.random.normal(next(keys), (B, T, HEADS, HEAD_DIM)) for _ in range(3))
    pos = jnp.arange(T)
    decoder = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)).decoder  # 4 blocks, as train_speed's
    pe, stack = decoder.pe, decoder.blocks
    positions = jnp.broadcast_to(pos, (B, T))  # as the model passes them to its blocks
    block = layers.DecoderBlock(cfg, cross_attention=False, rngs=rngs)
    ff, ff_norm = layers.FeedForward(cfg, rngs=rngs), block.ffn_norm
    ln = block.self_attention_norm.norm

    def sublayer_grad(modules, call):
        def loss(m, x):
            return jnp.sum(call(m, x))

        g = nnx.jit(nnx.grad(loss, argnums=(0, 1)))
        return lambda: g(modules, x)

    def attend_grad(blocks):
        def loss(q, k, v):  # the block count swapped while jit traces it
            with ab_step.swapped([(attention, "causal_query_blocks", lambda n: blocks)]):
                out = attention.attend(q, k, v, q_positions=pos, k_positions=pos, causal=True)
            return jnp.sum(out)

        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return lambda: g(q, k, v)

    def chained(blocks, x):
        for b in blocks:
            x = b(x, positions, pe=pe, deterministic=True)
        return x

    causal = dict(q_positions=pos, pe=pe, causal=True)
    gelu_grad = jax.jit(jax.grad(lambda h: jnp.sum(jax.nn.gelu(h))))
    fns = {
        "feed-forward sublayer": sublayer_grad(
            (ff, ff_norm), lambda m, x: m[1](x, m[0], deterministic=True)
        ),
        "attention sublayer": sublayer_grad(
            (block.self_attention, block.self_attention_norm),
            lambda m, x: m[1](x, lambda y: m[0](y, **causal), deterministic=True),
        ),
        "attention core": attend_grad(4),
        "attention core, 2 blocks": attend_grad(2),
        "attention core, 1 block": attend_grad(1),
        "layer norm [16,256,256]": sublayer_grad(ln, lambda m, x: m(x)),
        "tanh-GELU [16,256,1024]": lambda: gelu_grad(h),
        "decoder block": sublayer_grad(
            block, lambda m, x: m(x, positions, pe=pe, deterministic=True)
        ),
        CHAINED: sublayer_grad(stack, chained),
    }
    got = _timed(fns, rounds=rounds, calls=calls, block=jax.block_until_ready)
    got[CHAINED] /= len(stack)
    trainers = {
        n: train_speed.JaxTrainer(
            dataclasses.replace(train_speed.REFERENCE, num_layers=n),
            positional="sinusoidal",
            dtype="float32",
        )
        for n in STEP_LAYERS
    }
    for n, tr in trainers.items():
        tr.label = f"{n} layers"
    return got | _step_split(trainers, rounds)


def kernel_gradients(rounds: int) -> list[tuple]:
    import jax
    import numpy as np

    dims = (((0,), (0,)), ((), ()))
    plain = jax.jit(lambda x, g: jax.lax.dot_general(x, g, dims))
    swapped = jax.jit(lambda x, g: jax.lax.optimization_barrier(jax.lax.dot_general(g, x, dims)).T)
    rows = []
    for n, d_in, d_out in KERNEL_SHAPES:
        x = jax.random.normal(jax.random.key(0), (n, d_in))
        g = jax.random.normal(jax.random.key(1), (n, d_out))
        calls = max(3, int(2e9 / (2 * n * d_in * d_out)))
        ms = _timed(
            {"plain": lambda x=x, g=g: plain(x, g), "swapped": lambda x=x, g=g: swapped(x, g)},
            rounds=rounds,
            calls=calls,
            block=jax.block_until_ready,
        )
        same = bool(np.array_equal(plain(x, g), swapped(x, g)))
        rows.append((n, d_in, d_out, ms["plain"], ms["swapped"], same))
    return rows


def bf16_parts(rounds: int, calls: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    from flaxformer_lite.core import attention, mixed_precision

    bf16 = jnp.bfloat16
    h32 = jax.random.normal(jax.random.key(0), (B, T, D_FF))
    h = h32.astype(bf16)
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(kk, (B, T, HEADS, HEAD_DIM)).astype(bf16) for kk in keys)
    pos = jnp.arange(T)

    def library(q, k, v):
        return attention.attend(q, k, v, q_positions=pos, k_positions=pos, causal=True)

    def bf16_products(q, k, v):  # `attend` as before 8a8333d (swapped while it is traced)
        with ab_step.swapped(ab_step.VARIANTS["bf16-before"]):
            return library(q, k, v)

    def grad(f):
        g = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32)), argnums=(0, 1, 2)))
        return lambda: g(q, k, v)

    gelu = jax.jit(jax.nn.gelu)
    gelu32 = jax.jit(lambda h: mixed_precision.elementwise_in_float32(jax.nn.gelu, h))
    fns = {
        "GELU forward, bf16 chain": lambda: gelu(h),
        "GELU forward, bf16 through float32": lambda: gelu32(h),
        "GELU forward, float32 input": lambda: gelu(h32),
        "causal attention fwd + bwd, bf16 products": grad(bf16_products),
        "causal attention fwd + bwd, attend (float32 on CPU)": grad(library),
    }
    return _timed(fns, rounds=rounds, calls=calls, block=jax.block_until_ready)


# --------------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    p.add_argument("--calls", type=int, default=10, help="calls per timed block")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--torch-python", default=None, help="interpreter with torch installed")
    p.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.torch_child:
        print(json.dumps(torch_parts(args.rounds, args.calls)))
        return
    from flaxformer_lite.train.allocator import configure_host_allocator

    configure_host_allocator()  # before JAX's CPU client exists, as train_speed does
    load_before = os.getloadavg()
    torch_ms = None
    if not args.no_torch:
        cmd = [args.torch_python or sys.executable, __file__, "--torch-child"]
        cmd += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        torch_ms = json.loads(done.stdout.strip().splitlines()[-1])
    jax_ms = jax_parts(args.rounds, args.calls)
    kernels = kernel_gradients(args.rounds)
    bf16 = bf16_parts(args.rounds, args.calls)
    load_after = os.getloadavg()
    print(
        f"- Machine: {train_speed._cpu_name()}, {os.cpu_count()} CPUs, "
        f"{train_speed._machine_line()}; Python {platform.python_version()}, "
        f"{train_speed._versions()}; commit {train_speed._git_commit()}"
    )
    print(
        f"- Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f}; "
        f"medians of {args.rounds} interleaved rounds of {args.calls} calls (PyTorch: the same, "
        "in a child process first)."
    )
    print("\n| part (forward + backward, float32) | JAX ms | PyTorch eager ms |")
    print("|---|--:|--:|")
    for name, ms in jax_ms.items():
        other = "" if torch_ms is None or name not in torch_ms else f"{torch_ms[name]:.1f}"
        print(f"| {name} | {ms:.2f} | {other} |")
    print(
        "\n| float32 kernel gradient `xᵀ g`, x `[n, d_in]`, g `[n, d_out]` (the library swaps "
        "on CPU where d_in > d_out) | plain ms | swapped ms | plain / swapped | values |"
    )
    print("|---|--:|--:|--:|---|")
    for n, d_in, d_out, a, b, same in kernels:
        values = "equal bit for bit" if same else "differ"
        print(
            f"| n {n}, d_in {d_in}, d_out {d_out} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {values} |"
        )
    print("\n| bf16 | ms |")
    print("|---|--:|")
    for name, ms in bf16.items():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
