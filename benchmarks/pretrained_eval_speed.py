"""Evaluating a pretrained model: this library's jitted forward vs transformers' PyTorch eager.

Builds one Llama-architecture model with random weights (transformers' ``LlamaConfig``, float32,
``attn_implementation="eager"``; default hidden 512, 8 layers, 8 heads, 4 KV heads,
intermediate 1408, vocab 16384, untied output layer: 40.4M parameters), saves it with
``save_pretrained`` into a temporary folder and evaluates one random token sequence (batch 1;
each length takes the prefix of one sequence) at every ``--lengths`` with

* this library: ``load_pretrained(folder, tokenizer=False)``, the forward ``jax.jit``-compiled
  ahead of time (``lower(...).compile()``: compile excluded) and called on the model's state;
* transformers: ``LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager")``
  under ``torch.no_grad()``, ``use_cache=False``.

Speed: for each length the two run in two worker processes started for that length, driven
round by round from this one and interleaved (the order alternates), so load from other
processes hits both alike; each round times ``--seconds`` worth of forward calls of each, after
one untimed call. Threads: PyTorch gets ``torch.set_num_threads(os.cpu_count())``; XLA:CPU's
intra-op pool has one thread per core by default (``os.cpu_count()`` too), so both use every
core. The library's worker uses its allocator settings (`flaxformer_lite.train.allocator`, as
benchmarks/train_speed.py), PyTorch glibc's defaults: each framework at its best.

Memory: measured in a fresh process per implementation and length with glibc's malloc
defaults (freed blocks go back to the system, so earlier work does not hide a peak): the
process resets the kernel's peak-RSS counter (``/proc/self/clear_refs``), reads its resident
set (``VmRSS``), runs one forward and reads the peak (``VmHWM``). The table's peak memory is
that peak minus the resident set before the call: activations, attention scores, logits and
each framework's temporaries, not the weights, the compiled program or the runtime. For
transformers that call is the first forward of its speed process (its warm-up, so any
one-time allocation counts against it); the library gets a process of its own (its speed
process runs with the tuned allocator, which keeps freed memory resident), measured after
compiling. ``--memory-length`` (default 16384) runs only this measurement, the library with
``attention_impl="chunked"``; transformers runs there too if its estimated peak (a quadratic
through its measured peaks) fits in 70% of the available memory, else the estimate is printed
instead. The time of that one call is printed too (one round).

Logits: the memory processes save their logits; max |lib - HF| is printed per length (at the
memory length against HF's longest measured length, over the positions both cover: the
model is causal, so the prefix's logits do not depend on the later tokens).

The matmul ceiling is train_speed's: a jitted 2048^2 float32 ``jnp.dot``, once per length.

    python benchmarks/pretrained_eval_speed.py   # 1k, 2k, 4k timed; 16k memory
    python benchmarks/pretrained_eval_speed.py --lengths 1024 --rounds 3 \
        --memory-length 0

It needs jax, flax, torch and transformers in one environment (``pip install -e '.[bench]'
transformers``). Prints a Markdown table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.attention_long import available_bytes

GOAL = 1.0  # library tokens/s over transformers' at every length


def build_model(folder: Path, args: argparse.Namespace) -> int:
    """Save a random-weight Llama into ``folder``; return its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(*args.lengths, args.memory_length),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- worker processes


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Set the kernel's peak-RSS counter (VmHWM) to the current resident set."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _lib_forward(folder: str, tokens, impl: str | None, cpu_matmul: str):
    import jax
    from flax import nnx

    from flaxformer_lite.pretrained import load_pretrained
    from flaxformer_lite.train import cpu_matmul as cpu_products

    overrides = {} if impl is None else {"attention_impl": impl}
    pretrained = load_pretrained(folder, tokenizer=False, **overrides)
    graphdef, state = nnx.split(pretrained.model)
    options = cpu_products.compiler_options(
        cpu_products.resolve(cpu_matmul, compute_dtype=pretrained.config.compute_dtype)
    )
    forward = jax.jit(
        lambda state, tokens: nnx.merge(graphdef, state)(tokens), compiler_options=options
    )
    x = jax.device_put(tokens)
    compiled = forward.lower(state, x).compile()
    label = pretrained.config.attention_impl
    return lambda: jax.block_until_ready(compiled(state, x)), label


def _hf_forward(folder: str, tokens):
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = LlamaForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    x = torch.from_numpy(tokens).long()

    def call():
        with torch.no_grad():
            return model(input_ids=x, use_cache=False).logits

    return call, f"eager, {torch.get_num_threads()} threads"


def worker(args: argparse.Namespace) -> None:
    """One implementation at one length, driven over stdin / stdout.

    Prints ``{"ready": label}`` once loaded and compiled; then answers ``memory`` (the RSS
    before one call and the peak during it; saves the logits to --logits) and ``time N``
    (seconds per call of N calls) with one JSON line each."""
    tokens = np.load(args.tokens)[None, : args.length].astype(np.int32)
    if args.worker == "lib":
        call, label = _lib_forward(args.folder, tokens, args.impl, args.cpu_matmul)
    else:
        call, label = _hf_forward(args.folder, tokens)
    print(json.dumps({"ready": label}), flush=True)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "memory":
            _reset_peak()
            before = _rss_bytes("VmRSS")
            t0 = time.perf_counter()
            out = call()
            seconds = time.perf_counter() - t0
            peak = _rss_bytes("VmHWM")
            np.save(args.logits, np.asarray(out, dtype=np.float32)[0])
            del out
            answer = {"seconds": seconds, "before": before, "peak": peak}
        else:
            n = int(rest[0])
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            answer = {"seconds": (time.perf_counter() - t0) / n}
        print(json.dumps(answer), flush=True)


class Worker:
    def __init__(self, kind: str, length: int, work: Path, args, *, impl=None, tuned=False):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            kind,
            "--folder",
            str(work / "model"),
            "--tokens",
            str(work / "tokens.npy"),
            "--length",
            str(length),
            "--logits",
            str(work / f"logits_{kind}_{length}.npy"),
            "--cpu-matmul",
            args.cpu_matmul,
        ]
        if impl is not None:
            cmd += ["--impl", impl]
        env = dict(os.environ)
        # the library's allocator settings apply in-process only where asked for (speed)
        env["FLAXFORMER_LITE_MALLOC"] = "tuned" if tuned else "default"
        if kind == "hf" and args.torch_wait_policy:
            env["OMP_WAIT_POLICY"] = args.torch_wait_policy
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.label = self.ask(None)["ready"]
        self.logits = work / f"logits_{kind}_{length}.npy"

    def ask(self, command: str | None) -> dict:
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a worker died; run it alone to see its error")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _tuned_allocator() -> None:
    """The library's speed worker: its allocator settings, before JAX's CPU client starts."""
    if os.environ.get("FLAXFORMER_LITE_MALLOC") == "tuned":
        from flaxformer_lite.train.allocator import configure_host_allocator

        os.environ.pop("FLAXFORMER_LITE_MALLOC")
        if not configure_host_allocator():
            raise RuntimeError("the library's allocator settings could not be applied")


# ---------------------------------------------------------------- the run


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def memory_run(kind: str, length: int, work: Path, args, impl=None) -> dict:
    w = Worker(kind, length, work, args, impl=impl)
    got = w.ask("memory")
    got["label"] = w.label
    w.close()
    got["delta"] = got["peak"] - got["before"]
    log(f"{kind} {length}: peak +{got['delta'] / 2**30:.2f} GiB, one call {got['seconds']:.2f} s")
    return got


def max_diff(a: Path, b: Path) -> float:
    x, y = np.load(a, mmap_mode="r"), np.load(b, mmap_mode="r")
    n = min(len(x), len(y))
    worst = 0.0
    for lo in range(0, n, 1024):
        hi = min(n, lo + 1024)
        worst = max(worst, float(np.max(np.abs(x[lo:hi] - y[lo:hi]))))
    return worst


def hf_estimate(measured: dict[int, float], length: int) -> float | None:
    """HF's peak at ``length`` from a quadratic (linear with two points) through its measured
    peaks; None without two measured lengths."""
    if len(measured) < 2:
        return None
    xs = sorted(measured)
    coef = np.polyfit(xs, [measured[x] for x in xs], min(2, len(xs) - 1))
    return float(np.polyval(coef, length))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 2048, 4096], help="timed lengths"
    )
    p.add_argument(
        "--memory-length",
        type=int,
        default=16384,
        help="length measured once for memory, the library with attention_impl='chunked' (0: none)",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per length")
    p.add_argument(
        "--long-rounds",
        type=int,
        default=None,
        help="rounds at lengths >= 4096 (default: --rounds), to keep the run short",
    )
    p.add_argument("--seconds", type=float, default=2.0, help="target seconds per timed block")
    p.add_argument(
        "--impl",
        default=None,
        help="attention_impl of the library at --lengths (default: what the mapping gives)",
    )
    p.add_argument(
        "--cpu-matmul",
        default="xla",
        choices=("auto", "onednn", "xla"),
        help="products of the library's forward (default 'xla': the jax.jit defaults that "
        "flaxformer_lite.evaluation uses; 'auto' is what training uses)",
    )
    p.add_argument(
        "--torch-wait-policy",
        choices=("ACTIVE", "PASSIVE"),
        help="OMP_WAIT_POLICY of the PyTorch worker (default: unset, OpenMP's own); PASSIVE "
        "keeps its threads from spinning, which helps on a machine other processes load",
    )
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    p.add_argument("--worker", choices=("lib", "hf"), help=argparse.SUPPRESS)
    for hidden in ("--folder", "--tokens", "--logits", "--length"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.length = int(args.length)
        _tuned_allocator()
        return worker(args)

    # here, not at the top: the PyTorch worker imports neither jax nor the library
    import jax.numpy as jnp
    import torch
    import transformers

    from benchmarks.train_speed import matmul_gflops

    long_rounds = args.rounds if args.long_rounds is None else args.long_rounds
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    rows, ceilings, hf_peaks = [], [], {}
    with tempfile.TemporaryDirectory(prefix="pretrained_eval_") as tmp:
        work = Path(tmp)
        n_params = build_model(work / "model", args)
        longest = max(*args.lengths, args.memory_length)
        rng = np.random.default_rng(0)
        np.save(work / "tokens.npy", rng.integers(0, args.vocab, longest, dtype=np.int32))
        for length in args.lengths:
            ceilings.append(matmul_gflops(jnp.float32))
            row = {"length": length, "lib": [], "hf": [], "ratios": []}
            lib = Worker("lib", length, work, args, impl=args.impl, tuned=True)
            hf = Worker("hf", length, work, args)
            row["lib_label"], row["hf_label"] = lib.label, hf.label
            # one untimed call each (it sets the calls per timed block); HF's, in its fresh
            # process, is also its memory measurement (`worker`'s "memory")
            once = {lib: lib.ask("time 1")["seconds"]}
            if not args.no_memory:
                row["hf_mem"] = hf.ask("memory")
                row["hf_mem"]["delta"] = row["hf_mem"]["peak"] - row["hf_mem"]["before"]
                hf_peaks[length] = row["hf_mem"]["delta"]
                once[hf] = row["hf_mem"]["seconds"]
            else:
                once[hf] = hf.ask("time 1")["seconds"]
            blocks = {w: max(1, round(args.seconds / once[w])) for w in (lib, hf)}
            for r in range(long_rounds if length >= 4096 else args.rounds):
                got = {}
                for w in (lib, hf) if r % 2 == 0 else (hf, lib):
                    got[w] = length / w.ask(f"time {blocks[w]}")["seconds"]
                row["lib"].append(got[lib])
                row["hf"].append(got[hf])
                row["ratios"].append(got[lib] / got[hf])
                log(f"{length} round {r}: lib {got[lib]:.0f} tok/s, HF {got[hf]:.0f} tok/s")
            lib.close()
            hf.close()
            if not args.no_memory:
                row["lib_mem"] = memory_run("lib", length, work, args, impl=args.impl)
                row["diff"] = max_diff(
                    work / f"logits_lib_{length}.npy", work / f"logits_hf_{length}.npy"
                )
            rows.append(row)
        memory_row = None
        if args.memory_length and not args.no_memory:
            length = args.memory_length
            memory_row = {"length": length}
            memory_row["lib_mem"] = memory_run("lib", length, work, args, impl="chunked")
            estimate = hf_estimate(hf_peaks, length)
            memory_row["hf_estimate"] = estimate
            if estimate is not None and estimate < 0.7 * available_bytes():
                memory_row["hf_mem"] = memory_run("hf", length, work, args)
                other = work / f"logits_hf_{length}.npy"
            elif hf_peaks:
                other = work / f"logits_hf_{max(hf_peaks)}.npy"
            else:
                other = None
            if other is not None:
                memory_row["diff"] = max_diff(work / f"logits_lib_{length}.npy", other)
                memory_row["diff_positions"] = min(length, int(other.stem.rsplit("_", 1)[1]))
    load_after = os.getloadavg()
    print(
        report(
            args,
            rows,
            memory_row,
            ceilings,
            n_params,
            started,
            load_before,
            load_after,
            torch.__version__,
            transformers.__version__,
        )
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def report(args, rows, memory_row, ceilings, n_params, started, lb, la, torch_v, hf_v) -> str:
    """The Markdown section: machine and setup lines, the table, the target's verdict."""
    from benchmarks.train_speed import _cpu_name, _git_commit, _versions

    lines = [
        f"- Machine: {_cpu_name()}, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}, {_versions()}, torch {torch_v}, "
        f"transformers {hf_v}; commit {_git_commit()}; started "
        f"{started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Load average (1 min) before / after: {lb[0]:.1f} / {la[0]:.1f}",
        f"- f32 `jnp.dot` 2048^2 ceiling: {statistics.median(ceilings):.0f} GFLOP/s (median of "
        f"{len(ceilings)}, {min(ceilings):.0f}-{max(ceilings):.0f})"
        if ceilings
        else "- f32 ceiling: not measured",
        f"- Model: Llama, hidden {args.hidden}, {args.layers} layers, {args.heads} heads "
        f"({args.kv_heads} KV), intermediate {args.intermediate}, vocab {args.vocab}, "
        f"{n_params / 1e6:.1f}M parameters, float32, batch 1; library products: "
        f"cpu_matmul={args.cpu_matmul!r}; threads: torch {os.cpu_count()} (OMP_WAIT_POLICY "
        f"{args.torch_wait_policy or 'unset'}), XLA default (one per core, {os.cpu_count()})",
        "",
        "| length | library attention | library tokens/s | HF eager tokens/s | library / HF "
        "(rounds) | library peak memory | HF peak memory | max abs logit diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for row in rows:
        lib, hf = statistics.median(row["lib"]), statistics.median(row["hf"])
        ratio = lib / hf
        verdicts.append(ratio >= GOAL)
        ratios = row["ratios"]
        rounds = f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)"
        mem_lib = _gib(row["lib_mem"]["delta"]) if "lib_mem" in row else "-"
        mem_hf = _gib(row["hf_mem"]["delta"]) if "hf_mem" in row else "-"
        diff = f"{row['diff']:.1e}" if "diff" in row else "-"
        lines.append(
            f"| {row['length']} | {row['lib_label']} | {lib:.0f} | {hf:.0f} | {rounds} | "
            f"{mem_lib} | {mem_hf} | {diff} |"
        )
    if memory_row is not None:
        m = memory_row
        lib_tps = m["length"] / m["lib_mem"]["seconds"]
        if "hf_mem" in m:
            hf_tps = m["length"] / m["hf_mem"]["seconds"]
            hf_cell, hf_mem = f"{hf_tps:.0f} (1 call)", _gib(m["hf_mem"]["delta"])
            ratio_cell = f"{lib_tps / hf_tps:.2f}x (1 call)"
        else:
            hf_cell, ratio_cell = "not run", "-"
            est = m["hf_estimate"]
            hf_mem = f"not run; est. {_gib(est)}" if est is not None else "not run"
        diff = f"{m['diff']:.1e} (first {m['diff_positions']} positions)" if "diff" in m else "-"
        lines.append(
            f"| {m['length']} | {m['lib_mem']['label']} | {lib_tps:.0f} (1 call) | {hf_cell} | "
            f"{ratio_cell} | {_gib(m['lib_mem']['delta'])} | {hf_mem} | {diff} |"
        )
    lines += [
        "",
        "Tokens/s: medians of the interleaved rounds (length / seconds per forward, batch 1). "
        "Peak memory: peak RSS minus RSS right before one forward, in a fresh process per "
        "implementation and length (glibc malloc defaults).",
        "",
        f"Target: library >= {GOAL:.1f}x HF eager at every length: "
        + ("met" if verdicts and all(verdicts) else "missed")
        + " in this run.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
