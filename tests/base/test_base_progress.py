"""`base.progress.bars`: bars only when asked for and drawn on a terminal."""

from __future__ import annotations

import io
import sys

from flaxformer_lite.base.progress import bars


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        super().isatty()  # ValueError once closed, as a real stream
        return True


def test_bars_only_on_a_terminal_and_when_asked(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert bars(True, Terminal()) is True
    assert bars(False, Terminal()) is False
    assert bars(True, io.StringIO()) is False  # a log file or a pipe
    closed = Terminal()
    closed.close()
    assert bars(True, closed) is False
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # a Jupyter kernel draws widgets
    assert bars(True, io.StringIO()) is True
