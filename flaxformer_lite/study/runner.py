"""The sweep runner: every cell of a study (encoding x seed) through `train_and_evaluate`.

A study directory looks like::

    STUDY/study.json          the base config, the sweep, the command and the study (name,
                              preset, cells): another study here is refused; "selected" (the
                              cells --only kept) and "shard" ("I/N" or null)
    STUDY/runs/<cell>/        one `train_and_evaluate` workdir per cell; its identity.json
                              (`train.identity`) says what made its state
    STUDY/runs/<cell>/rows.jsonl   that cell's results rows (written atomically when it ends)
    STUDY/results.jsonl       all finished cells' rows, rebuilt atomically after every cell
    STUDY/REPORT.md, tables/, plots/   the report, rebuilt from results.jsonl

Resumable at every point: a finished cell (its ``rows.jsonl`` holds every row it should) is
skipped -- a damaged one (empty, cut short, unparsable) is recomputed with a warning naming
the file --, an interrupted one resumes from its newest checkpoint, and ``results.jsonl`` is
only ever replaced whole, so a kill never leaves a torn or duplicated row. A failed cell is reported
and the study goes on; the runner then exits non-zero.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from flaxformer_lite.base import interrupt
from flaxformer_lite.base.checks import ConfigError, one_line
from flaxformer_lite.base.io import atomic_write_text, environment_error, write_error
from flaxformer_lite.base.progress import bars as progress_bars
from flaxformer_lite.data.data_config import open_dataset
from flaxformer_lite.pretrained import load as pretrained_load
from flaxformer_lite.results.comparable import MixedRowsError
from flaxformer_lite.results.rows import (
    CellRowsError,
    blocks_for_cell,
    cell_rows_problem,
    made_rows_problem,
    rows_for_cell,
)
from flaxformer_lite.results.store import BLOCKS_FILE, RESULTS_FILE, DuplicateRowsError, error_line
from flaxformer_lite.study.sweeps import (
    StudyCell,
    check_cell_names,
    check_overrides,
    expand_sweep,
    parse_shard,
    select_cells,
    shard_cells,
)
from flaxformer_lite.train import cost, identity
from flaxformer_lite.train.loop import (
    check_writable_dir,
    preflight,
    train_and_evaluate,
    workdir_lock,
)

# writes a study's report: (study dir, failed=cell -> error line, missing=lines) -> REPORT.md
Reporter = Callable[..., Path | None]


class Study:
    """One study directory: its cells, their state, and the merged results."""

    def __init__(self, config: Any, sweep: list[dict], workdir: str | Path, command: str):
        self.config = config
        self.sweep = sweep
        self.workdir = Path(workdir)
        self.command = command
        # each cell resolved once (`cell`), or the ConfigError its config gives under this call
        self._cells: dict[str, StudyCell | ConfigError] = {}
        self._restarts: dict[str, tuple] = {}  # name -> (cell or None, differences)
        # this call's selection: the cells --only kept (all of a shard's N shards together)
        # and the shard (I, N); recorded in study.json for the report's missing cells
        self.selected: list[str] = [c["name"] for c in sweep]
        self.shard: tuple[int, int] | None = None

    def cell_dir(self, name: str) -> Path:
        return self.workdir / "runs" / name

    def cell(self, name: str) -> StudyCell:
        """The sweep's cell ``name``, resolved once (`sweeps.StudyCell.resolve`: the only place
        a cell's run config is built) and kept with what the pre-flight adds (`add`). Raises
        the `ConfigError` of a cell whose config is not valid under this call's overrides
        (again at every call: resolved once, refused each time)."""
        if name not in self._cells:
            (spec,) = [c for c in self.sweep if c["name"] == name]
            try:
                self._cells[name] = StudyCell.resolve(self.config, spec)
            except ConfigError as e:
                self._cells[name] = e
        cell = self._cells[name]
        if isinstance(cell, ConfigError):
            raise cell
        return cell

    def add(self, cell: StudyCell) -> StudyCell:
        """Keep ``cell`` (e.g. with its identity) as the study's cell of its name."""
        self._cells[cell.name] = cell
        return cell

    def is_done(self, name: str, *, warn: bool = False) -> bool:
        """Whether the cell ``name`` has finished: its ``rows.jsonl`` holds every row it
        should (`rows.cell_rows_problem`). A damaged file -- empty, cut short, a line that is
        not a valid row -- is an unfinished cell, recomputed by the next run (cheaply: from
        its final checkpoint and, when valid, its ``eval.json``); ``warn``: say so in a
        `RuntimeWarning` naming the file."""
        path = self.cell_dir(name) / "rows.jsonl"
        if not path.exists():
            return False
        try:
            run = self.cell(name).run
        except ConfigError:  # a cell not selected, invalid under this call's overrides:
            run = None  # its file is checked, its expected rows are not
        problem = cell_rows_problem(path, run, name)
        if problem is not None and warn:
            # one place and text: shown once however often the state is checked
            warnings.warn(
                f"{path} {problem}: the cell counts as not finished (left out of the results) "
                "and the study recomputes it",
                RuntimeWarning,
                stacklevel=1,
            )
        return problem is None

    def write_manifest(self) -> None:
        manifest = {
            "config": self.config.to_dict(),
            "sweep": self.sweep,
            "command": self.command,
            "study": self.study_identity(),  # the study this workdir holds
            "selected": self.selected,  # the cells this call's shards cover together
            "shard": None if self.shard is None else "/".join(map(str, self.shard)),
        }
        # Each cell's workdir refuses a different config; the manifest records the latest call.
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(manifest, indent=1, default=str, sort_keys=True)
        atomic_write_text(self.workdir / "study.json", text)

    def study_identity(self) -> dict[str, Any]:
        """``{"name": config.study, "preset": config.preset, "cells": [...]}``."""
        return {
            "name": self.config.get("study", "run"),
            "preset": self.config.get("preset", ""),
            "cells": [c["name"] for c in self.sweep],
        }

    def check_same_study(self) -> None:
        """Raise `ConfigError` if the workdir holds another study: its ``study.json`` names
        another study or preset, or ``runs/`` holds a run of a cell this sweep does not have
        (its rows would silently leave the results). Writes nothing."""
        mine = self.study_identity()
        path = self.workdir / "study.json"
        where = f"workdir={str(self.workdir)!r}"
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise ConfigError(
                    f"{where}: {path} is unreadable ({type(e).__name__}: {e}); it records which "
                    "study the workdir holds: restore it, or use another --workdir"
                ) from None
            old = old if isinstance(old, dict) else {}
            config = old.get("config") if isinstance(old.get("config"), dict) else {}
            recorded = old.get("study") if isinstance(old.get("study"), dict) else {}
            name = recorded.get("name", config.get("study", "run"))
            preset = recorded.get("preset", config.get("preset", ""))
            if (name, preset) != (mine["name"], mine["preset"]):
                raise ConfigError(
                    f"{where} holds study {name!r} (preset {preset!r}), not {mine['name']!r} "
                    f"(preset {mine['preset']!r}); use another --workdir"
                )
        runs = self.workdir / "runs"
        if runs.is_dir():
            extra = sorted(
                p.name
                for p in runs.iterdir()
                if p.is_dir() and p.name not in mine["cells"] and identity.recorded(p) is not None
            )
            if extra:
                shown = ", ".join(extra[:5]) + (", ..." if len(extra) > 5 else "")
                raise ConfigError(
                    f"{where} holds {len(extra)} cell(s) that the sweep of study "
                    f"{mine['name']!r} (preset {mine['preset']!r}) does not have ({shown}); "
                    "use another --workdir, or the sweep that made them"
                )

    def check_identities(self, restart_changed: bool) -> None:
        """Compare every cell's recorded identity (`train.identity`) with the current one:
        the selected cells' (their `StudyCell.identity`, from the pre-flight) and those
        ``--only`` leaves out that hold a run, so that the workdir never holds two configs.
        Any difference raises one `ConfigError` listing the fields and cells, unless
        ``restart_changed``: then `restart_changed_cells` will start them afresh. A cell whose
        model cannot be loaded here (``unavailable``, `check_available`: never selected) is
        left as it is: its run can be neither checked nor restarted without its model. Writes
        nothing."""
        changed: dict[str, list[str]] = {}
        current: dict[str, StudyCell] = {}
        opened: dict[Any, Any] = {}
        for spec in self.sweep:
            name = spec["name"]
            old = identity.recorded(self.cell_dir(name))
            if old is None or spec.get("labels", {}).get("unavailable"):
                continue
            try:
                cell = self.cell(name)
                if cell.identity is None:  # not selected: its data is opened here
                    if cell.run.data not in opened:
                        opened[cell.run.data] = open_dataset(cell.run.data)
                    record = identity.current(cell.run, opened[cell.run.data], previous=old)
                    cell = self.add(dataclasses.replace(cell, identity=record))
            except ConfigError as e:
                changed[name] = [f"its config is not valid now ({e})"]
                continue
            current[name] = cell
            diffs, _ = identity.compare(old, cell.identity)
            if diffs:
                changed[name] = diffs
        if changed and not restart_changed:
            names = list(changed)
            diffs = list(dict.fromkeys(d for n in names for d in changed[n]))
            raise ConfigError(identity.refusal(self.cell_dir(names[0]), diffs, names[1:]))
        self._restarts = {name: (current.get(name), diffs) for name, diffs in changed.items()}

    def restart_changed_cells(self) -> None:
        """Start every cell `check_identities` found changed afresh in place (only ``eval.*``
        changed: keep its training, evaluate again); one line on stderr says which."""
        fresh, again = [], []
        for name, (cell, diffs) in self._restarts.items():
            record = None if cell is None else cell.identity
            keep = record is not None and identity.evaluation_only(diffs)
            (again if keep else fresh).append(name)
            config = None if cell is None else cell.run.to_dict()
            kept = identity.reset(self.cell_dir(name), record, config, keep_training=keep)
            if kept:  # only what the run wrote was deleted
                print(identity.kept_line(self.cell_dir(name), kept), file=sys.stderr)
        for names, what in (
            (fresh, "start afresh"),
            (again, "keep their training, evaluated again"),
        ):
            if names:
                diffs = dict.fromkeys(d for n in names for d in self._restarts[n][1])
                print(
                    f"--restart_changed: {len(names)} cell(s) {what} ({', '.join(names)}): "
                    f"differ in {', '.join(diffs)}",
                    file=sys.stderr,
                )
        self._restarts = {}

    def merge_results(self) -> Path:
        """Rebuild ``results.jsonl`` and ``blocks.jsonl`` from every finished cell, in sweep
        order (atomic); returns the path of ``results.jsonl``."""
        done = [c["name"] for c in self.sweep if self.is_done(c["name"], warn=True)]
        for name in (BLOCKS_FILE, RESULTS_FILE):
            lines = []
            for cell in done:
                path = self.cell_dir(cell) / (name if name == BLOCKS_FILE else "rows.jsonl")
                if path.exists():
                    lines.append(path.read_text())
            atomic_write_text(self.workdir / name, "".join(lines))
        return self.workdir / RESULTS_FILE

    def unfinished(self, failed: dict[str, str]) -> tuple[dict[str, str], list[str]]:
        """What the report must say is not in its tables: ``(failed, missing)``. ``failed``:
        each selected cell that failed -- in this call (``failed``: cell -> error) or, not
        run now, before (its ``error.txt``) -- with its error line; ``missing``: one line
        naming the other selected cells without rows (another shard's, or not run)."""
        errors: dict[str, str] = {}
        absent = []
        for name in self.selected:
            if self.is_done(name):
                continue
            error = failed.get(name)
            line = one_line(error) if error else error_line(self.cell_dir(name) / "error.txt")
            if line:
                errors[name] = line
            else:
                absent.append(name)
        if not absent:
            return errors, []
        study = self.study_identity()
        line = (
            f"{len(absent)} cell(s) of study {study['name']} (preset {study['preset']}) have no "
            f"results: {', '.join(absent)}"
        )
        if self.shard is not None:
            line += (
                f" (this workdir runs shard {self.shard[0]}/{self.shard[1]}: merge the shards' "
                "workdirs with flaxformer-lite report)"
            )
        return errors, [line]

    def record_failure(self, cell: StudyCell, error: Exception) -> str:
        """``"Type: message"`` of a cell's failure, its traceback written to the cell's
        ``error.txt``; re-raised instead when writing state failed (`environment_error`: the
        next cell would fail too)."""
        stop = environment_error(error)
        if stop is error:
            raise error
        if stop is not None:
            raise stop from error
        line = f"{type(error).__name__}: {error}"
        tqdm.write(f"cell {cell.name} failed: {line}")
        error_file = self.cell_dir(cell.name) / "error.txt"
        try:
            error_file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as mkdir_error:
            raise write_error(mkdir_error, error_file) from mkdir_error
        atomic_write_text(error_file, traceback.format_exc())
        return line

    def run_cell(self, cell: StudyCell) -> None:
        """Train and evaluate ``cell`` (`train_and_evaluate` of its run config) and write its
        blocks and rows (``rows.jsonl`` last: it marks the cell finished)."""
        summary = train_and_evaluate(cell.run, self.cell_dir(cell.name), ready=cell.ready)
        interrupt.where(phase="writing the rows of")
        rows = rows_for_cell(
            cell.run, cell.name, summary, self.command, cell.labels, cell.overrides
        )
        problem = made_rows_problem(rows, cell.run)
        if problem is not None:  # never rows the study would drop: the cell failed
            raise CellRowsError(problem)
        blocks = blocks_for_cell(cell.run, cell.name, summary)
        text = "".join(json.dumps(b, sort_keys=True) + "\n" for b in blocks)
        atomic_write_text(self.cell_dir(cell.name) / BLOCKS_FILE, text)
        text = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        atomic_write_text(self.cell_dir(cell.name) / "rows.jsonl", text)  # last: done


def check_available(specs: Sequence[dict]) -> None:
    """Refuse, in one line, the cells ``specs`` whose model cannot be loaded here (the
    ``unavailable`` of their ``sweep.models`` entry, e.g. a missing package's pip command),
    naming them; the other cells of the sweep stay runnable with ``--only``."""
    reasons: dict[str, list[str]] = {}
    for spec in specs:
        reason = spec.get("labels", {}).get("unavailable")
        if reason:
            reasons.setdefault(reason, []).append(spec["name"])
    if reasons:
        raise ConfigError(
            "; ".join(f"{reason} (cells {', '.join(names)})" for reason, names in reasons.items())
            + "; --only=NAME runs the other cells"
        )


def check_hub_models(specs: Sequence[dict]) -> None:
    """Refuse, in one line naming every one of them with the command that fetches it
    (`pretrained.missing_models_message`), the hub models of the cells ``specs``
    (``pretrained.source`` not a local path) that are neither in the Hugging Face cache nor
    downloadable; a model that is fetched here is fetched once (`pretrained.resolve`
    caches it)."""
    missing = []
    for spec in specs:
        source = spec["overrides"].get("pretrained.source")
        if not isinstance(source, str) or not source or Path(source).expanduser().exists():
            continue
        revision = spec["overrides"].get("pretrained.revision") or None
        try:
            pretrained_load.resolve(source, revision=revision)
        except pretrained_load.MissingModelError as e:
            missing.append(e)
        except pretrained_load.PretrainedError:
            continue  # not a hub id: its cell's config check names it
    if missing:
        raise ConfigError(pretrained_load.missing_models_message(missing))


def run_study(
    config: Any,
    workdir: str | Path,
    *,
    sweep: list[dict] | None = None,
    only: Sequence[str] = (),
    command: str = "",
    overrides: Sequence[tuple[str, Any]] = (),
    report: Reporter | None = None,
    progress: bool = True,
    restart_changed: bool = False,
    shard: tuple[int, int] | str | None = None,
) -> dict[str, Any]:
    """Run every selected cell (skipping finished ones), merge rows, write the report.

    Args:
      config: the study config (``ml_collections.ConfigDict`` from ``configs/*.py``).
      workdir: the study directory.
      sweep: the cells; default `sweeps.expand_sweep` ``(config)``.
      only: run only the cells with these names, encodings or tasks.
      command: the command line, recorded in every row.
      overrides: the command line's ``--config.`` overrides ``[(name, value)]``; one of a
        field the sweep sets for every cell is refused.
      report: ``report(study_dir, failed=..., missing=...)`` writes the study's report once
        its cells have run and returns its path (`flaxformer_lite.report.study_reporter`
        makes one from a study config; ``flaxformer_lite.run_study`` passes it): ``failed``
        maps each failed selected cell to its error line, ``missing`` names the selected cells
        without results. None writes none. The runner itself never imports the report.
      progress: show progress bars.
      restart_changed: cells whose recorded identity differs start afresh in place (only
        ``eval.*`` differs: their training is kept and they are evaluated again) instead of
        being refused -- also the cells ``only`` leaves out (they are reset, not run).
      shard: ``(I, N)`` or ``"I/N"`` (0-based, 0 <= I < N): run only shard I of N of the
        selected cells (`sweeps.shard_cells`: deterministic, balanced by `sweeps.cell_cost`),
        so N machines or GPUs can share one study. Give each shard its own workdir (the
        workdir lock refuses a second process on one) and merge them with
        ``flaxformer-lite report DIR_0 ... DIR_N-1 --out=DIR``, which names missing cells.

    A workdir holds one study (`Study.check_same_study`) and every cell's run continues, or
    counts as finished, only under the identity it was made with (`train.identity`: the
    config fields that change numbers, the corpus content hash, the versions;
    `Study.check_identities`). Every selected cell's config, data and workdir are checked
    before anything is written
    (`ConfigError`: a bad value, a missing corpus, a batch the devices do not divide, an
    unwritable directory, a cell name that is not one directory under ``runs/``, a memory
    estimate above the memory available (`train.memory`), a cell workdir that holds a run
    of a different config), so a bad
    call fails fast and writes nothing. Then the study holds ``workdir/.lock`` until it
    returns: a second process on the same workdir gets `lock.WorkdirBusyError`.
    An OS error while writing state (`io.StateWriteError`: disk full, quota, read-only or
    failing disk) stops the study at once (the next cell would fail the same way), leaving
    a state that the same call resumes; any other failure of a cell is recorded in its
    ``error.txt`` and the study goes on.
    Returns ``{"done": [...], "failed": {name: error}, "results": path, "report": path}``
    (``report``: REPORT.md, or None when none was written). REPORT.md lists the failed cells
    with their error lines and the selected cells without results, and is written even when
    every cell failed.
    """
    interrupt.where(run=None, phase="checking the config and data")
    sweep = expand_sweep(config) if sweep is None else sweep
    check_cell_names(sweep)  # every cell's directory inside STUDY/runs/
    check_overrides(sweep, overrides)
    specs = select_cells(sweep, only)
    study = Study(config, sweep, workdir, command)
    study.selected = [c["name"] for c in specs]
    if shard is not None:
        study.shard = parse_shard(shard)
        specs = shard_cells(specs, study.shard, config)
    check_writable_dir(study.workdir, "workdir")
    study.check_same_study()
    check_available(specs)  # models whose packages are missing, when selected
    check_hub_models(specs)  # every missing hub model named at once
    cells = [study.cell(c["name"]) for c in specs]  # every config error before any data's
    for i, cell in enumerate(cells):
        ready = preflight(cell.run, study.cell_dir(cell.name))  # data, devices, memory, dir
        old = identity.recorded(study.cell_dir(cell.name))  # reuses its model's hashes
        record = identity.current(cell.run, ready.dataset, previous=old)
        cells[i] = study.add(cell.checked(ready, record))
    study.check_identities(restart_changed)  # every cell, --only or not
    with workdir_lock(study.workdir):
        return _run_locked(study, cells, report, progress)


def _estimate_line(todo: list[StudyCell], done: int) -> str:
    """``study: N cell(s) to run (M done), ≈ ...``: the time `train.cost` estimates for the
    cells left."""
    flops = [cost.run_flops(c.run, c.ready.plan, c.ready.dataset) for c in todo]
    # the fraction of the rate reached, weighted by work (each cell's evaluated model's width)
    models = [c.ready.plan.quick.model for c in todo]
    at_rate = sum(f / cost.efficiency(m) for f, m in zip(flops, models, strict=True))
    reached = sum(flops) / at_rate if at_rate else cost.EFFICIENCY
    compiles = sum(cost.run_compiles(c.run, c.ready.plan) for c in todo)
    estimate = cost.describe(sum(flops), compiles, cost.matmul_rate(), reached)
    return f"study: {len(todo)} cell(s) to run ({done} done), {estimate}"


def _run_locked(
    study: Study, cells: list[StudyCell], report: Reporter | None, progress: bool
) -> dict:
    """`run_study` once its checks passed, holding the study's lock."""
    study.write_manifest()
    study.restart_changed_cells()
    failed: dict[str, str] = {}
    todo = [c for c in cells if not study.is_done(c.name, warn=True)]
    if progress and todo:  # what to expect, before the first cell starts
        print(_estimate_line(todo, done=len(cells) - len(todo)), file=sys.stderr, flush=True)
    draw = progress_bars(progress)
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(todo),
        desc="study",
        unit="cell",
        disable=not draw,
        position=0,
        dynamic_ncols=True,
    )
    t0, finished = time.perf_counter(), 0
    for cell in todo:
        started = time.perf_counter()
        bar.set_postfix_str(cell.name)
        interrupt.where(run=f"cell {cell.name}", phase="starting")
        try:
            study.run_cell(cell)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a failed cell must not stop the study ...
            failed[cell.name] = study.record_failure(cell, e)
        interrupt.where(run=None, phase="merging the results")
        finished += 1
        bar.update(1)
        eta = (time.perf_counter() - t0) / finished * (len(todo) - finished)
        bar.set_postfix_str(f"eta {eta / 60:.1f} min")
        if progress and not draw:  # a log file or pipe: one line per cell, not a bar
            done = len(cells) - len(todo) + finished
            outcome = "failed" if cell.name in failed else "done"
            print(
                f"cell {done}/{len(cells)} {cell.name} {outcome} in "
                f"{time.perf_counter() - started:.1f} s; eta {eta / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
        study.merge_results()
    bar.close()
    results = study.merge_results()
    report_path = None
    if report is not None:
        interrupt.where(phase="writing the report")
        errors, missing = study.unfinished(failed)
        try:  # written even if every cell failed: it states the failures
            report_path = report(study.workdir, failed=errors, missing=missing)
        except (DuplicateRowsError, MixedRowsError) as e:  # never averaged or pooled
            failed["report"] = f"{type(e).__name__}: {e}"
            tqdm.write(f"report not written: {e}")
    return {
        "done": [c.name for c in cells if study.is_done(c.name)],
        "failed": failed,
        "results": results,
        "report": report_path,
    }
