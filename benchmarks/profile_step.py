"""Where one training step's time goes: a profile breakdown, JAX vs PyTorch eager (issue 15).

Builds the train_speed.py contestants (`train_speed.JaxTrainer`, `train_speed.TorchTrainer`)
at one shape and compute dtype, warms them up, times ``--steps`` steps without a profiler,
then profiles ``--steps`` more and prints one Markdown section: provenance, a category table
(JAX | PyTorch, ms per step), a phase table (forward / backward / optimizer update) and the
ten costliest ops of each framework.

JAX: the steps run under ``jax.profiler.trace(create_perfetto_trace=True)``. XLA:CPU writes
one Chrome-trace ``X`` event per executed HLO instruction (thunk), named after it, with
``args.hlo_op`` / ``args.hlo_module``; ``ThunkExecutor::Execute`` (the executor's loop),
``PjitFunction(...)`` (Python dispatch) and ``ThreadpoolListener::*`` (pool task markers) are
not op executions and are left out, so no time is counted twice. Each op is joined by name
with the optimized HLO text of the same compiled step (``.lower(state, batch).compile()``)
and classified: matmul (a ``dot`` / ``convolution``, alone or inside a fusion such as
YNNPACK's ``ynn_fusion``, or a oneDNN / YNNPACK matmul custom call), attention batched
matmul (such a dot with batch dimensions), elementwise / reduce, copy / transpose /
broadcast / convert (data movement only), other (gather / scatter, RNG, control flow), and
optimizer: every op whose ``metadata={op_name=...}`` lies outside the gradient (no
``jvp(`` in it: optax's AdamW, the global-norm clipping and the step's metrics), whatever its
kind. The same ``op_name`` gives the phase: ``transpose(jvp(...))`` backward, ``jvp(...)``
forward.

Op time is summed over threads (XLA:CPU's intra-op pool has one thread per core and runs
independent ops side by side), so it can exceed the wall time. Some ops (Eigen ``dot``s)
return before their work is done: the work runs as pool tasks outside any op event, and
an ``end: <op>`` marker records its completion. Such pool-task time (``ThreadpoolListener``
regions on the pool threads outside op events and outside the executor's loop) is
attributed to the asynchronous ops in flight at that moment (split evenly), else to the ops
running on other threads (their parallel helpers), else reported as unattributed; the
category table gives JAX's op time without and with it.

PyTorch: ``torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True)``
around the statements of `TorchTrainer.run`, labelled forward / backward / update with
``record_function`` (zero_grad, clipping and ``AdamW.step`` are the update); self CPU time
per event (``prof.events()``; its total equals ``key_averages()``'s), grouped by name and by
enclosing op (``scaled_dot_product`` -> attention; ``Optimizer.step`` / ``_foreach_*`` /
the update label -> optimizer). Self CPU time is measured on the calling thread: the
OpenMP threads inside one op are not added up as JAX's pool threads are, so compare shares
of each framework's total, not milliseconds, between the two columns. PyTorch runs in a
child process with glibc's default malloc (as in train_speed.py); JAX runs in this one
with `flaxformer_lite.train.allocator.configure_host_allocator` unless ``--default-malloc``.

    .venv/bin/python benchmarks/profile_step.py --shape quick --steps 3
    .venv/bin/python benchmarks/profile_step.py --shape reference --dtype bfloat16 --steps 5 \
        --framework both --out /tmp/profile_ref_bf16

``--out DIR`` keeps the raw traces (``jax_trace.json.gz``, ``torch_trace.json``) and the
optimized HLO text (``jax_step.hlo.txt``) there. Times are taken with the profiler on;
the untraced ms/step of the same run is printed next to them.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_speed  # configures nothing on import; its main() does

SHAPES = {"quick": train_speed.QUICK, "reference": train_speed.REFERENCE}
JSON_TAG = "PROFILE_STEP_JSON "

# (key, table label); "pool" and "overhead" are framework-specific rows.
CATEGORIES = (
    ("matmul", "matmul (dense)"),
    ("attention", "attention batched matmul"),
    ("elementwise", "elementwise / reduce"),
    ("copy", "copy / transpose / broadcast / convert"),
    ("optimizer", "optimizer update"),
    ("other", "other ops (gather/scatter, fill, RNG, control flow)"),
    ("overhead", "framework overhead (Python, autograd nodes)"),
    ("pool", "pool tasks not attributable to an op"),
    ("unclassified", "unclassified"),
)
PHASES = ("forward", "backward", "update", "none")

# --------------------------------------------------------------------------- HLO text

_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_DATA_MOVEMENT = {
    "copy",
    "transpose",
    "broadcast",
    "slice",
    "concatenate",
    "pad",
    "dynamic-slice",
    "dynamic-update-slice",
    "convert",
    "reverse",
    "copy-start",
    "copy-done",
}
_FREE = {"parameter", "constant", "bitcast", "reshape", "tuple", "get-tuple-element", "iota"}
_OTHER = {
    "gather",
    "scatter",
    "sort",
    "rng",
    "rng-bit-generator",
    "rng-get-and-update-state",
    "while",
    "conditional",
    "call",
    "custom-call",
    "after-all",
    "infeed",
    "outfeed",
}
_MATMUL_CALL = re.compile(r"matmul|gemm|onednn|ynn|xnn|conv|dot", re.IGNORECASE)


class Instr:
    __slots__ = (
        "attrs",
        "batched",
        "calls",
        "comp",
        "name",
        "op_name",
        "opcode",
        "operands",
        "shape",
    )

    def __init__(self, name, shape, opcode, rest, comp):
        self.name, self.shape, self.opcode, self.comp = name, shape, opcode, comp
        depth, end = 1, len(rest)
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        operand_text, self.attrs = rest[:end], rest[end + 1 :]
        self.operands = [
            tok.split()[-1].lstrip("%") for tok in _split_top(operand_text) if tok.strip()
        ]
        self.calls = re.findall(
            r"(?:calls|body|condition|branch_computations)=\{?%?([\w.\-]+)", rest
        )
        self.calls += [
            c.strip().lstrip("%")
            for m in re.findall(r"(?:calls|branch_computations)=\{([^}]*)\}", rest)
            for c in m.split(",")
        ]
        m = re.search(r'op_name="([^"]*)"', rest)
        self.op_name = m.group(1) if m else ""
        m = re.search(r"lhs_batch_dims=\{([^}]*)\}", rest)
        self.batched = bool(m and m.group(1).strip())


def _split_top(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


class Hlo:
    """Instructions of an optimized HLO module's text, by name, with their computations."""

    def __init__(self, text: str):
        self.module = ""
        self.instrs: dict[str, Instr] = {}
        self.comps: dict[str, list[Instr]] = {}
        comp = None
        for line in text.splitlines():
            if line.startswith("HloModule"):
                self.module = line.split()[1].rstrip(",")
                continue
            if line and not line[0].isspace() and line.rstrip().endswith("{"):
                comp = re.match(r"^(?:ENTRY\s+)?%?([^\s(]+)", line).group(1)
                self.comps[comp] = []
                continue
            m = _INSTR_RE.match(line)
            if m and comp is not None:
                ins = Instr(m.group(2), m.group(3), m.group(4), m.group(5), comp)
                self.instrs.setdefault(ins.name, ins)
                self.comps[comp].append(ins)
        self._cache: dict[str, tuple[str, str]] = {}
        self.op_names: dict[str, str] = {}  # op_name metadata, the fused body's if need be

    def _body(self, ins: Instr, seen: set[str]) -> list[Instr]:
        """``ins`` and every instruction of the computations it calls, recursively."""
        out = [ins]
        for c in ins.calls:
            if c in seen or c not in self.comps:
                continue
            seen.add(c)
            for sub in self.comps[c]:
                out += self._body(sub, seen)
        return out

    def classify(self, name: str) -> tuple[str, str]:
        """(kind, phase) of the instruction ``name``; kind "unclassified" if it is unknown."""
        if name in self._cache:
            return self._cache[name]
        ins = self.instrs.get(name)
        if ins is None:
            return "unclassified", "none"
        body = self._body(ins, set())
        opcodes = {i.opcode for i in body} - {"fusion"}
        dots = [i for i in body if i.opcode in ("dot", "convolution")]
        calls = [i for i in body if i.opcode == "custom-call"]
        if dots:
            kind = "attention" if any(d.batched for d in dots) else "matmul"
        elif any(_MATMUL_CALL.search(c.attrs) for c in calls):
            kind = "matmul"
        elif opcodes & _OTHER:
            kind = "other"
        elif opcodes - _FREE <= _DATA_MOVEMENT:
            kind = "copy"
        else:
            kind = "elementwise"
        op_name = ins.op_name or next((i.op_name for i in reversed(body) if i.op_name), "")
        if "transpose(jvp" in op_name:
            phase = "backward"
        elif "jvp(" in op_name:
            phase = "forward"
        elif op_name.startswith("jit("):
            phase = "update"
        else:
            phase = "none"
        self._cache[name] = kind, phase
        self.op_names[name] = op_name
        return kind, phase

    def shapes(self, name: str) -> str:
        """``result <- operand, operand`` shapes of the instruction ``name``."""
        ins = self.instrs.get(name)
        if ins is None:
            return "?"
        local = {i.name: i for i in self.comps.get(ins.comp, [])}
        ops = [_short_shape(local[o].shape) for o in ins.operands if o in local]
        return _short_shape(ins.shape) + (" <- " + ", ".join(ops) if ops else "")


def _short_shape(shape: str) -> str:
    shape = re.sub(r"\{[^{}]*\}", "", shape)  # layouts
    shape = re.sub(r"/\*index=\d+\*/", "", shape)
    return shape if len(shape) <= 60 else shape[:57] + "..."


def category(kind: str, phase: str) -> str:
    return "optimizer" if phase == "update" and kind != "unclassified" else kind


# --------------------------------------------------------------------------- JAX trace


def _subtract(intervals: list[tuple[float, float]], holes: list[tuple[float, float]]):
    """Parts of the disjoint sorted ``intervals`` not covered by ``holes``."""
    merged: list[list[float]] = []
    for a, b in sorted(holes):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [m[0] for m in merged]
    out = []
    for a, b in intervals:
        cur = a
        j = max(0, bisect.bisect_right(starts, a) - 1)
        while j < len(merged) and merged[j][0] < b:
            ha, hb = merged[j]
            if hb > cur:
                if ha > cur:
                    out.append((cur, min(ha, b)))
                cur = max(cur, hb)
            j += 1
        if cur < b:
            out.append((cur, b))
    return out


def analyze_trace(events: list[dict], hlo: Hlo) -> dict:
    """Per-op times of a Chrome trace of XLA:CPU executions of ``hlo``'s module."""
    threads = {
        (e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "?")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    xs = [e for e in events if e.get("ph") == "X"]
    ops = [
        e
        for e in xs
        if "hlo_op" in e.get("args", {})
        and e["args"].get("hlo_module", hlo.module) in (hlo.module, "")
    ]
    source = "args.hlo_op"
    if not ops:  # a trace format without hlo_op args: fall back on names of HLO instructions
        source = "event names matching HLO instructions"
        ops = [e for e in xs if e.get("name") in hlo.instrs]
    if not ops:
        names = collections.Counter(e.get("name", "") for e in xs)
        return {
            "error": "the trace has no per-op events (no X events with args.hlo_op, none "
            "named after an instruction of the compiled step); most frequent event names: "
            + ", ".join(f"`{n}`" for n, _ in names.most_common(8))
        }
    for e in ops:
        e["_op"] = e.get("args", {}).get("hlo_op") or e["name"]
        e["_key"] = (e.get("pid"), e.get("tid"))
        e["_end"] = e["ts"] + e.get("dur", 0.0)
        e["_self"] = e.get("dur", 0.0)
    # self time: an op event that encloses others on its thread (a while loop running its
    # body's thunks) keeps only the time outside them, so nothing is counted twice
    stacks: dict[tuple, list[dict]] = collections.defaultdict(list)
    for e in sorted(ops, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
        stack = stacks[e["_key"]]
        while stack and stack[-1]["_end"] <= e["ts"]:
            stack.pop()
        if stack and e["_end"] <= stack[-1]["_end"] + 1e-3:
            stack[-1]["_self"] -= e.get("dur", 0.0)
        stack.append(e)
    # completion markers ("end: <op>"), paired in time order with the op's executions
    ends = collections.defaultdict(list)
    for e in xs:
        if e.get("name", "").startswith("end: "):
            ends[e["name"][5:]].append(e["ts"] + e.get("dur", 0.0))
    by_name = collections.defaultdict(list)
    for e in sorted(ops, key=lambda e: e["ts"]):
        by_name[e["_op"]].append(e)
    markers = 0
    for name, lst in by_name.items():
        times = sorted(ends.get(name, []))
        j = 0
        for e in lst:
            while j < len(times) and times[j] < e["ts"]:
                j += 1
            e["_done"] = e["_end"]
            if j < len(times):
                e["_done"] = max(e["_end"], times[j])
                markers += 1
                j += 1

    # pool-task time outside op events and outside the executor's loop, on the pool threads
    pool = {k for k, n in threads.items() if "eigen" in n.lower()}
    per_thread = collections.defaultdict(list)
    for e in xs:
        key = (e.get("pid"), e.get("tid"))
        if key in pool:
            per_thread[key].append(e)
    pieces = []
    for key, lst in per_thread.items():
        lst.sort(key=lambda e: e["ts"])
        regions, start = [], None
        for e in lst:
            if e["name"] == "ThreadpoolListener::StartRegion":
                start = e["ts"]
            elif e["name"] == "ThreadpoolListener::StopRegion" and start is not None:
                regions.append((start, e["ts"]))
                start = None
        holes = [
            (e["ts"], e["ts"] + e.get("dur", 0.0))
            for e in lst
            if "hlo_op" in e.get("args", {}) or e["name"].startswith("ThunkExecutor::Execute")
        ]
        pieces += [(a, b, key) for a, b in _subtract(regions, holes) if b > a]
    helper = _attribute(pieces, ops)
    for e, h in zip(ops, helper["per_op"], strict=True):
        e["_helper"] = h

    runs = collections.defaultdict(list)
    for e in ops:
        runs[e.get("args", {}).get("run_id", "all")].append(e)
    spans = [max(e["_done"] for e in r) - min(e["ts"] for e in r) for r in runs.values()]
    op_threads = collections.Counter()
    for e in ops:
        op_threads[threads.get(e["_key"], str(e["_key"]))] += e["_self"]
    return {
        "ops": ops,
        "source": source,
        "runs": len(runs),
        "span_us": sum(spans) / len(spans),
        "pool_threads": len(pool),
        "pool_total_us": sum(b - a for a, b, _ in pieces),
        "pool_unattributed_us": helper["unattributed"],
        "markers": markers,
        "op_threads": op_threads,
    }


def _attribute(pieces: list[tuple[float, float, tuple]], ops: list[dict]) -> dict:
    """Split the pool-task ``pieces`` among the ops in flight (sweep over time): async ops
    (after their event, before their ``end:`` marker) first, else ops running on another
    thread; what finds neither is unattributed."""
    points = []
    for i, (a, b, key) in enumerate(pieces):
        points += [(a, 1, "p", i, key), (b, 0, "p", i, key)]
    for i, e in enumerate(ops):
        points += [(e["ts"], 1, "s", i, e["_key"]), (e["_end"], 0, "s", i, e["_key"])]
        if e["_done"] > e["_end"] + 1.0:
            points += [(e["_end"], 1, "a", i, None), (e["_done"], 0, "a", i, None)]
    points.sort(key=lambda p: (p[0], p[1]))
    active = {"p": {}, "s": {}, "a": {}}
    per_op = [0.0] * len(ops)
    unattributed = 0.0
    last = None
    for t, opening, kind, i, key in points:
        if last is not None and t > last and active["p"]:
            length = t - last
            for piece_key in active["p"].values():
                cands = list(active["a"]) or [j for j, k in active["s"].items() if k != piece_key]
                if cands:
                    for j in cands:
                        per_op[j] += length / len(cands)
                else:
                    unattributed += length
        last = t
        if opening:
            active[kind][i] = key
        else:
            active[kind].pop(i, None)
    return {"per_op": per_op, "unattributed": unattributed}


def _find_trace(root: str) -> Path | None:
    found = sorted(Path(root).rglob("*.trace.json.gz")) or sorted(
        Path(root).rglob("perfetto_trace.json.gz")
    )
    return found[0] if found else None


def profile_jax(shape, dtype: str, steps: int, warmup: int, positional: str, out: Path | None):
    import jax

    trainer = train_speed.JaxTrainer(shape, positional=positional, dtype=dtype)
    compiled = trainer.step.lower(trainer.state, trainer.batch).compile()
    hlo_text = compiled.as_text()
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    cost = cost or {}
    trainer.run(warmup)
    t0 = time.perf_counter()
    trainer.run(steps)
    untraced = (time.perf_counter() - t0) / steps
    with tempfile.TemporaryDirectory(prefix="profile_step_") as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            t0 = time.perf_counter()
            trainer.run(steps)
            wall = (time.perf_counter() - t0) / steps
        path = _find_trace(tmp)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "jax_step.hlo.txt").write_text(hlo_text)
            if path is not None:
                shutil.copy(path, out / "jax_trace.json.gz")
        if path is None:
            files = ", ".join(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*"))
            trace = {"error": f"jax.profiler.trace wrote no Chrome trace (files: {files})"}
        else:
            with gzip.open(path, "rt") as f:
                data = json.load(f)
            events = data["traceEvents"] if isinstance(data, dict) else data
            trace = analyze_trace(events, Hlo(hlo_text))
            trace["file"] = path.name
    hlo = Hlo(hlo_text)
    result = {
        "wall_ms": wall * 1e3,
        "untraced_ms": untraced * 1e3,
        "compile_s": trainer.compile_s,
        "flops": float(cost.get("flops", 0.0)),
        "bytes": float(cost.get("bytes accessed", 0.0)),
        "module": hlo.module,
        "loss": trainer.loss,
    }
    if "error" in trace:
        result["error"] = trace["error"]
        return result
    n = trace["runs"]
    if n != steps:
        result["note"] = f"the trace holds {n} executions of {hlo.module}, not {steps}"
    cats = collections.Counter()
    cats_incl = collections.Counter()
    phases = collections.Counter()
    per_op = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for e in trace["ops"]:
        kind, phase = hlo.classify(e["_op"])
        cat = category(kind, phase)
        dur = e["_self"] / 1e3 / n
        helper = e["_helper"] / 1e3 / n
        cats[cat] += dur
        cats_incl[cat] += dur + helper
        phases[phase] += dur + helper
        agg = per_op[e["_op"]]
        agg[0] += dur
        agg[1] += helper
        agg[2] += 1
    unattr = trace["pool_unattributed_us"] / 1e3 / n
    cats_incl["pool"] += unattr
    top = sorted(per_op.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:10]
    result.update(
        {
            "categories": dict(cats),
            "categories_incl": dict(cats_incl),
            "phases": dict(phases),
            "op_ms": sum(cats.values()),
            "raw_op_ms": sum(e.get("dur", 0.0) for e in trace["ops"]) / 1e3 / n,
            "incl_ms": sum(cats_incl.values()),
            "pool_ms": trace["pool_total_us"] / 1e3 / n,
            "pool_unattributed_ms": unattr,
            "span_ms": trace["span_us"] / 1e3,
            "executions": len(trace["ops"]) / n,
            "distinct_ops": len(per_op),
            "markers": trace["markers"] / n,
            "pool_threads": trace["pool_threads"],
            "source": trace["source"],
            "file": trace["file"],
            "threads": {k: v / 1e3 / n for k, v in trace["op_threads"].items()},
            "not_in_hlo": sorted({e["_op"] for e in trace["ops"]} - set(hlo.instrs))[:5],
            "top": [
                {
                    "op": name,
                    "category": category(*hlo.classify(name)),
                    "phase": hlo.classify(name)[1],
                    "ms": dur + helper,
                    "event_ms": dur,
                    "calls": calls / n,
                    "shapes": hlo.shapes(name),
                    "op_name": hlo.op_names.get(name, ""),
                }
                for name, (dur, helper, calls) in top
            ],
        }
    )
    return result


# --------------------------------------------------------------------------- PyTorch

_T_MATMUL = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::matmul",
    "aten::linear",
    "aten::mv",
    "aten::addmv",
    "aten::dot",
    "aten::einsum",
    "aten::_addmm_activation",
}
_T_COPY = {
    "aten::copy_",
    "aten::contiguous",
    "aten::clone",
    "aten::transpose",
    "aten::permute",
    "aten::t",
    "aten::_to_copy",
    "aten::to",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::view",
    "aten::_unsafe_view",
    "aten::expand",
    "aten::as_strided",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::select",
    "aten::slice",
    "aten::unbind",
    "aten::flatten",
    "aten::cat",
    "aten::stack",
    "aten::detach",
    "aten::alias",
    "aten::numpy_T",
}
_T_OTHER_PREFIX = (
    "aten::embedding",
    "aten::index",
    "aten::gather",
    "aten::scatter",
    "aten::fill_",
    "aten::zero",
    "aten::empty",
    "aten::new_",
    "aten::resize_",
    "aten::ones",
    "aten::full",
)


def torch_category(name: str, ancestors: list[str], phase: str) -> str:
    low = name.lower()
    if phase == "update" or "_foreach_" in low or name.startswith("Optimizer."):
        return "optimizer"
    if any(
        "scaleddotproduct" in a.lower().replace("_", "")
        or "flashattention" in a.lower().replace("_", "")
        for a in (name, *ancestors)
    ):
        return "attention"
    if not name.startswith("aten::"):
        return "overhead"
    if name in _T_MATMUL:
        return "matmul"
    if name in _T_COPY:
        return "copy"
    if name.startswith(_T_OTHER_PREFIX):
        return "other"
    return "elementwise"


def _torch_steps(trainer, steps: int, label) -> None:
    """`TorchTrainer.run`'s statements, each part under ``label(phase)``."""
    torch = trainer.torch
    loss = None
    for _ in range(steps):
        with label("forward"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer.autocast):
                logits = trainer.model(trainer.inputs)
                loss = torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), trainer.targets.flatten()
                )
        with label("update"):
            trainer.opt.zero_grad(set_to_none=True)
        with label("backward"):
            loss.backward()
        with label("update"):
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.clip)
            trainer.opt.step()
    trainer.loss = float(loss.detach())


def profile_torch(shape, dtype: str, steps: int, warmup: int, out: Path | None) -> dict:
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(os.cpu_count() or 1)
    trainer = train_speed.TorchTrainer(shape, dtype=dtype)
    trainer.run(warmup)
    t0 = time.perf_counter()
    _torch_steps(trainer, steps, lambda _: contextlib.nullcontext())
    untraced = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        _torch_steps(trainer, steps, lambda p: record_function(f"profile_step:{p}"))
        wall = (time.perf_counter() - t0) / steps
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / "torch_trace.json"))
    cats = collections.Counter()
    phases = collections.Counter()
    per_op = collections.defaultdict(lambda: [0.0, 0])
    total = 0.0
    for e in prof.events():
        ancestors, p = [], e.cpu_parent
        while p is not None:
            ancestors.append(p.name)
            p = p.cpu_parent
        phase = next(
            (a.split(":", 1)[1] for a in (e.name, *ancestors) if a.startswith("profile_step:")),
            "none",
        )
        cat = torch_category(e.name, ancestors, phase)
        ms = e.self_cpu_time_total / 1e3 / steps
        total += ms
        cats[cat] += ms
        phases[phase] += ms
        shapes = ", ".join(str(list(s)) for s in (e.input_shapes or []) if s) or "(not recorded)"
        agg = per_op[(e.name, cat, phase, shapes)]
        agg[0] += ms
        agg[1] += 1
    ka_total = sum(k.self_cpu_time_total for k in prof.key_averages()) / 1e3 / steps
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:10]
    return {
        "wall_ms": wall * 1e3,
        "untraced_ms": untraced * 1e3,
        "categories": dict(cats),
        "phases": dict(phases),
        "total_ms": total,
        "key_averages_ms": ka_total,
        "threads": torch.get_num_threads(),
        "version": torch.__version__,
        "loss": trainer.loss,
        "top": [
            {
                "op": name,
                "category": cat,
                "phase": phase,
                "ms": ms,
                "calls": calls / steps,
                "shapes": shapes if len(shapes) <= 70 else shapes[:67] + "...",
            }
            for (name, cat, phase, shapes), (ms, calls) in top
        ],
    }


def run_torch_child(args) -> dict:
    """PyTorch's profile in a child process (glibc's default malloc, as in train_speed)."""
    cmd = [sys.executable, __file__, "--torch-child", "--shape", args.shape]
    cmd += ["--dtype", args.dtype, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.out:
        cmd += ["--out", args.out]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(JSON_TAG):
            return json.loads(line[len(JSON_TAG) :])
    return {"error": f"the PyTorch child exited with {proc.returncode} and no result"}


# --------------------------------------------------------------------------- report


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _pct(x: float | None, total: float | None) -> str:
    return "" if x is None or not total else f"{100 * x / total:.0f}%"


def report(args, shape, jax_r, torch_r, load_before, load_after) -> str:
    torch_ver = torch_r.get("version") if torch_r else None
    lines = [
        f"## Step profile: {shape.name} model, {args.dtype}, {args.steps} profiled steps",
        "",
        f"- Machine: {train_speed._cpu_name()}, {os.cpu_count()} CPUs, "
        f"{train_speed._machine_line()}; Python "
        f"{platform.python_version()}, {train_speed._versions()}"
        + (f", torch {torch_ver}" if torch_ver else "")
        + f"; commit {train_speed._git_commit()}"
        + (
            "; JAX malloc "
            + ("glibc defaults" if args.default_malloc else "tuned (train/allocator.py)")
            if jax_r
            else ""
        )
        + ("; PyTorch in a child process with glibc defaults" if torch_ver else ""),
        "- Load average (1 / 5 / 15 min) before: "
        + " / ".join(f"{x:.2f}" for x in load_before)
        + "; after: "
        + " / ".join(f"{x:.2f}" for x in load_after)
        + f"; this process's nice value: {os.nice(0)}",
    ]
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        lines.append(
            f"- **Warning**: 1-min load average {load_before[0]:.2f} on {os.cpu_count()} CPUs "
            "before the run: other processes competed for the cores, so wall and per-op times "
            "include preemption (compare shares; rerun on an idle machine for milliseconds)."
        )
    lines += [
        f"- Model: {shape.num_layers} layers, d_model {shape.d_model}, {shape.num_heads} heads, "
        f"d_ff {shape.d_ff}, seq {shape.length}, batch {shape.batch}, vocab {shape.vocab}, "
        f"AdamW + clipping; {args.positional} positions (JAX); {args.warmup} warm-up steps, "
        f"then {args.steps} steps timed without the profiler and {args.steps} profiled.",
    ]
    tokens = shape.batch * shape.length
    model_flops = shape.model_flops_per_token() * tokens
    if jax_r:
        lines.append(
            f"- JAX: {jax_r['wall_ms']:.1f} ms/step wall under the profiler "
            f"({jax_r['untraced_ms']:.1f} without); compile {jax_r['compile_s']:.1f} s; "
            f"`cost_analysis()`: {jax_r['flops'] / 1e9:.2f} GFLOP and "
            f"{jax_r['bytes'] / 1e9:.2f} GB accessed per step -> "
            f"{jax_r['flops'] / jax_r['wall_ms'] / 1e6:.1f} GFLOP/s achieved under the "
            f"profiler, {jax_r['flops'] / jax_r['untraced_ms'] / 1e6:.1f} without "
            f"(model FLOPs, 6N + attention: {model_flops / 1e9:.2f} GFLOP/step)."
        )
        if "error" in jax_r:
            lines.append(f"- **JAX per-op breakdown unavailable**: {jax_r['error']}.")
        else:
            threads = "; ".join(f"{k}: {v:.1f}" for k, v in jax_r["threads"].items())
            lines.append(
                f"- JAX trace (`{jax_r['file']}`, ops found by {jax_r['source']}): "
                f"{jax_r['executions']:.0f} op executions per step ({jax_r['distinct_ops']} "
                f"distinct HLO ops, {jax_r['markers']:.0f} with an `end:` marker); execution "
                f"span (first op start to last op done) {jax_r['span_ms']:.1f} ms/step; op "
                f"time **summed over the threads** that ran them {jax_r['op_ms']:.1f} ms/step "
                f"(ms/step by thread: {threads}); pool tasks outside op events on the "
                f"{jax_r['pool_threads']} pool threads {jax_r['pool_ms']:.1f} ms/step, "
                f"{jax_r['pool_ms'] - jax_r['pool_unattributed_ms']:.1f} of it attributed to "
                "ops in flight."
            )
            if jax_r.get("note"):
                lines.append(f"- Note: {jax_r['note']}; times are divided by what it holds.")
            if jax_r["not_in_hlo"]:
                lines.append(
                    "- Ops of the trace not found in the HLO text (unclassified), e.g. "
                    + ", ".join(f"`{n}`" for n in jax_r["not_in_hlo"])
                )
    if torch_r and "error" not in torch_r:
        lines.append(
            f"- PyTorch {torch_r['version']} eager ({torch_r['threads']} intra-op threads"
            + (", bf16 autocast" if args.dtype == "bfloat16" else "")
            + f"): {torch_r['wall_ms']:.1f} ms/step wall under the profiler "
            f"({torch_r['untraced_ms']:.1f} without); self CPU time on the calling thread "
            f"{torch_r['total_ms']:.1f} ms/step (`key_averages()` total "
            f"{torch_r['key_averages_ms']:.1f}); {model_flops / torch_r['untraced_ms'] / 1e6:.1f}"
            " model GFLOP/s without the profiler."
        )
    elif torch_r:
        lines.append(f"- **PyTorch left out**: {torch_r['error']}.")

    jc = jax_r.get("categories") if jax_r else None
    ji = jax_r.get("categories_incl") if jax_r else None
    tc = torch_r.get("categories") if torch_r and "error" not in torch_r else None
    lines += [
        "",
        "| category | JAX op events (ms/step, thread-sum) | JAX incl. pool tasks (ms/step) "
        "| JAX share | PyTorch self CPU (ms/step) | PyTorch share |",
        "|---|---|---|---|---|---|",
    ]
    jt = sum(ji.values()) if ji else None
    tt = sum(tc.values()) if tc else None
    for key, label in CATEGORIES:
        vals = [d.get(key) if d is not None else None for d in (jc, ji, tc)]
        if all(not v for v in vals) and key in ("pool", "overhead", "unclassified"):
            continue
        a, b, c = (
            (v or 0.0) if d is not None else None for v, d in zip(vals, (jc, ji, tc), strict=True)
        )
        lines.append(
            f"| {label} | {_ms(a) if key != 'pool' else ''} | {_ms(b)} | {_pct(b, jt)} "
            f"| {_ms(c)} | {_pct(c, tt)} |"
        )
    lines.append(
        f"| **total** | {_ms(sum(jc.values()) if jc else None)} | {_ms(jt)} | "
        f"{'100%' if jt else ''} | {_ms(tt)} | {'100%' if tt else ''} |"
    )
    if jc is not None:
        nested = jax_r["raw_op_ms"] - sum(jc.values())
        lines.append(
            f"\nCheck: JAX categories sum to {sum(jc.values()):.2f} ms/step; the op events' "
            f"durations to {jax_r['raw_op_ms']:.2f} (difference {nested:+.3f}: time of op "
            f"events nested in other op events, counted once); unclassified "
            f"{jc.get('unclassified', 0.0):.2f} ms/step; incl. column = op events + pool tasks "
            f"({sum(jc.values()):.2f} + {jax_r['pool_ms']:.2f} = "
            f"{sum(jc.values()) + jax_r['pool_ms']:.2f})."
        )
    if tc is not None:
        lines.append(
            f"Check: PyTorch categories sum to {tt:.2f} ms/step vs `key_averages()` total "
            f"{torch_r['key_averages_ms']:.2f}."
        )
    jp = jax_r.get("phases") if jax_r else None
    tp = torch_r.get("phases") if tc is not None else None
    if jp or tp:
        lines += [
            "",
            "| phase | JAX incl. pool tasks (ms/step) | JAX share | PyTorch (ms/step) "
            "| PyTorch share |",
            "|---|---|---|---|---|",
        ]
        jpt = sum(jp.values()) if jp else None
        tpt = sum(tp.values()) if tp else None
        names = {
            "forward": "forward",
            "backward": "backward",
            "update": "optimizer update (+ clipping, metrics)",
            "none": "no phase (JAX: no op_name metadata)",
        }
        for ph in PHASES:
            a = jp.get(ph, 0.0) if jp else None
            c = tp.get(ph, 0.0) if tp else None
            if ph == "none" and not a and not c:
                continue
            lines.append(f"| {names[ph]} | {_ms(a)} | {_pct(a, jpt)} | {_ms(c)} | {_pct(c, tpt)} |")
        if jp:
            lines.append(
                "\nJAX phases exclude unattributed pool time; JAX 'update' is every op whose "
                "op_name is outside jvp (optax AdamW, clipping, grad norm, metrics)."
            )
    if jax_r and jax_r.get("top"):
        lines += [
            "",
            "Top 10 JAX ops (ms/step incl. attributed pool tasks; op-event ms in brackets):",
            "",
            "| op | category | phase | ms/step | runs/step | shapes (result <- operands) "
            "| op_name |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in jax_r["top"]:
            op_name = t["op_name"].replace("jit(train_step)/", "")
            lines.append(
                f"| `{t['op']}` | {t['category']} | {t['phase']} | {t['ms']:.2f} "
                f"({t['event_ms']:.2f}) | {t['calls']:g} | `{t['shapes']}` | `{op_name}` |"
            )
    if tc is not None and torch_r.get("top"):
        lines += [
            "",
            "Top 10 PyTorch ops (self CPU, by name, phase and input shapes):",
            "",
            "| op | category | phase | ms/step | calls/step | input shapes |",
            "|---|---|---|---|---|---|",
        ]
        for t in torch_r["top"]:
            lines.append(
                f"| `{t['op']}` | {t['category']} | {t['phase']} | {t['ms']:.2f} | "
                f"{t['calls']:g} | `{t['shapes']}` |"
            )
    lines += [
        "",
        "JAX op time is summed over XLA's pool threads (it can exceed the wall time); PyTorch "
        "self CPU is the calling thread's time, OpenMP workers inside an op not added: compare "
        "shares across frameworks, not ms. JAX's attention row holds only the batched "
        "matmuls (its softmax is elementwise); PyTorch's holds the fused SDPA kernels.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="quick")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (and untraced ones)")
    p.add_argument("--warmup", type=int, default=2, help="steps before anything is timed")
    p.add_argument("--framework", choices=["jax", "torch", "both"], default="both")
    p.add_argument("--positional", default="sinusoidal", help="JAX model's encoding")
    p.add_argument("--out", help="folder that keeps the raw traces and the HLO text")
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc malloc at its defaults for JAX (see flaxformer_lite/train/allocator.py)",
    )
    p.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shape = SHAPES[args.shape]
    out = Path(args.out) if args.out else None

    if args.torch_child:
        result = profile_torch(shape, args.dtype, args.steps, args.warmup, out)
        print(JSON_TAG + json.dumps(result), flush=True)
        return
    do_jax = args.framework in ("jax", "both")
    if do_jax and not args.default_malloc:
        from flaxformer_lite.train.allocator import configure_host_allocator

        configure_host_allocator()  # before JAX's CPU client exists, as train_speed does
    load_before = os.getloadavg()
    jax_r = (
        profile_jax(shape, args.dtype, args.steps, args.warmup, args.positional, out)
        if do_jax
        else None
    )
    torch_r = None
    if args.framework in ("torch", "both"):
        if importlib.util.find_spec("torch") is None:
            torch_r = {"error": "PyTorch is not installed in this interpreter"}
        else:
            torch_r = run_torch_child(args)
    load_after = os.getloadavg()
    print(report(args, shape, jax_r, torch_r, load_before, load_after))


if __name__ == "__main__":
    main()
