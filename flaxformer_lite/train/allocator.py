"""Keep freed host memory in the process, so CPU training steps stop page-faulting.

XLA's CPU runtime allocates each execution's temporary buffer as one block (tens to hundreds
of MiB for a train step) with malloc and frees it when the execution ends. glibc serves a
block above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and returns it with
``munmap``, so every step touches all of that memory for the first time again: minor page
faults and kernel time in every step (docs/performance.md §Host allocator). Three ``mallopt``
settings make glibc keep and reuse the memory:

* ``M_ARENA_MAX=1``: every thread allocates from the main heap, which can grow past the
  64 MiB limit of glibc's per-thread arenas (larger blocks there always use mmap);
* ``M_MMAP_MAX=0``: no block is served by its own mmap;
* ``M_TRIM_THRESHOLD=2**31-1``: freed memory at the top of the heap is not given back.

They must be set before JAX starts its CPU client (the first use of a device): a thread
binds to an arena at its first allocation. `train_and_evaluate` calls
`configure_host_allocator` first thing; a program that uses JAX earlier can set the same
before Python starts::

    GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647

The cost: the process keeps its peak heap (resident memory does not shrink after, e.g., a
long-context evaluation). ``FLAXFORMER_LITE_MALLOC=default`` leaves malloc alone. Hosts with
an accelerator plugin installed are left alone too (their steps do not run on host memory).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

ENV = "FLAXFORMER_LITE_MALLOC"
TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"
# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_SETTINGS = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
_ACCELERATOR_DISTRIBUTIONS = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu")
_configured = False


def configure_host_allocator() -> bool:
    """Apply the malloc settings above; True if they are in effect for JAX's CPU threads.

    A no-op (False) off Linux/glibc, when ``FLAXFORMER_LITE_MALLOC=default``, when an
    accelerator plugin is installed, or when JAX's backends already exist (then it logs how
    to set ``GLIBC_TUNABLES`` instead). Safe to call more than once.
    """
    global _configured
    if _configured:
        return True
    reason = _skip_reason()
    if reason is not None:
        log.debug("host allocator left alone: %s", reason)
        return False
    if _backends_initialized():
        log.info(
            "JAX's backends already exist, so malloc settings would not reach its CPU threads; "
            "for fewer page faults per step start Python with GLIBC_TUNABLES=%s",
            TUNABLES,
        )
        return False
    libc = ctypes.CDLL(None)
    if not all(libc.mallopt(param, value) == 1 for param, value in _SETTINGS):
        log.info("mallopt refused a setting; host allocator unchanged")
        return False
    _configured = True
    log.info("host allocator: freed memory is kept and reused (see %s)", __name__)
    return True


def _skip_reason() -> str | None:
    if os.environ.get(ENV, "").strip().lower() == "default":
        return f"{ENV}=default"
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return "not Linux with glibc"
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return None
    names = {(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()}
    if any(n.startswith(_ACCELERATOR_DISTRIBUTIONS) for n in names):
        return "an accelerator plugin is installed (set JAX_PLATFORMS=cpu to tune anyway)"
    return None


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - private module moved
        return True
    return xla_bridge.backends_are_initialized()
