"""Which machine a benchmark ran on, without importing jax (benchmarks/target_status.py uses it).

Issue 15 counts a speed target as met only when runs on two different machines meet it, and a
new session can land on an earlier session's VM, so every benchmark names its machine: the
kernel's boot id tells machines apart, the boot time is printed beside it for people.
"""

from __future__ import annotations

import datetime


def booted() -> str:
    """The machine's boot time (Linux ``/proc/stat`` ``btime``) as ``YYYY-MM-DD HH:MM:SS UTC``,
    or "unknown". The kernel derives it from the clock and the uptime, so it can move without a
    reboot (the third machine's read 08:50:50 in the fourth to eleventh sessions and 08:51:09 in
    the twelfth, its uptime unbroken and its files in place; a VM paused between sessions whose
    clock was set forward on resuming would do that): machines are told apart by `boot_id`,
    this is for people."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    booted = datetime.datetime.fromtimestamp(int(line.split()[1]), datetime.UTC)
                    return booted.strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OSError, ValueError):
        pass
    return "unknown"


def boot_id() -> str:
    """The kernel's id of this boot (Linux ``/proc/sys/kernel/random/boot_id``, a random UUID
    drawn at boot), or "unknown". Issue 15 counts a target as met when runs on two different
    machines meet it, and a new session can land on an earlier session's VM: two runs come from
    different machines only if their boot ids differ (benchmarks/target_status.py)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            text = f.read().strip()
    except OSError:
        return "unknown"
    return text or "unknown"


def machine_line() -> str:
    """``booted <time> (boot id <first 8 characters>)``: how the printed reports name the
    machine."""
    return f"booted {booted()} (boot id {boot_id()[:8]})"
