"""A study's cells as data: ``config.sweep`` expanded into one run per encoding x seed (x task).

``config.sweep`` holds ``encodings`` (registry names), ``seeds``, optionally ``randomized``
(encodings also trained on randomized positions, Ruoss et al. 2023) and ``tasks`` (synthetic
tasks; one cell per task). A cell is ``{"name": ..., "overrides": {"model.positional": ...,
"seed": ..., ...}}``; its run config is the study config with those dotted-path overrides.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flaxformer_lite.base.checks import ConfigError, fail, is_int
from flaxformer_lite.train.run_config import MAX_SEED

SWEEP_FIELDS = ("encodings", "seeds", "randomized", "tasks")
# A cell name is one directory under STUDY/runs/: a portable file name, nothing that a path
# resolves (no separators, no "." or ".."), not hidden and not an option-like "-x".
CELL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


def _field(sweep: Any, name: str) -> tuple[Any, ...]:
    value = sweep.get(name, ()) if hasattr(sweep, "get") else ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"config.sweep.{name}={value!r}: must be a tuple")
    return tuple(value)


def expand_sweep(config: Any) -> list[dict[str, Any]]:
    """The cells of the study ``config`` (a ConfigDict or dict with a ``sweep`` section),
    in order: every encoding x seed, then every randomized encoding x seed, for each task."""
    sweep = config.get("sweep") if hasattr(config, "get") else None
    if sweep is None:
        raise ConfigError("config has no sweep section: it is not a study config")
    unknown = sorted(set(sweep.keys()) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(
            f"config.sweep has unknown field(s) {unknown}; allowed: {list(SWEEP_FIELDS)}"
        )
    encodings, seeds = _field(sweep, "encodings"), _field(sweep, "seeds")
    if not encodings or not seeds:
        raise ConfigError(
            f"config.sweep: encodings={encodings!r} and seeds={seeds!r} must both be non-empty"
        )
    if not all(is_int(s) and 0 <= s <= MAX_SEED for s in seeds):
        fail("config.sweep.seeds", seeds, f"each seed must be an int in [0, {MAX_SEED}]")
    models = [(e, {"model.positional": e}) for e in encodings]
    models += [
        (f"{e}-randomized", {"model.positional": e, "model.randomized_positions": True})
        for e in _field(sweep, "randomized")
    ]
    cells = [
        {"name": f"{name}-seed{seed}", "overrides": overrides | {"seed": seed}}
        for name, overrides in models
        for seed in seeds
    ]
    tasks = _field(sweep, "tasks")
    if not tasks:
        return cells
    return [
        {"name": f"{task}-{c['name']}", "overrides": c["overrides"] | {"data.task": task}}
        for task in tasks
        for c in cells
    ]


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of ``config`` with dotted-path overrides, e.g. ``{"model.positional": "rope"}``."""
    config = copy.deepcopy(config)
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = config
        for p in parents:
            if p not in node:
                raise ConfigError(f"sweep override {path!r}: config has no field {p!r}")
            node = node[p]
        if leaf not in node:
            raise ConfigError(f"sweep override {path!r}: config has no field {leaf!r}")
        node[leaf] = value
    return config


def select_cells(sweep: list[dict], only: Sequence[str]) -> list[dict]:
    """Cells whose name, encoding (``model.positional``) or task is in ``only`` (all if empty)."""
    if not only:
        return sweep

    def tags(cell: dict) -> set[str]:
        o = cell["overrides"]
        return {cell["name"], o.get("model.positional"), o.get("data.task")} - {None}

    known = set().union(*(tags(c) for c in sweep))
    unknown = sorted(set(only) - known)
    if unknown:
        raise ConfigError(
            f"--only={','.join(only)}: {unknown} not in this sweep; known: {sorted(known)}"
        )
    return [c for c in sweep if tags(c) & set(only)]


def check_overrides(sweep: list[dict], overrides: Iterable[tuple[str, Any]]) -> None:
    """Refuse a command-line override (``("config.model.positional", "rope")``) of a field
    the sweep sets for every cell: it would be silently replaced in every cell."""
    swept = {path for cell in sweep for path in cell["overrides"]}
    for name, value in overrides:
        if name.removeprefix("config.") in swept:
            raise ConfigError(
                f"--{name}={value}: set for every cell by the study's sweep; select cells "
                "with --only (e.g. --only=rope) or change config.sweep"
            )


def check_cell_names(sweep: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a cell name that is not one plain directory name under ``STUDY/runs/``
    (`CELL_NAME`: ``..``, ``/``, ``\\``, spaces or other characters a path would interpret)
    and two cells of one name (they would share a directory)."""
    seen: set[str] = set()
    for cell in sweep:
        name = cell.get("name") if isinstance(cell, Mapping) else None
        if not isinstance(name, str) or not CELL_NAME.fullmatch(name) or ".." in name:
            fail(
                "sweep cell name",
                name,
                "must be a plain directory name under STUDY/runs/: 1-200 of A-Z a-z 0-9 . _ + "
                "= -, starting with a letter or digit, without '..' (no path separators)",
            )
        if name in seen:
            fail("sweep cell name", name, "is given twice; each cell needs its own name")
        seen.add(name)
