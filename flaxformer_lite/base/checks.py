"""Argument checks shared by every layer: one rule, one message for each kind of value.

Every message has the form ``<name>=<value>: <what is allowed>``, e.g.
``block_q=0: must be a positive int`` or ``ModelConfig.num_heads=3: d_model=512 must be
divisible by num_heads``. Standard library only, so the numpy-only data layer can use them too.
"""

from __future__ import annotations

import math
import numbers
import types
import typing
from typing import Any, NoReturn


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, value and allowed values."""


def fail(name: str, value: Any, allowed: str, *, error: type[Exception] = ConfigError) -> NoReturn:
    """Raise ``error(f"{name}={value!r}: {allowed}")`` (a `ConfigError` unless told otherwise);
    a long value is cut (`shown`), so the message stays one readable line."""
    raise error(f"{name}={shown(value)}: {allowed}")


def shown(value: Any, limit: int = 300) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the full length said when it is
    longer: ``'/tmp/aaaa...' (120005 characters)``."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return f"{value[: limit - 40] + '...'!r} ({len(value)} characters)"
    if isinstance(value, bytes):
        return f"{value[: limit - 40] + b'...'!r} ({len(value)} bytes)"
    return f"{text[: limit - 40]}... ({len(text)} characters)"


def check_path(name: str, value: Any, *, error: type[Exception] = ConfigError) -> None:
    """Refuse a path (a ``str``) holding bytes that are not UTF-8: Python carries such bytes
    from a command line as lone surrogates, which no UTF-8 file (a row, REPORT.md) can hold,
    so every later write of the path would fail."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = value.encode("utf-8", "surrogateescape")  # the bytes as given
            except UnicodeEncodeError:
                raw = value.encode("utf-8", "backslashreplace")
            fail(name, raw, "holds bytes that are not UTF-8; use a path in UTF-8", error=error)


def is_int(value: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A Python or numpy real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(name: str, value: Any, *, error: type[Exception] = ValueError) -> int:
    """``value`` as an int if it is a positive integer (bools are not), else ``error``."""
    if not is_int(value) or value <= 0:
        fail(name, value, "must be a positive int", error=error)
    return int(value)


def check_positive_number(name: str, value: Any, *, error: type[Exception] = ValueError) -> float:
    """``value`` as a float if it is a finite number > 0, else ``error``."""
    if not is_number(value) or not 0 < value < math.inf:
        fail(name, value, "must be a finite number > 0", error=error)
    return float(value)


def check_type(path: str, value: Any, typ: Any, *, error: type[Exception] = ConfigError) -> Any:
    """``value`` checked against the annotation ``typ`` (int, float, bool, str, ``X | None``,
    ``tuple[X, ...]``); ints are accepted for floats and returned as floats."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return check_type(path, value, inner, error=error)
    if origin is tuple:
        item_type = args[0]
        if isinstance(value, str) or not isinstance(value, list | tuple):
            fail(path, value, f"must be a tuple of {item_type.__name__}", error=error)
        return tuple(
            check_type(f"{path}[{i}]", v, item_type, error=error) for i, v in enumerate(value)
        )
    if typ is float:
        if not is_number(value):
            fail(path, value, "must be a number", error=error)
        return float(value)
    if typ is int:
        if not is_int(value):
            fail(path, value, "must be an int", error=error)
        return int(value)
    if typ is bool and not isinstance(value, bool):
        fail(path, value, "must be True or False", error=error)
    if typ is str and not isinstance(value, str):
        fail(path, value, "must be a string", error=error)
    return value


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs as one space), clipped to ``limit``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
