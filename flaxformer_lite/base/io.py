"""Files that are never torn: atomic replacement of whole files, tolerant JSON-lines reading."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flaxformer_lite.base import faults


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace`` (never torn)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    faults.hit(f"write:{path.name}")  # test-only kill point (flaxformer_lite.base.faults)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn or corrupted line is skipped (callers may report)."""
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
