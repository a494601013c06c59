"""No path of the machine in a report: absolute paths in rows become relative or short.

A results row records where things were on the machine that made it: the command's
``--workdir`` and config file, the corpus cache and the standard library folder in the corpus
provenance, a pretrained model's folder. A report is read elsewhere and committed beside the
tables, so `portable` rewrites each absolute path in the text it shows: relative to the
report's directory when the path is inside it (``.`` for the directory itself), else ``.../``
and its last part (``.../python3.11``, ``.../stdlib-3.11.7-7048b7e036e1f06e``: its role, or
the content hash its name holds). The rule reads only the text and the report's directory,
never this machine's folders, so the same rows give the same report on every machine. What
identifies content (the corpus's and the weights' sha256) is kept as recorded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# an absolute POSIX path: a "/" not inside a word, a URL, a relative path or "a / b"
_ABSOLUTE = re.compile(r"(?<![\w.:/~<>\\-])/[^\s\"'`<>|,;()\[\]{}]+")


def _forms(base: Path) -> list[str]:
    """The spellings of ``base`` a row may hold: as given (made absolute) and resolved."""
    forms = {str(base.absolute()).rstrip("/"), os.path.realpath(base).rstrip("/")}
    return sorted((f for f in forms if f), key=len, reverse=True)


def _rewriter(base: Path | str | None) -> Callable[[str], str]:
    """The function `portable_text` applies for ``base``: the report directory's spellings are
    looked up once (a report rewrites every string of thousands of rows)."""
    folders = [] if base is None else _forms(Path(base))

    def rewrite(match: re.Match[str]) -> str:
        path = match.group(0)
        trail = len(path) - len(path.rstrip("."))  # a sentence's full stop
        path, end = path[: len(path) - trail], "." * trail
        for folder in folders:
            if path == folder:
                return "." + end
            if path.startswith(folder + "/"):
                return path[len(folder) + 1 :] + end
        return ".../" + path.rstrip("/").rsplit("/", 1)[-1] + end

    def text(value: str) -> str:
        return _ABSOLUTE.sub(rewrite, value) if "/" in value else value

    return text


def portable_text(text: str, base: Path | str | None = None) -> str:
    """``text`` with every absolute path rewritten (the module docstring); ``base``: the
    report's directory."""
    return _rewriter(base)(text)


def portable(value: Any, base: Path | str | None = None) -> Any:
    """``value`` (a row, a list of rows, a string, ...) with `portable_text` applied to every
    string in it, keys included; other values as they are."""
    text = _rewriter(base)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, Mapping):
            return {walk(k): walk(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return type(item)(walk(v) for v in item)
        return item

    return walk(value)
