"""Results rows (DESIGN.md §7): read ``results.jsonl`` files, report bad lines, merge run dirs.

A row is one JSON object per line: one run x evaluation length x metric with its provenance
(see ``flaxformer_lite.study.runner.rows_for_cell``). Reading never uses pickle or
executes anything: ``json.loads`` only. A line that is not a valid row (torn write, edited by
hand, missing fields, an impossible number: `_check_row`) is reported with its file and line
number — as a ``warnings.warn`` and in the returned problems, which the report states — and
skipped; it is never silently dropped, never a traceback and never a table cell.
Two different rows of one measurement (the same run, seed, evaluation length, protocol,
metric and encoding label: `measurement_key`) are an error (`DuplicateRowsError`, naming the
key and the files and lines), never averaged as if they were two seeds.

The per-block sums beside the rows (``blocks.jsonl``) belong to the rows of the same runs:
`paired_blocks` keeps a block record only when a row has its study, preset, run, seed, run
identity (``config_hash``) and cell, and names in one line the records it ignored (another
study's blocks placed beside the rows). A file that cannot be read -- a truncated or corrupt
``.gz``, a directory -- is `UnreadableFileError`, naming the file and the problem.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import warnings
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from flaxformer_lite.base.checks import one_line

RESULTS_FILE = "results.jsonl"
BLOCKS_FILE = "blocks.jsonl"  # per-block sums beside the rows (results.rows.blocks_for_cell)
# Range checks of a row's numbers (a row outside them is skipped, with its file and line):
MAX_LENGTH = 2**40  # evaluation and training lengths, strides and token counts
# metric -> (lowest, highest) allowed value; a metric not listed only has to be finite
VALUE_RANGES = {
    **dict.fromkeys(
        ("bits_per_byte", "key_bits_per_byte", "loss", "bucket_loss", "loss_by_position"),
        (0.0, float("inf")),
    ),
    "perplexity": (1.0, float("inf")),
    **dict.fromkeys(("accuracy", "exact_match"), (0.0, 1.0)),
}


class UnreadableFileError(OSError):
    """A results or blocks file cannot be read (a truncated or corrupt gzip stream, an OS
    error); ``filename`` and ``strerror`` say which file and why."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(None, problem, str(path))

    def __str__(self) -> str:
        return f"cannot read {self.filename}: {self.strerror}"


def _unreadable(path: str | Path, error: BaseException) -> UnreadableFileError:
    """The `UnreadableFileError` of ``error`` raised while reading ``path``."""
    if isinstance(error, EOFError):
        problem = "it is cut short (the gzip stream ends before its end marker)"
    elif isinstance(error, gzip.BadGzipFile | zlib.error):
        problem = f"it is not a valid gzip file ({error})"
    else:
        problem = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return UnreadableFileError(path, problem)


class ResultsWarning(UserWarning):
    """A results line was skipped (it is also returned as a `Problem`)."""


class DuplicateRowsError(ValueError):
    """Two different rows measure the same thing (`measurement_key`); the message names the
    key and where both rows are."""


# What one measurement is: a row of one run (cell) and seed at one evaluation length, protocol,
# metric (and bucket) for one encoding label, in one table group (study, task, train length).
MEASUREMENT_FIELDS = (
    "study",
    "task",
    "train_length",
    "run",
    "seed",
    "encoding",
    "eval_length",
    "protocol",
    "metric",
    "bucket",
)


def measurement_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """``row``'s `MEASUREMENT_FIELDS` (missing ones as None): at most one row per key."""
    return tuple(json.dumps(row.get(k), sort_keys=True) for k in MEASUREMENT_FIELDS)


def describe_key(row: dict[str, Any]) -> str:
    """``run='rope-seed0' seed=0 encoding='RoPE' eval_length=64 ...`` (fields set in ``row``)."""
    return " ".join(f"{k}={row[k]!r}" for k in MEASUREMENT_FIELDS if row.get(k) is not None)


def check_unique(rows: Sequence[dict[str, Any]], where: Sequence[str] | None = None) -> None:
    """Raise `DuplicateRowsError` if two rows share a `measurement_key`.

    ``where``: each row's origin (``"file:line"``), named in the message; default the row's
    index.
    """
    first: dict[tuple[Any, ...], int] = {}
    for i, row in enumerate(rows):
        key = measurement_key(row)
        if key not in first:
            first[key] = i
            continue
        j = first[key]
        places = (f"row {j + 1}", f"row {i + 1}") if where is None else (where[j], where[i])
        raise DuplicateRowsError(
            f"duplicate results rows for {describe_key(row)}: {places[0]} and {places[1]} "
            "measure the same run, seed, length, protocol and metric with different contents; "
            "one row per seed is allowed (they are not averaged): remove one"
            + _study_hint(row, where[i] if where is not None else None)
        )


@dataclasses.dataclass(frozen=True, order=True)
class Problem:
    """A results line that was skipped: where it is and why."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def results_file(path: str | Path) -> Path:
    """``path`` itself if it is a file, else ``path/results.jsonl`` (or, where only that is
    there, its gzip-compressed ``results.jsonl.gz``: rows committed to a repository)."""
    path = Path(path)
    return _plain_or_gz(path / RESULTS_FILE) if path.is_dir() else path


def _plain_or_gz(path: Path) -> Path:
    """``path``, or ``path.gz`` when only the compressed file exists."""
    packed = path.with_name(path.name + ".gz")
    return packed if not path.exists() and packed.is_file() else path


def open_text(path: str | Path):
    """A JSON-lines file for reading as text (UTF-8, bad bytes replaced), gunzipped on the
    fly when its name ends in ``.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


_STRING = (("must be a string", lambda x: isinstance(x, str)),)
_LENGTH = (
    (
        "must be a positive integer",
        lambda x: isinstance(x, int) and not isinstance(x, bool) and x > 0,
    ),
    ("must be at most 2**40", lambda x: x <= MAX_LENGTH),
)
_COUNT = (
    (
        "must be an integer in [0, 2**40]",
        lambda x: _is_number(x) and 0 <= x <= MAX_LENGTH and x == int(x),
    ),
)
# The row schema: field -> (required, its rules (what the value must be, test), checked in order
# when the field is required or not null). Besides, every number a row holds must be finite and
# 'value' must fit its metric (VALUE_RANGES).
ROW_FIELDS = {
    "encoding": (True, _STRING),
    "metric": (True, _STRING),
    "value": (True, ()),
    "eval_length": (True, _LENGTH),
    "train_length": (False, _LENGTH),
    **dict.fromkeys(
        ("stride", "tokens", "num_scored_tokens", "context_block", "key_targets"), (False, _COUNT)
    ),
}


def _check_row(row: Any) -> str | None:
    """Why ``row`` is not a usable results row (`ROW_FIELDS`, `VALUE_RANGES`), or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    missing = [k for k, (required, _) in ROW_FIELDS.items() if required and k not in row]
    if missing:
        return f"missing field(s) {missing}"
    for key, n in row.items():  # every number a row holds is a finite float
        if _is_number(n) and not _finite(n):
            return f"{key!r} must be a finite number, got {_shown(n)}"
    for key, (required, rules) in ROW_FIELDS.items():
        n = row.get(key)
        if n is None and not required:
            continue
        rule = next((r for r, ok in rules if not ok(n)), None)
        if rule:
            return f"{key!r} {rule}, got {_shown(n)}"
    value = row["value"]
    low, high = VALUE_RANGES.get(row["metric"], (-float("inf"), float("inf")))
    if row["metric"] == "loss_by_position":
        if not isinstance(value, list) or not all(v is None or _is_number(v) for v in value):
            return "'value' of loss_by_position must be a list of numbers/null"
        for i, v in enumerate(value):
            if v is not None and not (_finite(v) and low <= v <= high):
                where = f"'value' of loss_by_position at position {i}"
                return f"{where} is {_shown(v)}: {_range(low, high)}"
        return None
    if value is None and isinstance(row.get("na"), str):
        return None  # a cell the model cannot be evaluated at, with its reason
    if not _is_number(value):
        return f"'value' must be a number, got {_shown(value)}"
    if not low <= value <= high:
        return f"'value' of {row['metric']} is {_shown(value)}: {_range(low, high)}"
    if row["metric"] == "bucket_loss" and not isinstance(row.get("bucket"), str):
        return "bucket_loss row without a 'bucket' string"
    return None


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _finite(x: int | float) -> bool:
    """Whether ``x`` is a finite float (an integer too large for one is not)."""
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _shown(x: Any) -> str:
    """``x`` as JSON, clipped (a 401-digit integer by its digit count)."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**40:
        return f"an integer of {len(str(abs(x)))} digits"
    try:
        return _clip(json.dumps(x), 40)
    except ValueError:  # deeply nested
        return type(x).__name__


def _range(low: float, high: float) -> str:
    if high == float("inf"):
        return f"must be >= {low:g} and finite"
    return f"must be in [{low:g}, {high:g}]"


def cell_rows_file(study_dir: Path, row: dict[str, Any]) -> Path | None:
    """Where a study's row comes from: its cell's ``runs/<cell>/rows.jsonl`` (what
    ``results.jsonl`` is rebuilt from), None when there is no such file."""
    run = row.get("run")
    cell = study_dir / "runs" / run / "rows.jsonl" if isinstance(run, str) else None
    return cell if cell is not None and cell.is_file() else None


def _study_hint(row: dict[str, Any], where: str | None) -> str:
    """Where a study's ``results.jsonl`` row came from: its cell's ``rows.jsonl``."""
    path = Path(where.rsplit(":", 1)[0]) if where is not None else None
    cell = cell_rows_file(path.parent, row) if path and path.name == RESULTS_FILE else None
    if cell is None:
        return ""
    return f" (results.jsonl is rebuilt from {cell}: fix that file, or delete it to recompute)"


def read_rows_file(path: str | Path) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Every valid row of one JSON-lines file, and a `Problem` per skipped line.

    Blank lines are ignored; lines are numbered from 1. An exact duplicate of an earlier line
    of the same file is also reported and skipped (a correct writer never produces one).
    Raises FileNotFoundError if the file does not exist.
    """
    rows, _, problems = read_rows_lines(path)
    return rows, problems


def read_rows_lines(path: str | Path) -> tuple[list[dict[str, Any]], list[int], list[Problem]]:
    """`read_rows_file` plus the line number of every row."""
    path = Path(path)
    rows, numbers, problems = [], [], []
    first_line: dict[str, int] = {}
    try:
        with open_text(path) as f:
            lines = list(f)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, zlib.error) as e:
        raise _unreadable(path, e) from None
    for number, line in enumerate(lines, start=1):  # read whole: a damaged .gz fails first
        text = line.strip()
        if not text:
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            reason = f"not valid JSON ({e.msg} at column {e.colno}): {_clip(text)}"
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, nesting
            reason = f"not a usable JSON value ({type(e).__name__}: {_clip(str(e))})"
        else:
            reason = _check_row(row)
        if reason is None:
            key = row_key(row)
            if key in first_line:
                reason = f"exact duplicate of line {first_line[key]}"
            else:
                first_line[key] = number
                rows.append(row)
                numbers.append(number)
        if reason is not None:
            problems.append(Problem(str(path), number, f"skipped: {reason}"))
    return rows, numbers, problems


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def row_key(row: dict[str, Any]) -> str:
    """Canonical form of a row's content (equal for rows with identical content)."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=True)


def merge_rows(*row_lists: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Concatenate row lists, dropping exact duplicates (same content) after their first copy.

    Distinct measurements — any field differs, even a timestamp — are all kept, in order of
    first appearance. Returns ``(rows, number_of_duplicates_dropped)``.
    """
    seen: set[str] = set()
    out, dropped = [], 0
    for rows in row_lists:
        for row in rows:
            key = row_key(row)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            out.append(row)
    return out, dropped


@overload
def load_rows(
    paths: str | Path | Sequence[str | Path],
    *,
    return_problems: Literal[False] = ...,
    warn: bool = ...,
) -> list[dict[str, Any]]: ...
@overload
def load_rows(
    paths: str | Path | Sequence[str | Path], *, return_problems: Literal[True], warn: bool = ...
) -> tuple[list[dict[str, Any]], list[Problem]]: ...
def load_rows(paths, *, return_problems=False, warn=True):
    """Rows of one or more run dirs (their ``results.jsonl``) or JSON-lines files, merged.

    Args:
      paths: a run dir or results file, or a sequence of them (merged in order).
      return_problems: also return the list of skipped lines (`Problem`, sorted by file
        order then line), for the report to state.
      warn: emit a `ResultsWarning` per skipped line (naming file and line number).

    Returns:
      The rows (exact duplicates across files dropped silently — the same run dir merged twice
      is harmless; order of first appearance), or ``(rows, problems)`` with
      ``return_problems=True``.

    Raises:
      FileNotFoundError: a path has no results file.
      DuplicateRowsError: two different rows of one measurement (`check_unique`), e.g. a
        row edited and appended, or two run dirs that both measured one run and seed.
    """
    rows, problems, _ = load_rows_with_origins(paths)
    if warn:
        for problem in problems:
            warnings.warn(str(problem), ResultsWarning, stacklevel=2)
    if return_problems:
        return rows, problems
    return rows


def load_rows_with_origins(
    paths: str | Path | Sequence[str | Path],
) -> tuple[list[dict[str, Any]], list[Problem], list[tuple[str, int]]]:
    """`load_rows` ``(rows, problems)`` (no warnings) and where each row is: ``(file,
    line)``, the first place it was read from (what a refusal to compare rows names)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    row_lists, problems, origin = [], [], {}
    for p in paths:
        file = results_file(p)
        if not file.is_file():
            raise FileNotFoundError(f"no results file: {file} (expected a run dir or a .jsonl)")
        rows, numbers, file_problems = read_rows_lines(file)
        row_lists.append(rows)
        problems += file_problems
        for row, number in zip(rows, numbers, strict=True):
            origin.setdefault(row_key(row), (str(file), number))
    rows, _ = merge_rows(*row_lists)
    origins = [origin[row_key(r)] for r in rows]
    check_unique(rows, [f"{file}:{line}" for file, line in origins])
    problems = list(dict.fromkeys(problems))  # the same file given twice
    return rows, problems, origins


def load_blocks(paths: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """The per-block records (``blocks.jsonl``) beside the results files of ``paths`` (run
    dirs or results files); a path without one contributes nothing, an unreadable line is
    skipped (its cells then fall back to intervals without block data). A file that cannot
    be read raises `UnreadableFileError`. `paired_blocks` keeps only the rows' own."""
    return [r for _, records in _blocks_by_file(paths) for r in records]


def _blocks_by_file(paths: str | Path | Sequence[str | Path]) -> list[tuple[Path, list[dict]]]:
    if isinstance(paths, str | Path):
        paths = [paths]
    out = []
    for p in paths:
        file = _plain_or_gz(results_file(p).parent / BLOCKS_FILE)
        if not file.is_file():
            continue
        try:
            with open_text(file) as f:
                lines = f.read().splitlines()
        except (OSError, EOFError, zlib.error) as e:
            raise _unreadable(file, e) from None
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and isinstance(record.get("blocks"), dict):
                records.append(record)
        out.append((file, records))
    return out


# What ties a block record to its rows: the run that made both (study, preset, cell, seed and
# run identity) and the evaluated cell (encoding label, protocol, length).
BLOCK_OWNER_FIELDS = (
    "study",
    "preset",
    "run",
    "seed",
    "config_hash",
    "task",
    "train_length",
    "encoding",
    "protocol",
    "eval_length",
)


def block_owner(record: dict[str, Any]) -> tuple[str, ...]:
    """A row's or block record's `BLOCK_OWNER_FIELDS` (missing ones as None)."""
    return tuple(json.dumps(record.get(k), sort_keys=True) for k in BLOCK_OWNER_FIELDS)


def paired_blocks(
    paths: str | Path | Sequence[str | Path], rows: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """``(records, notes)``: the block records beside ``paths`` that belong to ``rows`` (a row
    with the same `block_owner`), and one note per file whose other records were ignored,
    e.g. another study's ``blocks.jsonl.gz`` placed beside the rows: never an interval or a
    significance mark from blocks of other runs."""
    owned = {block_owner(r) for r in rows}
    kept: list[dict[str, Any]] = []
    notes = []
    for file, records in _blocks_by_file(paths):
        foreign = [r for r in records if block_owner(r) not in owned]
        kept += [r for r in records if block_owner(r) in owned]
        if foreign:
            r = foreign[0]
            notes.append(
                f"{file}: ignored {len(foreign)} of {len(records)} block record(s) that belong to "
                f"no results row here (e.g. study {r.get('study')!r}, preset {r.get('preset')!r}, "
                f"run {r.get('run')!r}, config_hash {r.get('config_hash')!r}): intervals use "
                "only the blocks of the rows' own runs"
            )
    return kept, notes


def error_line(path: str | Path, limit: int = 400) -> str | None:
    """The last line of a failed cell's ``error.txt`` (the exception and its message), or
    None when there is none (the cell did not fail, or the file cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    last = next((line for line in reversed(text.splitlines()) if line.strip()), None)
    return None if last is None else one_line(last, limit)


def learning_rate_tag(rate: float) -> str:
    """``rate`` as it appears in a cell name: ``3e-3`` for 0.003, ``2.5e-4``, ``1e-2``."""
    mantissa, exponent = f"{float(rate):e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
