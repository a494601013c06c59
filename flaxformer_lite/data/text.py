"""Byte tokens -> text (the vocabulary of every corpus here is the 256 byte values)."""

from __future__ import annotations

import numpy as np


def decode_bytes(tokens: np.ndarray) -> str:
    """Byte ids ``[n]`` as text: UTF-8, invalid sequences replaced; ids outside 0..255
    (possible only with a larger vocabulary) become ``?``."""
    data = bytes(int(t) if 0 <= t < 256 else ord("?") for t in np.asarray(tokens).reshape(-1))
    return data.decode("utf-8", errors="replace")
