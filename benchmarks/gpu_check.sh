#!/usr/bin/env bash
# A ready GPU check for a fresh machine with one NVIDIA GPU.
#
# What it does, from any directory:
#   1. cd to the repository root; create .venv (or reuse it) and `pip install -e '.[test]'`;
#   2. install the CUDA jax wheel of the jax version that step 1 installed:
#      `pip install "jax[cuda12]==$JAXVER"`, then cuda13 if that fails; JAX_CUDA_EXTRA=cuda13
#      (or any extra) picks one; SKIP_INSTALL=1 skips every pip step (machines without network:
#      the environment must be ready);
#   3. print `nvidia-smi --query-gpu=name,memory.total --format=csv`;
#   4. run `python benchmarks/gpu_check.py --with-tests --require-gpu "$@"` under `timeout 480`.
# Without nvidia-smi it says so, installs no CUDA wheel and runs the CPU fallback
# (`--cpu-fallback`: tiny sizes, about a minute on 2 cores).
#
# Budget: the whole check, installs excluded, fits 8 minutes (480 s) on one H100/H200-class GPU;
# the last line of the report prints the total against --budget-s.
#
# Reading the table (one Markdown table on stdout, progress and tracebacks on stderr): one
# row per check with what it measured, its seconds and a status: "pass" / "fail";
# "skipped: <why>" (not run here, e.g. "skipped: no GPU (backend=cpu)" for the cuDNN kernel);
# "met" / "missed" for MFU against --mfu-goal (this run's measurement; does not change the
# exit status unless --fail-on-missed-goal); "n/a on CPU". The exit status is 1 if any row
# failed, 124 if the 480 s timeout hit. Extra arguments go to gpu_check.py (see its --help),
# e.g. `benchmarks/gpu_check.sh --batch 16 --peak-tflops 989`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  have_gpu=1
fi

if [[ "${SKIP_INSTALL:-0}" == "1" ]]; then
  echo "SKIP_INSTALL=1: no pip steps; using the environment as it is" >&2
  if [[ ! -x .venv/bin/python ]]; then
    echo "error: .venv/bin/python is missing and SKIP_INSTALL=1 forbids creating it" >&2
    exit 2
  fi
else
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install --upgrade pip
  .venv/bin/python -m pip install -e '.[test]'
  if [[ "$have_gpu" == "1" ]]; then
    JAXVER="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("jax"))')"
    if [[ -n "${JAX_CUDA_EXTRA:-}" ]]; then
      .venv/bin/python -m pip install "jax[${JAX_CUDA_EXTRA}]==${JAXVER}"
    elif ! .venv/bin/python -m pip install "jax[cuda12]==${JAXVER}"; then
      echo "jax[cuda12]==${JAXVER} did not install; trying jax[cuda13]" >&2
      .venv/bin/python -m pip install "jax[cuda13]==${JAXVER}"
    fi
  fi
fi

if [[ "$have_gpu" == "1" ]]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv || echo "nvidia-smi failed (driver?)" >&2
  exec timeout 480 .venv/bin/python benchmarks/gpu_check.py --with-tests --require-gpu "$@"
else
  echo "nvidia-smi not found: no NVIDIA GPU here; running the CPU fallback (tiny sizes)" >&2
  exec timeout 480 .venv/bin/python benchmarks/gpu_check.py --cpu-fallback "$@"
fi
