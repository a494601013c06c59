"""Results rows (DESIGN.md §7): read ``results.jsonl`` files, report bad lines, merge run dirs.

A row is one JSON object per line: one run x evaluation length x metric with its provenance
(see ``flaxformer_lite.experiments.runner.rows_for_cell``). Reading never uses pickle or
executes anything: ``json.loads`` only. A line that is not a valid row (torn write, edited by
hand, missing fields) is reported with its file and line number — as a ``warnings.warn`` and
in the returned problems, which the report states — and skipped; it is never silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, overload

RESULTS_FILE = "results.jsonl"
BLOCKS_FILE = "blocks.jsonl"  # per-block sums beside the rows (experiments.rows.blocks_for_cell)
REQUIRED_FIELDS = ("encoding", "metric", "value", "eval_length")


class ResultsWarning(UserWarning):
    """A results line was skipped (it is also returned as a `Problem`)."""


@dataclasses.dataclass(frozen=True, order=True)
class Problem:
    """A results line that was skipped: where it is and why."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def results_file(path: str | Path) -> Path:
    """``path`` itself if it is a file, else ``path/results.jsonl``."""
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def _check_row(row: Any) -> str | None:
    """Why ``row`` is not a usable results row, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        return f"missing field(s) {missing}"
    if not isinstance(row["encoding"], str) or not isinstance(row["metric"], str):
        return "fields 'encoding' and 'metric' must be strings"
    for key in ("eval_length", "train_length"):
        n = row.get(key)
        if (key in REQUIRED_FIELDS or n is not None) and not _positive_int(n):
            return f"{key!r} must be a positive integer, got {json.dumps(n)[:40]}"
    value = row["value"]
    if row["metric"] == "loss_by_position":
        ok = isinstance(value, list) and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in value
        )
        return None if ok else "'value' of loss_by_position must be a list of numbers/null"
    if value is None and isinstance(row.get("na"), str):
        return None  # a cell the model cannot be evaluated at, with its reason
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"'value' must be a number, got {json.dumps(value)[:40]}"
    if row["metric"] == "bucket_loss" and not isinstance(row.get("bucket"), str):
        return "bucket_loss row without a 'bucket' string"
    return None


def read_rows_file(path: str | Path) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Every valid row of one JSON-lines file, and a `Problem` per skipped line.

    Blank lines are ignored; lines are numbered from 1. An exact duplicate of an earlier line
    of the same file is also reported and skipped (a correct writer never produces one).
    Raises FileNotFoundError if the file does not exist.
    """
    path = Path(path)
    rows, problems = [], []
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                reason = f"not valid JSON ({e.msg} at column {e.colno}): {_clip(text)}"
            else:
                reason = _check_row(row)
            if reason is None:
                key = row_key(row)
                if key in first_line:
                    reason = f"exact duplicate of line {first_line[key]}"
                else:
                    first_line[key] = number
                    rows.append(row)
            if reason is not None:
                problems.append(Problem(str(path), number, f"skipped: {reason}"))
    return rows, problems


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


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
      is harmless; distinct measurements kept; order of first appearance), or
      ``(rows, problems)`` with ``return_problems=True``.

    Raises:
      FileNotFoundError: a path has no results file.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    row_lists, problems = [], []
    for p in paths:
        file = results_file(p)
        if not file.is_file():
            raise FileNotFoundError(f"no results file: {file} (expected a run dir or a .jsonl)")
        rows, file_problems = read_rows_file(file)
        row_lists.append(rows)
        problems += file_problems
    rows, _ = merge_rows(*row_lists)
    problems = list(dict.fromkeys(problems))  # the same file given twice
    if warn:
        for problem in problems:
            warnings.warn(str(problem), ResultsWarning, stacklevel=2)
    if return_problems:
        return rows, problems
    return rows


def load_blocks(paths: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """The per-block records (``blocks.jsonl``) beside the results files of ``paths`` (run
    dirs or results files); a path without one contributes nothing, an unreadable line is
    skipped (its cells then fall back to intervals without block data)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    out: list[dict[str, Any]] = []
    for p in paths:
        file = results_file(p).parent / BLOCKS_FILE
        if not file.is_file():
            continue
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("blocks"), dict):
                out.append(record)
    return out
