"""Metrics as JSON lines (``metrics.jsonl``) and TensorBoard events (tensorboardX).

On resume from step ``s`` both logs are cut back to step ``s``: rows a killed run wrote after
its last checkpoint are dropped, so the log of a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter

from flaxformer_lite.base.io import UnsafeFileError, append_text, atomic_write_text, read_jsonl


class MetricsWriter:
    """Append ``{"step", "split", metric: value}`` rows and mirror them to TensorBoard."""

    def __init__(self, workdir: Path, *, resume_step: int):
        self.path = Path(workdir) / "metrics.jsonl"
        for path in (self.path, Path(workdir) / "tensorboard"):
            if path.is_symlink():  # never read, written or replaced through a link
                raise UnsafeFileError(path, "a symbolic link; nothing is written through a link")
        kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.tb = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        row = {"step": int(step), "split": split}
        row.update({k: _clean(v) for k, v in metrics.items()})
        # never through a link; a torn last line is dropped on resume (cut back to a checkpoint)
        append_text(self.path, json.dumps(row) + "\n")
        for k, v in metrics.items():
            self.tb.add_scalar(f"{split}/{k}", float(v), int(step))

    def close(self) -> None:
        self.tb.close()


def _clean(v: Any) -> Any:
    v = float(v)
    return v if math.isfinite(v) else str(v)
