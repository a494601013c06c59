"""One step per compiled call against several (``train.steps_per_call``), as the loop trains.

Issue 15. Builds the quick preset's model (or ``--preset``) twice per setting, then times
them in ``--rounds`` interleaved rounds of ``--block`` steps each, doing per step what
`train.loop` does: the real batch of the step (`train.batches.TrainBatches`; for several
steps per call the batches stacked by the loop's own `_stack`), the jitted step with the
state donated, and the previous call's metrics read to the host while this one runs.
Prints each variant's median ms per step and its speed-up against the first; the second
copy of each setting shows the round-to-round noise.

    .venv/bin/python benchmarks/steps_per_call.py --steps-per-call 10 --rounds 11

A scratch measurement (the loop's own ``train_seconds`` also holds compiles, checkpoints and
the machine's drift between runs); the library's equality of the two is tested in
tests/test_train.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax

from benchmarks import train_speed
from experiments import extrapolation_lm
from flaxformer_lite.train import batches, loop
from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import RunConfig
from flaxformer_lite.train.step import init_train_state, make_multi_step, make_train_step


class Variant:
    """A model trained ``k`` steps per compiled call on ``source``'s batches."""

    def __init__(self, label: str, run: RunConfig, source: batches.TrainBatches, k: int):
        self.label, self.k, self.source, self.next_step = label, k, source, 0
        tx = make_optimizer(run.optim, run.train.num_steps)
        graphdef, self.state = init_train_state(loop.build_model(run), tx)
        schedule = learning_rate_schedule(run.optim, run.train.num_steps)
        one = make_train_step(graphdef, tx, schedule)
        self.fn = jax.jit(one if k == 1 else make_multi_step(one), donate_argnums=0)
        self.losses: list[float] = []

    def run(self, steps: int) -> None:
        pending = None
        for _ in range(steps // self.k):
            t = self.next_step
            if self.k == 1:
                batch = self.source(t)
            else:
                batch = loop._stack([self.source(s) for s in range(t, t + self.k)])
            self.state, metrics = self.fn(self.state, batch)
            self.next_step += self.k
            if pending is not None:
                self._read(pending)
            pending = metrics
        self._read(pending)

    def _read(self, metrics) -> None:
        self.losses += [float(x) for x in jax.device_get(metrics)["loss"].reshape(-1)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="quick", help="a preset of experiments/extrapolation_lm")
    p.add_argument("--positional", default="rope")
    p.add_argument("--steps-per-call", type=int, default=10)
    p.add_argument("--block", type=int, default=50, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    k = args.steps_per_call
    if k < 2 or args.block % k:
        p.error(f"--steps-per-call={k}: must be >= 2 and divide --block={args.block}")
    from flaxformer_lite.train.allocator import configure_host_allocator

    configure_host_allocator()  # before JAX's CPU client exists, as train_and_evaluate does
    c = extrapolation_lm.get_config(args.preset)
    c.model.positional = args.positional
    run = RunConfig.from_config(c)
    plan = run.eval_plan()
    source = batches.TrainBatches(run, batches.open_run_data(run, plan), plan)
    variants = [
        Variant(label, run, source, steps)
        for label, steps in (("1 step / call", 1), (f"{k} steps / call", k))
        for label, steps in ((label, steps), (f"{label}, again", steps))
    ]
    for v in variants:  # compile, and the first block of each
        v.run(args.block)
    load = os.getloadavg()[0]
    times = train_speed.measure(variants, rounds=args.rounds, steps=lambda v: args.block)
    base = statistics.median(times[variants[0].label])
    print(
        f"- {args.preset} preset, {args.positional}; jax {jax.__version__}; "
        f"{train_speed._machine_line()}; commit {train_speed._git_commit()}; load {load:.1f} / "
        f"{os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds of {args.block} steps, "
        "medians"
    )
    for v in variants:
        med = statistics.median(times[v.label])
        print(f"| {v.label} | {med * 1e3:.2f} ms/step | {base / med:.3f}x vs the first |")
    same = all(v.losses == variants[0].losses for v in variants)
    print(f"- every variant's {len(variants[0].losses)} losses equal bit for bit: {same}")


if __name__ == "__main__":
    main()
