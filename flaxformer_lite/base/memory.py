"""Host memory available to this process and byte counts for messages (standard library only).

`host_available` is what a run may still allocate on the host: the kernel's ``MemAvailable``,
capped by a container's cgroup v2 limit, plus this process's resident memory (which a
process reuses: a study's later cells must not be refused for what its earlier cells left in
the heap). `format_bytes` writes ``1.5 GiB``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def host_available() -> tuple[int | None, str]:
    """``(bytes, where it was read)``; ``(None, ...)`` when the host does not say."""
    free, where = None, "host memory"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free, where = int(line.split()[1]) * 1024, "host memory, MemAvailable"
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None, "host memory unknown"
    with contextlib.suppress(OSError, ValueError):  # a container's cgroup v2 limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            if int(limit) - used < free:
                free, where = int(limit) - used, "cgroup memory.max - memory.current"
    # what this process holds is reused (its allocator keeps freed heap)
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                free += int(line.split()[1]) * 1024
                where += " + this process's resident memory"
    return free, where


def format_bytes(n: float) -> str:
    """``1.5 GiB``, ``396.0 KiB``, ``12 B``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
