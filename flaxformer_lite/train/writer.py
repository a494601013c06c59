"""Metrics as JSON lines (``metrics.jsonl``) and TensorBoard events (tensorboardX).

On resume from step ``s`` both logs are cut back to step ``s``: rows a killed run wrote after
its last checkpoint are dropped, so the log of a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter

from flaxformer_lite.train import faults


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace`` (never torn)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    faults.hit(f"write:{path.name}")  # test-only kill point (flaxformer_lite.train.faults)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn or corrupted line is skipped (callers may report)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class MetricsWriter:
    """Append ``{"step", "split", metric: value}`` rows and mirror them to TensorBoard."""

    def __init__(self, workdir: Path, *, resume_step: int):
        self.path = Path(workdir) / "metrics.jsonl"
        kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.tb = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        row = {"step": int(step), "split": split}
        row.update({k: _clean(v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in metrics.items():
            self.tb.add_scalar(f"{split}/{k}", float(v), int(step))

    def close(self) -> None:
        self.tb.close()


def _clean(v: Any) -> Any:
    v = float(v)
    return v if math.isfinite(v) else str(v)
