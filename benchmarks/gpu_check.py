"""A ready GPU check: attention kernels, a bf16 train step, MFU, a quick study, GPU tests.

One command on a machine with one NVIDIA GPU (``benchmarks/gpu_check.sh`` installs the CUDA
jax wheel first and calls this) runs five checks, each timed and each in its
own try/except, so one failing check never hides the others (its traceback goes to stderr):

a. attention: `flaxformer_lite.core.attention.attend` with "cudnn" and "auto" (the fused
   kernel) and "chunked" against "xla", causal, bf16 and f32 inputs where they apply; max
   absolute difference against "xla" on the same inputs, with the tolerance stated. Where the
   fused kernel cannot run (no GPU) the cudnn row says "skipped: no GPU (backend=cpu)" after
   checking that "cudnn" refuses with a ValueError as documented, never a silent pass; on a
   GPU the program must contain the cuDNN fused-attention call.
b. bf16 train step: the study's decoder (`benchmarks/train_speed.py` `model_config`) with
   ``dtype="bfloat16"`` against float32 from the same initial parameters on the same batch:
   every loss finite, the first losses within a relative tolerance, the loss falling.
c. MFU: a 116M-parameter byte decoder (the GPT-2 small class) at seq 1024 in bf16 with
   attention_impl="auto", timed after compile (the mean of its timed steps); MFU = model FLOPs
   per token (6 x matmul parameters + 12 x layers x length x d_model,
   `train_speed.Shape.model_flops_per_token`) x tokens/s / the device's peak dense bf16
   FLOP/s (its ceiling), compared with ``--mfu-goal`` from this run's measurement only.
d. quick study: ``flaxformer-lite study --config=extrapolation_lm:quick
   --config.model.attention_impl=auto`` in a subprocess; wall time and rows of all five
   encodings in results.jsonl.
e. GPU-relevant tests: pytest on the attention, chunked attention and mixed precision files.

Without a GPU (or with ``--cpu-fallback``) every check shrinks to tiny sizes (about a minute,
mostly compiles, half of them the study's five cells), the study uses the ``tiny`` preset cut
to one layer and 2 steps, and the tests run only with ``--with-tests``. Status per row:
``pass`` / ``fail``; ``skipped: <why>`` (not run here); ``met`` / ``missed`` (MFU against the
goal: a measurement, it does not change the exit status unless ``--fail-on-missed-goal``);
``n/a on CPU``. The exit status is 1 if any row failed.

    .venv/bin/python benchmarks/gpu_check.py                  # on a GPU: budget 8 minutes
    .venv/bin/python benchmarks/gpu_check.py --cpu-fallback   # anywhere: about a minute

On a GPU the parts are sized to fit 8 minutes together (the study's 5 x 1000 steps and compiles
are the largest part; the MFU model's compile next); ``--budget-s`` prints the total against it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the package from a clone that is not installed

FALLBACK_NOTE = "no GPU: CPU fallback, tiny sizes"
# Peak dense (not 2:4 sparse) bf16 tensor-core FLOP/s from NVIDIA's datasheets, matched against
# `jax.Device.device_kind` in this order (the first pattern that matches wins, so "H100 PCIe"
# comes before "H100" and "L40S" before "L4"):
#   H100 / H200 datasheets (nvidia.com/en-us/data-center/h100, .../h200): BF16 Tensor Core
#     1,979 TFLOPS "with sparsity" for SXM (H100 SXM and H200 SXM), 1,513 for H100 PCIe,
#     1,671 for H100 NVL and H200 NVL; dense is half.
#   A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 Tensor Core 312 TFLOPS dense
#     (624 with sparsity), SXM and PCIe alike.
#   L40S datasheet: BF16 733 TFLOPS with sparsity (362 dense); L4 datasheet: BF16 242 TFLOPS
#     with sparsity (121 dense).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"H100.*PCIe", 756e12),
    (r"H100.*NVL|H200.*NVL", 835e12),
    (r"H200|H100", 989e12),
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
)
# The MFU model: 12 layers, d_model 896 (14 heads of 64), d_ff 4 x d_model, byte vocabulary.
# Matmul parameters 12 x (4 x 896^2 + 2 x 896 x 3584) + 896 x 256 = 115.8M (the nearest
# GPT-2-small-like size with head_dim 64 and a 256-entry vocabulary; GPT-2 small's 124M count
# includes a 38.6M embedding of 50,257 tokens); the check prints the model's actual count.
MFU_DIMS = dict(d_model=896, num_heads=14, d_ff=3584, num_layers=12, length=1024)
TINY_DIMS = dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, length=32)
# Tolerances of the attention check: |impl - xla| <= atol + rtol * |xla| elementwise. bf16
# outputs are rounded to 8 significant bits (a spacing of 2^-7 relative), so a few units in
# the last place; f32 is compared at "highest" matmul precision (no TF32) and differs only by
# summation order.
ATTENTION_TOL = {"bfloat16": (1e-2, 2e-2), "float32": (1e-5, 1e-4)}
# bf16 vs f32 train step: same parameters and batch, so the first loss differs only by
# rounding; after a few steps the trajectories may drift a little more.
BF16_FIRST_RTOL = 1e-2
BF16_LAST_RTOL = 5e-2
# The fallback study: the tiny preset cut to one layer, 2 steps and one evaluation length, so
# five encodings train and evaluate in a few seconds each (the compiles dominate).
FALLBACK_STUDY_OVERRIDES = (
    "--config.train.num_steps=2",
    "--config.train.checkpoint_every=2",
    "--config.train.log_every=1",
    "--config.eval.length_multiples=(1,)",
    "--config.eval.max_bytes=256",
    "--config.model.num_decoder_layers=1",
)
TEST_FILES = (
    "tests/core/test_core_attention.py",
    "tests/core/test_core_chunked_attention.py",
    "tests/core/test_core_mixed_precision.py",
)
CHECKS = ("attention", "bf16", "mfu", "study", "tests")


@dataclasses.dataclass
class Row:
    """One line of the table: a check, what it measured, its seconds and its status."""

    check: str
    result: str
    seconds: float
    status: str


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each check runs: full on a GPU, tiny in the CPU fallback."""

    fallback: bool
    attention_shapes: tuple[tuple[int, int, int, int], ...]
    step_dims: dict
    step_batch: int
    step_count: int
    mfu_dims: dict
    mfu_steps: int
    study_preset: str
    study_overrides: tuple[str, ...]
    study_timeout_s: int
    tests_timeout_s: int


def sizes_for(fallback: bool, args: argparse.Namespace) -> Sizes:
    """The sizes of every check (``args``: batch, steps, study preset and overrides)."""
    if fallback:
        return Sizes(
            fallback=True,
            attention_shapes=((2, 64, 2, 16), (1, 96, 2, 32)),
            step_dims=TINY_DIMS,
            step_batch=4,
            step_count=4,
            mfu_dims=TINY_DIMS,
            mfu_steps=3,
            study_preset=args.study_preset or "tiny",
            study_overrides=(*FALLBACK_STUDY_OVERRIDES, *args.study_override),
            study_timeout_s=150,
            tests_timeout_s=600,  # the CPU runs them only with --with-tests
        )
    return Sizes(
        fallback=False,
        attention_shapes=((4, 1024, 12, 64), (2, 2048, 8, 128)),
        # train_speed.py's reference model: 4 layers, d_model 256, seq 256, batch 16
        step_dims=dict(d_model=256, num_heads=4, d_ff=1024, num_layers=4, length=256),
        step_batch=16,
        step_count=10,
        mfu_dims=MFU_DIMS,
        mfu_steps=args.steps,
        study_preset=args.study_preset or "quick",
        study_overrides=tuple(args.study_override),
        study_timeout_s=300,
        tests_timeout_s=240,
    )


# ----------------------------------------------------------------------------- arithmetic


def peak_flops(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of an NVIDIA device named ``device_kind``, or None if unknown."""
    for pattern, peak in PEAK_BF16_FLOPS:
        if re.search(pattern, device_kind, flags=re.IGNORECASE):
            return peak
    return None


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak FLOP/s (a fraction)."""
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be positive; got {peak}")
    return flops_per_token * tokens_per_second / peak


def mfu_status(value: float | None, goal: float, *, on_gpu: bool) -> str:
    """The MFU row's status: met / missed against ``goal`` on a GPU, n/a on a CPU, or the
    hint to pass --peak-tflops when the device's peak is unknown."""
    if not on_gpu:
        return "n/a on CPU"
    if value is None:
        return "unknown peak: pass --peak-tflops"
    return "met" if value >= goal else "missed"


# ----------------------------------------------------------------------------- provenance


def _train_speed():
    """`benchmarks/train_speed.py` (its model, batch and provenance helpers)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import train_speed

    return train_speed


def _device_name() -> str:
    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"{_train_speed()._cpu_name()} ({os.cpu_count()} CPUs, backend=cpu)"
    return f"{device.device_kind} (backend={jax.default_backend()}, {jax.device_count()} device(s))"


def header(fallback: bool) -> str:
    mode = FALLBACK_NOTE if fallback else "full sizes"
    return (
        f"GPU check: device {_device_name()}; {_train_speed()._versions()}; Python "
        f"{platform.python_version()}; commit {_train_speed()._git_commit()}; mode: {mode}"
    )


# ----------------------------------------------------------------------------- running checks


def run_check(name: str, fn: Callable[[], tuple[str, str]]) -> Row:
    """``fn() -> (result, status)`` timed; an exception becomes a failed row and a traceback
    on stderr (one failing check never hides the others, and never passes silently)."""
    print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        result, status = fn()
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        message = " ".join(str(e).split())
        result, status = f"error: {type(e).__name__}: {message[:300]}", "fail"
    row = Row(name, result, time.perf_counter() - t0, status)
    # each row as it ends too: a run stopped by its timeout still shows what it measured
    print(f"[gpu_check] {name}: {status} ({row.seconds:.1f} s): {result}", file=sys.stderr)
    return row


@functools.partial(jax.jit, static_argnames="implementation")
def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, implementation: str):
    """`attend` with ``causal=True`` and positions ``0..length-1``, jitted (one compile per
    shape, dtype and implementation, so the "xla" reference is compiled once per input)."""
    from flaxformer_lite.core.attention import attend

    positions = jnp.arange(q.shape[1], dtype=jnp.int32)
    return attend(
        q,
        k,
        v,
        q_positions=positions,
        k_positions=positions,
        causal=True,
        implementation=implementation,
    )


def _uses_cudnn(impl: str, q, k, v) -> bool:
    """Whether the program JAX emits for ``impl`` on these inputs calls cuDNN's fused
    attention (the ``__cudnn$fmha...`` custom calls of `jax.nn.dot_product_attention`)."""
    return "__cudnn$fmha" in causal_attention.lower(q, k, v, implementation=impl).as_text()


def _attention_inputs(shape, dtype, seed: int):
    keys = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys]


def attention_check(impl: str, dtype: str, shapes: Sequence[tuple[int, ...]]) -> tuple[str, str]:
    """``impl`` against "xla" on the same causal ``[batch, length, heads, head_dim]`` inputs.

    "cudnn" without a GPU must refuse (a ValueError, as documented) and reads "skipped"; on a
    GPU its program must call cuDNN's fused attention, and so must "auto"'s in bf16.
    """
    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    if impl == "cudnn" and not on_gpu:
        q, k, v = _attention_inputs(shapes[0], dtype, 0)
        try:
            causal_attention(q, k, v, implementation="cudnn")
        except ValueError as e:
            return (
                f"raises ValueError as documented ({str(e).split(':')[0]})",
                f"skipped: no GPU (backend={backend})",
            )
        raise AssertionError("implementation='cudnn' ran without a GPU instead of refusing")
    atol, rtol = ATTENTION_TOL[dtype]
    worst, bad, paths = 0.0, [], set()
    with jax.default_matmul_precision("highest"):
        for i, shape in enumerate(shapes):
            q, k, v = _attention_inputs(shape, dtype, i)
            ref = np.asarray(causal_attention(q, k, v, implementation="xla"), np.float32)
            out = np.asarray(causal_attention(q, k, v, implementation=impl), np.float32)
            if not np.all(np.isfinite(out)):
                bad.append(f"non-finite output at {list(shape)}")
            diff = np.abs(out - ref)
            worst = max(worst, float(diff.max()))
            if np.any(diff > atol + rtol * np.abs(ref)):
                bad.append(f"{list(shape)}: max |diff| {diff.max():.2e}")
            if impl in ("cudnn", "auto"):
                fused = on_gpu and _uses_cudnn(impl, q, k, v)
                paths.add("fused cuDNN" if fused else "fallback")
    result = (
        f"max |diff| {worst:.1e} over {len(shapes)} shapes "
        f"(tol {atol:g} + {rtol:g}|xla|; {', '.join('x'.join(map(str, s)) for s in shapes)})"
    )
    if impl == "cudnn" and paths != {"fused cuDNN"}:
        bad.append("no cuDNN fused-attention call in the program")
    if impl == "auto":
        result += f"; path: {'/'.join(sorted(paths))}"
        if "fallback" in paths:
            result += f" ({_fused_refusal(shapes[0], dtype)})"
            if on_gpu and dtype == "bfloat16":  # the fused kernel should run here
                bad.append("auto did not use the fused kernel for bf16 on a GPU")
    if bad:
        result += "; FAILED: " + "; ".join(bad)
    return result, "fail" if bad else "pass"


def _fused_refusal(shape, dtype: str) -> str:
    """Why "cudnn" cannot run these inputs here (the reason "auto" fell back)."""
    q, k, v = _attention_inputs(shape, dtype, 0)
    try:
        causal_attention(q, k, v, implementation="cudnn")
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return (
            " ".join(str(e).split())
            .split(". Use ")[0]
            .removeprefix("implementation='cudnn' cannot run here: ")
        )
    return "cudnn runs these inputs, but auto did not use it"


_STEPS: dict[tuple, Callable] = {}  # jitted train steps by (shape, dtype, impl, ...)


def _train(
    ts, shape, *, dtype: str, impl: str, positional: str, steps: int, untimed: int = 0
) -> tuple[list[float], float | None, float, int]:
    """``(losses, compile_s, seconds_per_step, num_params)`` of ``steps`` jitted train steps
    of the study's decoder on one repeated batch, as `train.loop` runs them (state donated).

    The first step compiles (``compile_s``: its seconds, None when the same model ran before
    and its program was reused) and its loss is that of the initial parameters; it and the
    next ``untimed`` warm-up steps are left out of ``seconds_per_step``.
    """
    from flax import nnx

    from flaxformer_lite.nn.models import DecoderOnlyLM
    from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
    from flaxformer_lite.train.run_config import OptimConfig
    from flaxformer_lite.train.step import init_train_state, make_train_step

    if steps < untimed + 2:
        raise ValueError(f"steps={steps} leaves no timed step after {untimed + 1} untimed ones")
    cfg = ts.model_config(shape, positional=positional, dtype=dtype, impl=impl)
    optim = OptimConfig(warmup_steps=1)  # a falling loss within a few steps
    schedule_steps = max(steps, 10)
    tx = make_optimizer(optim, schedule_steps)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))  # the same parameters for every dtype
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    graphdef, state = init_train_state(model, tx)
    del model
    batch = jax.device_put(ts.make_batch(shape))
    key = (dataclasses.astuple(shape)[1:], dtype, impl, positional, schedule_steps)
    reused = key in _STEPS
    if not reused:  # the fallback's MFU model is the bf16 check's: compile it once
        fn = make_train_step(graphdef, tx, learning_rate_schedule(optim, schedule_steps))
        _STEPS[key] = jax.jit(fn, donate_argnums=0)
    step = _STEPS[key]
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    losses = [metrics["loss"]]
    jax.block_until_ready(metrics)
    compile_s = None if reused else time.perf_counter() - t0  # compile and first step
    for _ in range(untimed):
        state, metrics = step(state, batch)
        losses.append(metrics["loss"])
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(steps - untimed - 1):
        state, metrics = step(state, batch)
        losses.append(metrics["loss"])
    jax.block_until_ready(state)
    per_step = (time.perf_counter() - t0) / (steps - untimed - 1)
    return [float(x) for x in losses], compile_s, per_step, num_params


def _count(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,.0f}"


def bf16_step_check(sizes: Sizes, positional: str) -> tuple[str, str]:
    """bf16 compute against float32 from the same initial parameters on the same batch."""
    ts = _train_speed()
    shape = ts.Shape("bf16-step", batch=sizes.step_batch, **sizes.step_dims)
    f32, bf16 = (
        _train(ts, shape, dtype=dtype, impl="auto", positional=positional, steps=sizes.step_count)[
            0
        ]
        for dtype in ("float32", "bfloat16")
    )
    first = abs(bf16[0] - f32[0]) / abs(f32[0])
    last = abs(bf16[-1] - f32[-1]) / abs(f32[-1])
    bad = []
    if not all(np.isfinite(bf16)):
        bad.append("a bf16 loss is not finite")
    if first > BF16_FIRST_RTOL:
        bad.append(f"first loss off by {first:.1%} > {BF16_FIRST_RTOL:.0%}")
    if last > BF16_LAST_RTOL:
        bad.append(f"last loss off by {last:.1%} > {BF16_LAST_RTOL:.0%}")
    if not bf16[-1] < bf16[0]:
        bad.append("the bf16 loss did not fall on a repeated batch")
    result = (
        f"{len(bf16)} steps, {positional}, {shape.num_layers}L d{shape.d_model} "
        f"L={shape.length} b{shape.batch}: loss bf16 {bf16[0]:.4f} -> {bf16[-1]:.4f}, "
        f"f32 {f32[0]:.4f} -> {f32[-1]:.4f}; rel. diff first {first:.1e} "
        f"(tol {BF16_FIRST_RTOL:g}), last {last:.1e} (tol {BF16_LAST_RTOL:g})"
    )
    if bad:
        result += "; FAILED: " + "; ".join(bad)
    return result, "fail" if bad else "pass"


def mfu_check(sizes: Sizes, args: argparse.Namespace, on_gpu: bool) -> tuple[str, str]:
    """Tokens/s of the bf16 decoder after compile, and its MFU against the device's peak."""
    ts = _train_speed()
    # the fallback's MFU model is the bf16 check's bf16 model (compiled once, `_STEPS`)
    batch = sizes.step_batch if sizes.fallback else args.batch
    shape = ts.Shape("mfu", batch=batch, **sizes.mfu_dims)
    steps = sizes.mfu_steps + 2  # + the compiling step and one warm-up step, not timed
    _, compile_s, per_step, num_params = _train(
        ts, shape, dtype="bfloat16", impl="auto", positional=args.positional, steps=steps, untimed=1
    )
    tokens_per_s = shape.batch * shape.length / per_step
    flops = shape.model_flops_per_token()
    device = jax.devices()[0].device_kind
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(device)
    value = None if peak is None else mfu(flops, tokens_per_s, peak)
    matmul = (flops - 12.0 * shape.num_layers * shape.length * shape.d_model) / 6.0
    result = (
        f"{_count(num_params)} params ({_count(matmul)} matmul), {shape.num_layers}L "
        f"d{shape.d_model} L={shape.length} b{shape.batch}, {args.positional}, bf16, auto; "
        + ("program of the bf16 check" if compile_s is None else f"compile {compile_s:.1f} s")
        + f"; {per_step * 1e3:.1f} ms/step over {steps - 2} steps; "
        f"{tokens_per_s:,.0f} tok/s; {flops * tokens_per_s / 1e12:.3g} TFLOP/s"
    )
    if value is None:
        result += f"; MFU unknown: no peak for {device!r} (pass --peak-tflops)"
    else:
        source = "--peak-tflops" if args.peak_tflops else device
        result += (
            f"; MFU {value:.1%} of {peak / 1e12:g} TFLOP/s ({source}), goal {args.mfu_goal:.0%}"
        )
    if on_gpu and sizes.fallback:
        return result, "n/a: tiny sizes (--cpu-fallback)"
    return result, mfu_status(value, args.mfu_goal, on_gpu=on_gpu)


def study_check(sizes: Sizes) -> tuple[str, str]:
    """The study with attention_impl=auto via the console command; rows of all 5 encodings."""
    try:
        from flaxformer_lite.configs.extrapolation_lm import ENCODINGS as encodings
    except ModuleNotFoundError:  # a clone that is not installed: its configs/ folder
        sys.path.insert(0, str(ROOT / "configs"))
        from extrapolation_lm import ENCODINGS as encodings
    script = Path(sys.executable).with_name("flaxformer-lite")
    prog = [str(script)] if script.exists() else [sys.executable, "-m", "flaxformer_lite"]
    with tempfile.TemporaryDirectory(prefix="gpu_check_study_") as workdir:
        cmd = [
            *prog,
            "study",
            f"--config=extrapolation_lm:{sizes.study_preset}",
            f"--workdir={workdir}",
            "--progress=false",
            "--config.model.attention_impl=auto",
            *sizes.study_overrides,
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, timeout=sizes.study_timeout_s
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            return f"exit status {proc.returncode} after {wall:.0f} s: {last[:300]}", "fail"
        results = Path(workdir) / "results.jsonl"
        rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    found = sorted({r["encoding"] for r in rows})
    missing = sorted(set(encodings) - set(found))
    backends = sorted({str(r.get("backend")) for r in rows})
    result = (
        f"preset {sizes.study_preset}, wall {wall:.0f} s; {len(rows)} rows, "
        f"{len(found)}/{len(encodings)} encodings ({', '.join(found)}); "
        f"backend {'/'.join(backends)}"
    )
    if missing:
        return result + f"; FAILED: no rows for {', '.join(missing)}", "fail"
    return result, "pass"


def tests_check(files: Sequence[str], timeout_s: int) -> tuple[str, str]:
    """pytest on ``files``: its counts, pass iff pytest exits 0."""
    missing = [f for f in files if not (ROOT / f.split("::")[0]).exists()]
    if missing:
        return f"missing test files: {', '.join(missing)}", "fail"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "4"]  # one process compiles hundreds of small programs in a row
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    summary = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    pattern = r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)"
    counts = {kind: int(n) for n, kind in re.findall(pattern, summary)}
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-2000:])
    text = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or summary[:200]
    result = f"{text} ({', '.join(Path(f).name for f in files)})"
    return result, "pass" if proc.returncode == 0 else "fail"


# ----------------------------------------------------------------------------- report


def table(rows: Sequence[Row]) -> str:
    lines = ["| check | result | seconds | status |", "|---|---|---|---|"]
    for r in rows:
        result = r.result.replace("|", "\\|")
        lines.append(f"| {r.check} | {result} | {r.seconds:.1f} | {r.status} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Status: pass / fail; skipped: <why>; met / missed (MFU vs goal); n/a on CPU. "
        "Exit status 1 if any row failed.",
    )
    p.add_argument(
        "--cpu-fallback",
        action="store_true",
        help="tiny sizes everywhere (automatic when jax.default_backend() is not 'gpu')",
    )
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="a failed row if JAX sees no GPU (gpu_check.sh passes it when nvidia-smi finds one)",
    )
    p.add_argument(
        "--checks",
        nargs="+",
        choices=CHECKS,
        default=list(CHECKS),
        help="run only these checks (the others read 'skipped: not selected')",
    )
    p.add_argument("--batch", type=int, default=8, help="MFU check: sequences per step on a GPU")
    p.add_argument("--steps", type=int, default=20, help="MFU check: timed steps on a GPU")
    p.add_argument(
        "--positional",
        default="rope",
        help="encoding of the bf16 and MFU models (one without a bias, so 'auto' can use cuDNN)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="peak dense bf16 TFLOP/s of the device (default: NVIDIA's datasheet by name)",
    )
    p.add_argument("--mfu-goal", type=float, default=0.45, help="MFU goal (fraction)")
    p.add_argument(
        "--fail-on-missed-goal", action="store_true", help="exit 1 when the MFU goal is missed"
    )
    p.add_argument("--study-preset", default=None, help="default: quick (GPU), tiny (fallback)")
    p.add_argument(
        "--study-override",
        action="append",
        default=[],
        metavar="--config.a.b=V",
        help="extra override for the study (repeatable; fallback already cuts tiny to 2 steps)",
    )
    tests = p.add_mutually_exclusive_group()
    tests.add_argument(
        "--with-tests", action="store_true", help="run the tests (default on a GPU only)"
    )
    tests.add_argument("--no-tests", action="store_true", help="leave the tests out")
    p.add_argument("--tests", nargs="+", default=list(TEST_FILES), help="test files or node ids")
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="the total time the full run should fit (printed against the total)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The study and the tests run in child processes on the same GPU: without this, this
    # process would take 75% of its memory up front and leave them the rest.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    fallback = args.cpu_fallback or not on_gpu
    sizes = sizes_for(fallback, args)
    with_tests = args.with_tests or (not fallback and not args.no_tests)
    print(header(fallback), flush=True)
    t_start = time.perf_counter()
    rows: list[Row] = []
    if args.require_gpu and not on_gpu:
        rows.append(
            Row(
                "GPU backend",
                f"JAX's backend is {backend!r}: the CUDA jax wheel is missing or does not match "
                "the driver (see jax.print_environment_info())",
                0.0,
                "fail",
            )
        )
    selected = set(args.checks)

    def skip(name: str, why: str) -> None:
        rows.append(Row(name, "not run", 0.0, f"skipped: {why}"))

    attention_rows = [
        ("cudnn", "bfloat16"),
        ("auto", "bfloat16"),
        ("auto", "float32"),
        ("chunked", "bfloat16"),
        ("chunked", "float32"),
    ]
    for impl, dtype in attention_rows:
        name = f"attention {impl} vs xla ({dtype}, causal)"
        if "attention" not in selected:
            skip(name, "not selected")
            continue
        shapes = sizes.attention_shapes
        rows.append(run_check(name, lambda i=impl, d=dtype, s=shapes: attention_check(i, d, s)))
    checks = (
        ("bf16", "bf16 train step vs f32", lambda: bf16_step_check(sizes, args.positional)),
        ("mfu", "MFU (bf16, auto)", lambda: mfu_check(sizes, args, on_gpu)),
        ("study", "study attention_impl=auto", lambda: study_check(sizes)),
    )
    for key, name, fn in checks:
        if key in selected:
            rows.append(run_check(name, fn))
        else:
            skip(name, "not selected")
        if key == "mfu":  # free the compiled programs before the child processes start
            _STEPS.clear()
            jax.clear_caches()
    name = "tests (attention, chunked, mixed precision)"
    if "tests" not in selected:
        skip(name, "not selected")
    elif not with_tests:
        skip(name, "CPU fallback (pass --with-tests)" if fallback else "--no-tests")
    else:
        rows.append(run_check(name, lambda: tests_check(args.tests, sizes.tests_timeout_s)))
    total = time.perf_counter() - t_start
    print()
    print(table(rows))
    print()
    within = "within" if total <= args.budget_s else "OVER"
    print(f"Total {total:.0f} s ({within} the budget of {args.budget_s:.0f} s, --budget-s).")
    failed = [r for r in rows if r.status == "fail"]
    if args.fail_on_missed_goal:
        failed += [r for r in rows if r.status == "missed"]
    if failed:
        print(f"FAILED: {', '.join(r.check for r in failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
