"""A/B of the train step against the library's earlier forms, in one process (issue 15).

Builds `train_speed.JaxTrainer` once per variant (a variant swaps one library function for
its form before a change, for the trace of its own trainer only), then times them in
``--rounds`` interleaved rounds of a few steps each and prints each variant's median ms per
step and its speed-up against the first. Variants:

* ``library``: the code as it is (twice, as ``library`` and ``library-again``, to show
  the round-to-round noise);
* ``plain-kernel-gradient``: float32 kernel gradients always ``dot_general(x2, g2)``,
  never swapped (before `34a1ab3`);
* ``bf16-before``: the feed-forward GELU in the compute dtype and bf16 attention with bf16
  products (before `8a8333d`);
* ``xla-products``: the step compiled with XLA's own CPU products, ``train.cpu_matmul="xla"``
  (before `d8463cc`; the other variants use the library's ``"auto"``: oneDNN's products for
  a float32 step, and for a bfloat16 step on a jaxlib that leaves its ``bf16 x bf16 -> f32``
  products to XLA, e.g. 0.10.2: `cpu_matmul.onednn_takes_bf16_products`).

    .venv/bin/python benchmarks/ab_step.py --shape reference --dtype float32 \\
        --variants library,plain-kernel-gradient,library-again,plain-kernel-gradient-again
    .venv/bin/python benchmarks/ab_step.py --shape reference --dtype bfloat16 \\
        --variants bf16-before,library,bf16-before-again,library-again
    .venv/bin/python benchmarks/ab_step.py --shape reference --dtype float32 --rounds 7 \\
        --variants xla-products,library,xla-products-again,library-again
    .venv/bin/python benchmarks/ab_step.py --shape reference --dtype bfloat16 --rounds 7 \\
        --variants xla-products,library,xla-products-again,library-again

A name with the suffix ``-again`` builds the same variant a second time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from benchmarks import train_speed
from flaxformer_lite.core import mixed_precision
from flaxformer_lite.nn import layers


def _plain_kernel_gradient(x2, g2):
    return jax.lax.dot_general(x2, g2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _ffn_in_compute_dtype(self, x):
    act = jax.nn.relu if self.activation == "relu" else jax.nn.gelu
    return self.wo(act(self.wi(x)))


def _never_low_precision(dtype) -> bool:
    return False


# each variant: (object, attribute, replacement) swapped while its trainer is traced
VARIANTS = {
    "library": [],
    "plain-kernel-gradient": [(mixed_precision, "_kernel_gradient", _plain_kernel_gradient)],
    "bf16-before": [
        (layers.FeedForward, "__call__", _ffn_in_compute_dtype),
        (mixed_precision, "is_low_precision", _never_low_precision),
    ],
    "xla-products": [],
}
# variants that change the step's train.cpu_matmul (the others keep the library's default)
CPU_MATMUL = {"xla-products": "xla"}


@contextlib.contextmanager
def swapped(patches):
    old = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        yield
    finally:
        for obj, name, value in old:
            setattr(obj, name, value)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=("reference", "quick"), default="reference")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--variants", default="library,plain-kernel-gradient")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    names = args.variants.split(",")
    for name in names:
        if name.removesuffix("-again") not in VARIANTS:
            p.error(f"--variants: unknown {name!r}; known: {', '.join(VARIANTS)} (+ '-again')")
    from flaxformer_lite.train.allocator import configure_host_allocator

    configure_host_allocator()  # before JAX's CPU client exists, as train_speed does
    shape = train_speed.REFERENCE if args.shape == "reference" else train_speed.QUICK
    trainers = {}
    for name in names:
        # `attend` reads is_low_precision through the module at trace time: the swap holds
        # for the trainer's first (tracing) step, which its constructor runs
        variant = name.removesuffix("-again")
        with swapped(VARIANTS[variant]):
            trainer = train_speed.JaxTrainer(
                shape,
                positional="sinusoidal",
                dtype=args.dtype,
                cpu_matmul=CPU_MATMUL.get(variant, "auto"),
            )
        trainer.label = name
        trainers[name] = trainer
    steps = 4 if shape is train_speed.REFERENCE else 40
    load = os.getloadavg()[0]
    times = train_speed.measure(list(trainers.values()), rounds=args.rounds, steps=lambda c: steps)
    base = statistics.median(times[names[0]])
    print(
        f"- {args.shape} model, {args.dtype}; {train_speed._machine_line()}; commit "
        f"{train_speed._git_commit()}; load {load:.1f} / {os.getloadavg()[0]:.1f}; "
        f"{args.rounds} interleaved rounds of {steps} steps, medians"
    )
    for name in names:
        med = statistics.median(times[name])
        print(
            f"| {name} | {med * 1e3:.1f} ms | {base / med:.3f}x vs {names[0]} | "
            f"loss after the first step {trainers[name].loss:.6f} |"
        )


if __name__ == "__main__":
    main()
