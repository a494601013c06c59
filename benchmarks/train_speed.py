"""Training-speed benchmark: JAX train step vs an equivalent PyTorch eager model, one run.

Measures, in one invocation and interleaved round by round (so that load from other processes
hits every contestant alike; PyTorch runs in a worker process that the rounds drive block by
block, with glibc's default malloc, JAX in this one with the allocator settings of
`flaxformer_lite.train.allocator`, each framework at its best):

* the machine's f32 matmul ceiling: ``jnp.dot`` of two 2048 x 2048 float32 matrices
  (and the bf16 one with float32 accumulation, for reference), once per round;
* the reference model (decoder-only LM, 4 layers, d_model 256, 4 heads, d_ff 1024, pre-LN,
  GELU, tied embeddings, sinusoidal positions, seq 256, batch 16, AdamW with clipping):
  train tokens/s and MFU of `flaxformer_lite.train.step.make_train_step` (jitted exactly as
  `train.loop` does) and of the same model in PyTorch eager
  (``F.scaled_dot_product_attention(is_causal=True)``, ``torch.optim.AdamW``), each in
  float32 and in bf16 compute (JAX: ``ModelConfig.dtype="bfloat16"``, float32 parameters,
  float32 accumulation; PyTorch: ``torch.autocast("cpu", dtype=torch.bfloat16)``);
* the study's quick-preset model (d_model 64, 4 layers, 4 heads, d_ff 256, L=64,
  batch 32): ms per step (JAX, float32, per positional encoding), one step per compiled call
  (the preset itself trains several steps per call, ``train.steps_per_call``);
* compile time (JAX: lower + compile of the train step; PyTorch: its first step).

MFU counts model FLOPs the usual way (Kaplan et al. 2020 / PaLM appendix B): 6 x matmul
parameters x tokens plus 12 x layers x length x d_model per token for the attention score
and value products (the causal half that could be skipped is counted, as in PaLM), divided
by the measured f32 ``jnp.dot`` ceiling of the same run.

    .venv/bin/python benchmarks/train_speed.py                  # everything, 5 rounds
    .venv/bin/python benchmarks/train_speed.py --rounds 3 --no-torch

Prints a Markdown table (CPU, load average, Python / jax / jaxlib / flax / torch versions and
git commit) on stdout: every figure is the median of the rounds, the ceiling beside it. Then
the targets with "met" / "missed" from this run's medians (`targets`): reference f32 >= 1.1x
PyTorch eager f32, reference bf16 >= 1.0x PyTorch bf16 autocast, quick-model ms/step <=
PyTorch's; next to each ratio, the range of the per-round ratios (the two contestants' timed
blocks of one round, run within seconds of each other), which shows how far the machine's
drift moved it within the run. PyTorch is optional (``pip install -e '.[bench]'``); without
it the PyTorch rows and the targets are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train import cpu_matmul as cpu_products
from flaxformer_lite.train.allocator import configure_host_allocator
from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import OptimConfig
from flaxformer_lite.train.step import init_train_state, make_train_step

NUM_STEPS = 1000  # length of the LR schedule (irrelevant to speed)


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    d_model: int
    num_heads: int
    d_ff: int
    num_layers: int
    length: int
    batch: int
    vocab: int = 256

    def model_flops_per_token(self) -> float:
        """Training FLOPs per token: 6 N (matmul parameters incl. the tied output layer) plus
        the attention products 12 * layers * length * d_model (forward 4, backward 8)."""
        d, f, n = self.d_model, self.d_ff, self.num_layers
        matmul_params = n * (4 * d * d + 2 * d * f) + d * self.vocab
        return 6.0 * matmul_params + 12.0 * n * self.length * d


REFERENCE = Shape(
    "reference", d_model=256, num_heads=4, d_ff=1024, num_layers=4, length=256, batch=16
)
QUICK = Shape("quick", d_model=64, num_heads=4, d_ff=256, num_layers=4, length=64, batch=32)


def model_config(shape: Shape, *, positional: str, dtype: str, impl: str) -> ModelConfig:
    """The study's decoder (configs/extrapolation_lm.py) at ``shape``."""
    return ModelConfig(
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        num_heads=shape.num_heads,
        d_ff=shape.d_ff,
        num_encoder_layers=0,
        num_decoder_layers=shape.num_layers,
        dropout_rate=0.0,
        norm="pre",
        activation="gelu",
        positional=positional,
        positional_options={"learned": {"max_length": max(1024, shape.length)}},
        attention_impl=impl,
        dtype=dtype,
        param_dtype="float32",
    )


def make_batch(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, shape.vocab, (shape.batch, shape.length + 1), dtype=np.int32)
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_mask": np.ones((shape.batch, shape.length), np.float32),
        "positions": np.broadcast_to(
            np.arange(shape.length, dtype=np.int32), (shape.batch, shape.length)
        ).copy(),
    }


class Contestant:
    """Something that trains ``steps`` steps when called; records its compile time."""

    label: str
    compile_s: float

    def run(self, steps: int) -> None:
        raise NotImplementedError


class JaxTrainer(Contestant):
    """`make_train_step` jitted with the state donated, exactly as `train.loop` runs it with
    one step per call (``train.steps_per_call=1``) and ``train.cpu_matmul=cpu_matmul``."""

    def __init__(
        self,
        shape: Shape,
        *,
        positional: str,
        dtype: str,
        impl: str = "xla",
        cpu_matmul: str = "auto",
    ):
        self.label = f"JAX {dtype}" + ("" if impl == "xla" else f" ({impl})")
        cfg = model_config(shape, positional=positional, dtype=dtype, impl=impl)
        options = cpu_products.compiler_options(
            cpu_products.resolve(cpu_matmul, compute_dtype=cfg.compute_dtype)
        )
        optim = OptimConfig()
        tx = make_optimizer(optim, NUM_STEPS)
        model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
        graphdef, self.state = init_train_state(model, tx)
        schedule = learning_rate_schedule(optim, NUM_STEPS)
        self.batch = jax.device_put(make_batch(shape))
        fn = make_train_step(graphdef, tx, schedule)
        # Compile time on its own (ahead of time); the jitted function below compiles the
        # same program again on its first call and is what the loop runs.
        t0 = time.perf_counter()
        jax.jit(fn, donate_argnums=0, compiler_options=options).lower(
            self.state, self.batch
        ).compile()
        self.compile_s = time.perf_counter() - t0
        self.step = jax.jit(fn, donate_argnums=0, compiler_options=options)
        self.state, metrics = self.step(self.state, self.batch)
        self.loss = float(metrics["loss"])

    def run(self, steps: int) -> None:
        metrics = None
        for _ in range(steps):
            self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics)


class TorchTrainer(Contestant):
    """The same model in PyTorch eager: fused qkv projection, SDPA, AdamW + clipping."""

    def __init__(self, shape: Shape, *, dtype: str):
        import torch

        self.torch = torch
        self.label = f"PyTorch {dtype}" + (" (autocast)" if dtype == "bfloat16" else "")
        torch.manual_seed(0)
        self.model = _torch_model(shape)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        o = OptimConfig()
        self.opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": o.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=o.learning_rate,
            betas=(o.b1, o.b2),
            eps=o.eps,
        )
        self.clip = o.clip_norm
        self.autocast = dtype == "bfloat16"
        batch = make_batch(shape)
        self.inputs = torch.from_numpy(batch["inputs"]).long()
        self.targets = torch.from_numpy(batch["targets"]).long()
        t0 = time.perf_counter()
        self.run(1)
        self.compile_s = time.perf_counter() - t0  # eager: no compile; the first step

    def run(self, steps: int) -> None:
        torch = self.torch
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                logits = self.model(self.inputs)
                loss = torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), self.targets.flatten()
                )
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
        self.loss = float(loss.detach())


class _Remote(Contestant):
    """A contestant that lives in the PyTorch worker process."""

    def __init__(self, worker: TorchWorker, index: int, label: str, compile_s: float):
        self.worker, self.index, self.label, self.compile_s = worker, index, label, compile_s

    def run(self, steps: int) -> None:
        self.worker.ask(f"{self.index} {steps}")


class TorchWorker:
    """PyTorch in its own process (glibc malloc defaults), driven step block by step block
    over a pipe, so its rounds interleave with the JAX ones exactly as in-process ones would.
    """

    def __init__(self, specs: list[str], *, default_malloc: bool, python: str | None = None):
        cmd = [python or sys.executable, __file__, "--torch-worker", *specs]
        if default_malloc:
            cmd.append("--default-malloc")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.contestants = []
        for i in range(len(specs)):
            compile_s, label = self._read().split(" ", 1)
            self.contestants.append(_Remote(self, i, label, float(compile_s)))

    def _read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the PyTorch worker died; run it alone to see its error")
        return line.strip()

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def torch_worker(specs: list[str]) -> None:
    """Worker side: build one `TorchTrainer` per ``shape:dtype`` spec, then run blocks."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    shapes = {"reference": REFERENCE, "quick": QUICK}
    trainers = []
    for spec in specs:
        name, dtype = spec.split(":")
        trainers.append(TorchTrainer(shapes[name], dtype=dtype))
        print(f"{trainers[-1].compile_s} {trainers[-1].label}", flush=True)
    for line in sys.stdin:
        index, steps = map(int, line.split())
        trainers[index].run(steps)
        print("done", flush=True)


def _torch_model(shape: Shape):
    import torch
    from torch import nn
    from torch.nn import functional as F

    d, h = shape.d_model, shape.num_heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.wi, self.wo = nn.Linear(d, shape.d_ff), nn.Linear(shape.d_ff, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
            return x + self.wo(F.gelu(self.wi(self.ln2(x)), approximate="tanh"))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, d)
            nn.init.normal_(self.embed.weight, std=d**-0.5)
            self.blocks = nn.ModuleList([Block() for _ in range(shape.num_layers)])
            self.norm = nn.LayerNorm(d, eps=1e-6)
            pos = torch.arange(shape.length, dtype=torch.float32)[:, None]
            inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
            pe = torch.zeros(shape.length, d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
            self.register_buffer("pe", pe)

        def forward(self, tokens):
            x = self.embed(tokens) * d**0.5 + self.pe
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.T

    return LM()


def matmul_gflops(dtype) -> float:
    """GFLOP/s of one jitted ``jnp.dot`` of two 2048 x 2048 matrices (float32 accumulation)."""
    n = 2048
    x = jnp.ones((n, n), dtype) * jnp.asarray(0.01, dtype)
    f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    f(x, x).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        f(x, x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def measure(
    contestants: list[Contestant], *, rounds: int, steps: Callable[[Contestant], int]
) -> dict[str, list[float]]:
    """Seconds per step of every contestant, one short timed block each per round."""
    times: dict[str, list[float]] = {c.label: [] for c in contestants}
    for r in range(rounds):
        order = contestants if r % 2 == 0 else contestants[::-1]
        for c in order:
            n = steps(c)
            t0 = time.perf_counter()
            c.run(n)
            times[c.label].append((time.perf_counter() - t0) / n)
    return times


def _git_commit(*, repo: Path | None = None) -> str:
    """The short commit of ``repo``'s checkout (default: this file's), with " (+ uncommitted
    changes)" when a tracked file differs from it, or "unknown" outside a git checkout."""
    here = repo if repo is not None else Path(__file__).resolve().parent
    try:
        commit, dirty = (
            subprocess.run(
                ["git", *command], capture_output=True, text=True, cwd=here, check=True
            ).stdout
            for command in (
                ["rev-parse", "--short", "HEAD"],
                ["status", "--porcelain", "--untracked-files=no"],
            )
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.strip() + (" (+ uncommitted changes)" if dirty.strip() else "")


def _torch_version(python: str | None) -> str | None:
    """The torch version the worker will import (``python``'s, or this interpreter's)."""
    if python is None:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
    code = "import importlib.metadata as m; print(m.version('torch'))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _version_map() -> dict[str, str | None]:
    """The installed jax, jaxlib and flax versions (None: not installed); the speed depends
    on jaxlib."""
    found: dict[str, str | None] = {}
    for name in ("jax", "jaxlib", "flax"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _versions() -> str:
    """``jax X, jaxlib Y, flax Z``: the installed versions, as the report prints them."""
    return ", ".join(f"{k} {v or 'not installed'}" for k, v in _version_map().items())


def _cpu_name() -> str:
    """The CPU's model name and its matrix units (`matrix_units`), e.g. ``"AMD EPYC (AVX-512,
    AVX512-BF16, no AMX)"``; the name alone where ``/proc/cpuinfo`` cannot be read."""
    name = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return name
    return f"{name} ({matrix_units(set(flags))})"


def matrix_units(flags: set[str]) -> str:
    """What the CPU offers for bfloat16 and float32 products, from its ``/proc/cpuinfo`` flags:
    AMX tiles (``amx_bf16``: the bfloat16 matrix engine), AVX-512 and its BF16 dot products,
    else AVX2; "no AMX" where there is none, so a figure says which kind of machine it is."""
    units = []
    if "amx_tile" in flags:
        units.append("AMX" + (" bf16" if "amx_bf16" in flags else ""))
    if "avx512f" in flags:
        units.append("AVX-512")
        if "avx512_bf16" in flags:
            units.append("AVX512-BF16")
    elif "avx2" in flags:
        units.append("AVX2")
    if "amx_tile" not in flags:
        units.append("no AMX")
    return ", ".join(units)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--seconds", type=float, default=3.0, help="target seconds per timed block")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc malloc at its defaults (see flaxformer_lite/train/allocator.py)",
    )
    p.add_argument("--no-quick", action="store_true", help="leave the quick model out")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--impl", default="xla", help="attention implementation of the JAX models")
    p.add_argument(
        "--cpu-matmul",
        default="auto",
        choices=cpu_products.CHOICES,
        help="train.cpu_matmul of the JAX steps (default: the library's, 'auto')",
    )
    p.add_argument("--positional", default="sinusoidal", help="reference model's encoding")
    p.add_argument("--quick-positional", nargs="+", default=["alibi", "rope", "sinusoidal"])
    p.add_argument(
        "--xla-flags",
        default="",
        help="extra XLA flags for the JAX side (appended to $XLA_FLAGS before JAX's CPU client "
        "starts), e.g. '--xla_cpu_use_onednn=true'; printed with the results",
    )
    p.add_argument(
        "--torch-python",
        help="interpreter of the PyTorch worker (default: this one), e.g. another venv's python "
        "when this one's Python has no CPU wheel of the torch version to compare with; the "
        "worker must be able to import this file's imports (jax, flax)",
    )
    p.add_argument("--torch-worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.torch_worker:
        return torch_worker(args.torch_worker)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
    if not args.default_malloc:
        # As train_and_evaluate does, before JAX's CPU client exists (importing jax does not
        # start it). PyTorch runs in a worker process with glibc's defaults: the tuning (one
        # malloc arena) slows its multi-threaded bf16 kernels by ~40% (docs/performance.md),
        # and each framework gets its best setting.
        configure_host_allocator()
    torch = None  # the installed PyTorch version; PyTorch itself is only imported by the worker
    if not args.no_torch:
        torch = _torch_version(args.torch_python)
        if torch is None:
            print("PyTorch is not installed: PyTorch rows left out.", file=sys.stderr)

    load_before = os.getloadavg()
    specs = [f"reference:{dt}" for dt in args.dtypes] + ([] if args.no_quick else ["quick:float32"])
    worker = (
        TorchWorker(specs, default_malloc=args.default_malloc, python=args.torch_python)
        if torch
        else None
    )
    ref: list[Contestant] = []
    for i, dtype in enumerate(args.dtypes):
        ref.append(
            JaxTrainer(
                REFERENCE,
                positional=args.positional,
                dtype=dtype,
                impl=args.impl,
                cpu_matmul=args.cpu_matmul,
            )
        )
        if worker is not None:
            ref.append(worker.contestants[i])
    quick: list[Contestant] = []
    if not args.no_quick:
        for pe in args.quick_positional:
            c = JaxTrainer(
                QUICK, positional=pe, dtype="float32", impl=args.impl, cpu_matmul=args.cpu_matmul
            )
            c.label = f"JAX float32 {pe}"
            quick.append(c)
        if worker is not None:
            c = worker.contestants[-1]
            c.label = "PyTorch float32 sinusoidal"
            quick.append(c)

    # Steps per timed block from one timed step of each contestant.
    per_step = {}
    for c in ref + quick:
        t0 = time.perf_counter()
        c.run(1)
        per_step[c.label] = time.perf_counter() - t0
    steps = lambda c: max(1, round(args.seconds / per_step[c.label]))

    ceiling, ceiling_bf16 = [], []
    times: dict[str, list[float]] = {c.label: [] for c in ref + quick}
    for r in range(args.rounds):
        ceiling.append(matmul_gflops(jnp.float32))
        ceiling_bf16.append(matmul_gflops(jnp.bfloat16))
        for group in (ref, quick):
            for label, ts in measure(
                group if r % 2 == 0 else group[::-1], rounds=1, steps=steps
            ).items():
                times[label] += ts
    load_after = os.getloadavg()
    if worker is not None:
        worker.close()
    run = (args, torch, ref, quick, times, ceiling, ceiling_bf16, load_before, load_after)
    print(report(*run))


def report(args, torch, ref, quick, times, ceiling, ceiling_bf16, load_before, load_after) -> str:
    """The Markdown section: setup, reference-model table, quick-model table, targets."""
    peak, peak_bf16 = statistics.median(ceiling), statistics.median(ceiling_bf16)
    med = {label: statistics.median(ts) for label, ts in times.items()}
    flops = REFERENCE.model_flops_per_token()
    tok = REFERENCE.batch * REFERENCE.length
    lines = [
        f"- Machine: {_cpu_name()}, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}, "
        f"{_versions()}"
        + (f", torch {torch}" if torch is not None else "")
        + (f" (worker: {args.torch_python})" if torch and args.torch_python else "")
        + f"; commit {_git_commit()}; JAX malloc "
        + ("glibc defaults" if args.default_malloc else "tuned (train/allocator.py)")
        + f"; JAX products {_products(args)}"
        + "; PyTorch in a worker process with glibc defaults"
        + (f"; XLA_FLAGS={os.environ['XLA_FLAGS']!r}" if os.environ.get("XLA_FLAGS") else ""),
        f"- Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f}; "
        f"{args.rounds} interleaved rounds of ~{args.seconds:g} s per contestant, medians.",
        f"- f32 `jnp.dot` 2048^2 ceiling: {peak:.0f} GFLOP/s (median of rounds, "
        f"{min(ceiling):.0f}-{max(ceiling):.0f}); bf16 x bf16 -> f32: {peak_bf16:.0f} GFLOP/s.",
        "",
        f"Reference model: {REFERENCE.num_layers} layers, d_model {REFERENCE.d_model}, "
        f"{REFERENCE.num_heads} heads, d_ff {REFERENCE.d_ff}, seq {REFERENCE.length}, batch "
        f"{REFERENCE.batch}, AdamW; {flops / 1e6:.1f} MFLOP per token; {args.positional} "
        "positions.",
        "",
        "| framework | compute | compile (s) | ms/step | tokens/s | GFLOP/s | MFU (f32 ceiling) "
        "| vs PyTorch f32 | vs PyTorch same compute |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    torch_f32 = med.get("PyTorch float32")
    for c in ref:
        s = med[c.label]
        fw, dt = c.label.split(" ", 1)
        same = next(
            (med[o.label] for o in ref if o.label.startswith("PyTorch " + dt.split()[0])), None
        )
        is_torch = fw == "PyTorch"
        vs_f32 = "" if (is_torch and dt == "float32") or not torch_f32 else f"{torch_f32 / s:.2f}x"
        vs_same = "" if is_torch or not same else f"{same / s:.2f}x"
        compile_s = f"{c.compile_s:.1f}" if not is_torch else f"(eager; 1st step {c.compile_s:.1f})"
        lines.append(
            f"| {fw} | {dt} | {compile_s} | {s * 1e3:.0f} | {tok / s:.0f} | "
            f"{tok / s * flops / 1e9:.0f} | {tok / s * flops / 1e9 / peak:.0%} | {vs_f32} | "
            f"{vs_same} |"
        )
    if quick:
        lines += [
            "",
            f"Quick-preset model: {QUICK.num_layers} layers, d_model {QUICK.d_model}, "
            f"{QUICK.num_heads} heads, d_ff {QUICK.d_ff}, L={QUICK.length}, batch "
            f"{QUICK.batch}, AdamW, float32.",
            "",
            "| model | compile (s) | ms/step (median) | fastest round | tokens/s |",
            "|---|---|---|---|---|",
        ]
        for c in quick:
            ts = times[c.label]
            s = med[c.label]
            compile_s = f"{c.compile_s:.1f}" if c.label.startswith("JAX") else "(eager)"
            lines.append(
                f"| {c.label} | {compile_s} | {s * 1e3:.1f} | {min(ts) * 1e3:.1f} | "
                f"{QUICK.batch * QUICK.length / s:.0f} |"
            )
    lines += [
        "",
        "Targets, from this run's medians (a target is met on this machine when the median "
        "ratio meets it):",
        "",
        "| target | measured | this run |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {got} | {status} |" for name, got, status in targets(med, args.impl, times)
    ]
    return "\n".join(lines)


def ratio_text(ratio: float, goal: float) -> str:
    """``ratio`` as printed beside a verdict on ``ratio >= goal``: two decimals, or as many
    more as it takes for the printed figure to fall on the verdict's side of ``goal`` (a
    ratio of 0.9962 against 1.0 prints "0.996x", which "1.00x" beside "missed" would hide)."""
    for digits in range(2, 7):
        text = f"{ratio:.{digits}f}"
        if (float(text) >= goal) == (ratio >= goal):
            return text + "x"
    return f"{ratio!r}x"


TARGETS = (
    # (JAX label, {impl}: the attention implementation's suffix; PyTorch label; goal; name)
    ("JAX float32{impl}", "PyTorch float32", 1.1, "reference f32 >= 1.1x PyTorch eager f32"),
    (
        "JAX bfloat16{impl}",
        "PyTorch bfloat16 (autocast)",
        1.0,
        "reference bf16 (f32 accumulation) >= 1.0x PyTorch bf16 autocast",
    ),
    (
        "JAX float32 sinusoidal",
        "PyTorch float32 sinusoidal",
        1.0,
        "quick model ms/step <= PyTorch's (same model: sinusoidal)",
    ),
)


def target_results(
    med: dict[str, float], impl: str = "xla", times: dict[str, list[float]] | None = None
) -> list[dict]:
    """The targets whose contestants ran, as numbers: ``name``, ``goal``, the two
    ``contestants`` (JAX, PyTorch), their median ``jax_ms`` / ``pytorch_ms``, ``ratio``
    (PyTorch time / JAX time, > 1: JAX faster), ``met`` (``ratio >= goal``) and, with
    ``times`` (label -> seconds per step of each round) of two rounds or more, the range
    ``rounds_min`` / ``rounds_max`` of the per-round ratios (round r's two timed blocks ran
    within seconds of each other). ``med``: label -> median seconds per step; ``impl``: the
    JAX attention implementation, part of the JAX reference labels."""
    out = []
    suffix = "" if impl == "xla" else f" ({impl})"
    for mine, other, goal, name in TARGETS:
        mine = mine.format(impl=suffix)
        if mine not in med or other not in med:
            continue
        result = {
            "name": name,
            "goal": goal,
            "contestants": [mine, other],
            "jax_ms": med[mine] * 1e3,
            "pytorch_ms": med[other] * 1e3,
            "ratio": med[other] / med[mine],
        }
        result["met"] = result["ratio"] >= goal
        if times and len(times.get(mine, ())) == len(times.get(other, ())) > 1:
            rounds = [o / m for m, o in zip(times[mine], times[other], strict=True)]
            result["rounds_min"], result["rounds_max"] = min(rounds), max(rounds)
        out.append(result)
    return out


def targets(
    med: dict[str, float], impl: str = "xla", times: dict[str, list[float]] | None = None
) -> list[tuple[str, str, str]]:
    """(target, measured, "met" / "missed") for each target whose contestants ran, as the
    report prints them (`target_results` has the numbers). The verdict is the medians'
    ratio; the measured column adds the range of the per-round ratios, so a reader sees how
    far the machine's drift moved the ratio within the run."""
    out = []
    for t in target_results(med, impl, times):
        ratio = ratio_text(t["ratio"], t["goal"])
        measured = f"{ratio} ({t['jax_ms']:.1f} vs {t['pytorch_ms']:.1f} ms/step"
        if "rounds_min" in t:
            measured += f"; rounds {t['rounds_min']:.2f}-{t['rounds_max']:.2f}x"
        out.append((t["name"], measured + ")", "met" if t["met"] else "missed"))
    return out


def _products(args: argparse.Namespace) -> str:
    """What the JAX steps used, e.g. ``train.cpu_matmul='auto' (float32: onednn, bfloat16:
    xla)``: `cpu_products.resolve` per compute dtype, on this jaxlib."""
    dtypes = dict.fromkeys([*args.dtypes, *([] if args.no_quick else ["float32"])])
    used = ", ".join(
        f"{dt}: {cpu_products.resolve(args.cpu_matmul, compute_dtype=jnp.dtype(dt))}"
        for dt in dtypes
    )
    return f"train.cpu_matmul={args.cpu_matmul!r} ({used})"


if __name__ == "__main__":
    main()
