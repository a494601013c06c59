"""Whether to draw progress bars: only on a terminal.

A tqdm bar redraws itself with carriage returns; in a log file, a pipe or a batch job's
output it becomes thousands of fragments. Bars are drawn when they are asked for and stderr
(where tqdm draws) is a terminal, or in a Jupyter kernel (tqdm.auto draws a widget there);
elsewhere the study prints one plain line per finished cell instead (`study.runner`).
Standard library only.
"""

from __future__ import annotations

import sys
from typing import TextIO


def bars(asked: bool, stream: TextIO | None = None) -> bool:
    """True when progress bars are ``asked`` for and ``stream`` (default: ``sys.stderr``) is a
    terminal, or this process is a Jupyter kernel."""
    if not asked:
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        if callable(isatty) and isatty():
            return True
    except ValueError:  # a closed stream
        return False
    return "ipykernel" in sys.modules
