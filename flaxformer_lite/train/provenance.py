"""Where a number came from: commit, package versions, backend and device, Python, and the
positional encoding's options and source."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax

from flaxformer_lite.nn.model_config import ModelConfig

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "flaxformer-lite")


_CONFIG_FILES: list[Path] = []  # config files a command loaded (`note_config_file`)


def note_config_file(path: str | Path) -> None:
    """Remember the config file a command runs: when the package itself is not in a git
    checkout (a non-editable install), `git_commit` looks at the checkout holding the config.
    Call before the first `git_commit` (the commands do it while parsing flags)."""
    _CONFIG_FILES.append(Path(path).resolve())
    git_commit.cache_clear()


def _git(root: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
    )
    return result.stdout.strip()


@functools.cache
def git_commit() -> str:
    """Short commit (``+dirty`` if modified) of the checkout this package runs from or, for an
    installed package, of the checkout the config file came from (`note_config_file`);
    ``unknown`` when neither is in a git checkout."""
    package = Path(__file__).resolve().parent.parent
    for root in (package, *(path.parent for path in _CONFIG_FILES)):
        try:
            commit = _git(root, "rev-parse", "--short", "HEAD")
            dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
        except (OSError, subprocess.SubprocessError):
            continue
        return commit + ("+dirty" if dirty else "")
    return "unknown"


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


def encoding(model: ModelConfig) -> dict[str, Any]:
    """The model's positional encoding as provenance: ``name``, its exact ``options``, and
    where its factory is defined -- ``factory`` (``module.qualname``), ``file`` (the source
    file, None when there is none) and ``builtin`` (whether it is one of this package's).

    A user's encoding (registered by a module given to ``--import``) is otherwise known only by
    its name: the module and file say which code produced the numbers. With a
    ``layer_pattern``, ``layers`` holds the same record for each kind of it (one cycle), with
    its ``window`` and ``chunk``."""
    out = _encoding_record(model.encoding, model.positional_options)
    if model.layer_pattern:
        out["layers"] = [
            _encoding_record(k.encoding, k.positional_options)
            | {"window": k.window, "chunk": k.chunk}
            for k in model.pattern_kinds()
        ]
    return out


def _encoding_record(spec: Any, options: Any) -> dict[str, Any]:
    factory = spec.factory
    module = getattr(factory, "__module__", None) or "unknown"
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    try:
        file = inspect.getsourcefile(factory)
    except TypeError:  # a builtin or a callable instance without a source file
        file = None
    return {
        "name": spec.name,
        "options": dataclasses.asdict(options),
        "factory": f"{module}.{name}",
        "file": str(Path(file).resolve()) if file else None,
        "builtin": module.startswith("flaxformer_lite."),
    }
