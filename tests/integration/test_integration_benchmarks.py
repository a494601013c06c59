"""The ready GPU check (benchmarks/gpu_check.py and .sh) works where there is no GPU.

It is run on a GPU machine rarely and in a hurry, so the parts that can be checked here are:
the shell script parses, the CPU fallback runs every check end to end and prints the table
with the statuses it promises (the cuDNN row skipped, never passed, without a GPU), and the
MFU arithmetic matches a hand computation.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check, train_speed

ROOT = Path(__file__).resolve().parents[2]


def test_the_shell_script_parses():
    proc = subprocess.run(
        ["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def _table(stdout: str) -> dict[str, tuple[str, str]]:
    """``{check: (result, status)}`` from the Markdown table (``\\|`` is a literal bar)."""
    rows = {}
    for line in stdout.splitlines():
        if not line.startswith("| ") or line.startswith("| check |"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, line
        check, result, seconds, status = cells
        float(seconds)  # every check is timed
        rows[check] = (result, status)
    return rows


def test_the_cpu_fallback_runs_every_check_and_reports_honestly():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-fallback"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    head = proc.stdout.splitlines()[0]
    assert "no GPU: CPU fallback, tiny sizes" in head, head
    for part in ("jax ", "jaxlib ", "flax ", "Python ", "commit ", "backend=cpu"):
        assert part in head, (part, head)
    rows = _table(proc.stdout)
    cudnn = rows["attention cudnn vs xla (bfloat16, causal)"]
    assert cudnn[1] == "skipped: no GPU (backend=cpu)", cudnn
    assert "ValueError" in cudnn[0], cudnn
    for impl in ("auto", "chunked"):
        for dtype in ("bfloat16", "float32"):
            result, status = rows[f"attention {impl} vs xla ({dtype}, causal)"]
            assert status == "pass", (impl, dtype, result)
            assert "max \\|diff\\|" in result
    assert "path: fallback" in rows["attention auto vs xla (bfloat16, causal)"][0]
    bf16 = rows["bf16 train step vs f32"]
    assert bf16[1] == "pass", bf16
    mfu_result, mfu_status = rows["MFU (bf16, auto)"]
    assert mfu_status == "n/a on CPU", mfu_result
    assert "tok/s" in mfu_result
    study_result, study_status = rows["study attention_impl=auto"]
    assert study_status == "pass", study_result
    assert "5/5 encodings" in study_result, study_result
    for encoding in ("alibi", "learned", "none", "rope", "sinusoidal"):
        assert encoding in study_result
    tests = rows["tests (attention, chunked, mixed precision)"]
    assert tests[1] == "skipped: CPU fallback (pass --with-tests)", tests
    assert not any(status == "fail" for _, status in rows.values())
    assert re.search(r"^Total \d+ s \(within the budget of 480 s", proc.stdout, re.MULTILINE)


def test_mfu_arithmetic_matches_a_hand_computation():
    # The MFU model: 12 layers, d_model 896, d_ff 3584, seq 1024, 256 bytes, tied output layer.
    matmul = 12 * (4 * 896 * 896 + 2 * 896 * 3584) + 896 * 256
    assert matmul == 115_834_880
    per_token = 6 * matmul + 12 * 12 * 1024 * 896  # + attention scores and values
    assert per_token == 827_129_856
    shape = gpu_check._train_speed().Shape("mfu", batch=8, **gpu_check.MFU_DIMS)
    assert shape.model_flops_per_token() == per_token
    # 500k tokens/s on an H200: 827,129,856 x 5e5 / 989e12 = 41.8%
    value = gpu_check.mfu(per_token, 500_000, gpu_check.peak_flops("NVIDIA H200"))
    assert value == pytest.approx(827_129_856 * 500_000 / 989e12)
    assert value == pytest.approx(0.41817, abs=1e-5)
    assert gpu_check.mfu_status(value, 0.45, on_gpu=True) == "missed"
    assert gpu_check.mfu_status(value, 0.40, on_gpu=True) == "met"
    assert gpu_check.mfu_status(value, 0.40, on_gpu=False) == "n/a on CPU"
    assert gpu_check.mfu_status(None, 0.45, on_gpu=True) == "unknown peak: pass --peak-tflops"
    with pytest.raises(ValueError, match="peak"):
        gpu_check.mfu(per_token, 1.0, 0.0)


@pytest.mark.parametrize(
    ("device_kind", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),  # not the L4's
        ("Tesla T4", None),
        ("cpu", None),
    ],
)
def test_peak_flops_by_device_name(device_kind, peak):
    assert gpu_check.peak_flops(device_kind) == peak


def test_benchmark_targets_are_judged_from_the_runs_own_medians():
    targets = train_speed.targets  # importing the benchmark configures nothing (main() does)
    med = {  # seconds per step
        "JAX float32": 0.400,
        "PyTorch float32": 0.430,  # 1.075x: below 1.1x
        "JAX bfloat16": 0.250,
        "PyTorch bfloat16 (autocast)": 0.250,  # exactly 1.0x: met
        "JAX float32 sinusoidal": 0.041,
        "PyTorch float32 sinusoidal": 0.040,  # JAX slower: missed
    }
    got = targets(med)
    assert [status for _, _, status in got] == ["missed", "met", "missed"]
    assert got[0][1].startswith("1.07x (400.0 vs 430.0 ms/step)")
    # a ratio just below its goal is printed with the digits that show it: not "1.00x missed"
    near = {"JAX bfloat16": 0.4345, "PyTorch bfloat16 (autocast)": 0.4328}  # 0.99609x
    assert targets(near)[0][1:] == ("0.996x (434.5 vs 432.8 ms/step)", "missed")
    # a contestant that did not run leaves its target out; another implementation's labels
    assert targets({"JAX float32": 0.4}) == []
    cudnn = targets({"JAX float32 (cudnn)": 0.2, "PyTorch float32": 0.3}, "cudnn")
    assert [(s, m[:5]) for _, m, s in cudnn] == [("met", "1.50x")]
    # with the rounds: the verdict stays the medians'; the spread is of paired rounds
    times = {"JAX float32": [0.40, 0.38, 0.50], "PyTorch float32": [0.43, 0.456, 0.45]}
    (_, measured, status), *_ = targets({k: sorted(v)[1] for k, v in times.items()}, "xla", times)
    # medians 0.45 / 0.40 = 1.125: met (the median of the paired rounds' ratios, 1.075, is not)
    assert status == "met"
    assert measured == "1.12x (400.0 vs 450.0 ms/step; rounds 0.90-1.20x)"
    # a contestant with fewer rounds (or one round) gives no range
    one = {"JAX float32": [0.4], "PyTorch float32": [0.43]}
    assert "rounds" not in targets(med, "xla", one)[0][1]


def test_the_benchmarks_name_the_cpus_matrix_units():
    """The machine line says AMX or not, so a figure tells which kind of machine ran it."""
    intel = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
    assert train_speed.matrix_units(intel) == "AMX bf16, AVX-512, AVX512-BF16"
    assert train_speed.matrix_units({"avx2", "avx512f", "avx512_bf16"}) == (
        "AVX-512, AVX512-BF16, no AMX"
    )
    assert train_speed.matrix_units({"avx2", "fma"}) == "AVX2, no AMX"
    assert train_speed.matrix_units(set()) == "no AMX"
