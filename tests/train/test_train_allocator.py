"""Host allocator settings: CPU steps stop page-faulting once freed memory is kept.

Each case runs in a fresh subprocess, because the settings only reach JAX's CPU threads when
they are made before JAX's backend exists.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only"
)

WORKER = """
import json, resource, sys
from flaxformer_lite.train.allocator import configure_host_allocator
import jax, jax.numpy as jnp

mode = sys.argv[1]
if mode == "late":
    jnp.zeros(1).block_until_ready()  # the backend exists before the call
applied = configure_host_allocator()
x = jnp.ones((2560, 4096), jnp.float32)  # 40 MiB: above glibc's largest mmap threshold
f = jax.jit(lambda x: jnp.cumsum(x, axis=0))
f(x).block_until_ready()
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = f(x)  # a fresh 40 MiB output buffer per call
    y.block_until_ready()
    del y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _run(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")}
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("FLAXFORMER_LITE_MALLOC", None)
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, mode],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_configured_early_stops_the_faults_too_late_is_reported_not_applied():
    late = _run("late")  # the backend exists first: nothing applied, the default behaviour
    early = _run("early")
    pages = 40 * 2**20 // 4096
    assert late["applied"] is False
    # glibc mmaps the 40 MiB buffer afresh on every call: one fault per 4 KiB page (fewer
    # with transparent huge pages, but still thousands).
    assert min(late["faults"]) > pages // 600, late
    assert early["applied"] is True
    # Kept memory is reused. The heap grows during the first calls (a freed block is reused
    # once a free one of the right size and alignment is there; how soon depends on when
    # other threads free theirs), then calls touch no new page.
    quiet = [n for n in early["faults"] if n < pages // 100]
    assert len(quiet) >= len(early["faults"]) // 2, early
    assert sum(early["faults"]) < sum(late["faults"]) / 3, (early, late)
