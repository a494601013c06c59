"""The study command's work as one function: run a study's cells, then write its report.

The study runner (`flaxformer_lite.study.runner`) and the report (`flaxformer_lite.report`)
are peers over the results rows and never import each other; this is where they meet, for the
``study`` command and for ``flaxformer_lite.run_study``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flaxformer_lite.report import study_reporter
from flaxformer_lite.study import runner


def run_study(
    config: Any, workdir: str | Path, *, report: bool | runner.Reporter = True, **kwargs: Any
) -> dict[str, Any]:
    """`flaxformer_lite.study.runner.run_study` (its arguments, ``**kwargs``), then the report:
    ``report`` True writes REPORT.md, tables and plots from the study's rows
    (`report.study_reporter` of ``config``), a callable ``(study_dir, failed=, missing=)`` is
    used instead, False writes none. Returns the runner's outcome (``"report"``: REPORT.md's
    path, or None)."""
    writer = study_reporter(config) if report is True else (report or None)
    return runner.run_study(config, workdir, report=writer, **kwargs)
