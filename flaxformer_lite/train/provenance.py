"""Where a number came from: commit, package versions, backend and device, Python."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "flaxformer-lite")


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
    )
    return result.stdout.strip()


@functools.cache
def git_commit() -> str:
    """Short commit of the checkout this package runs from (``+dirty`` if modified)."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def environment() -> dict[str, Any]:
    """Commit, versions, Python, backend, device kind and count."""
    devices = jax.devices()
    return {
        "git_commit": git_commit(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "machine": platform.machine(),
    }
