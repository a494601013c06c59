"""The sweep runner: every cell of a study (encoding x seed) through `train_and_evaluate`.

A study directory looks like::

    STUDY/study.json          the base config, the sweep and the command (the study's identity)
    STUDY/runs/<cell>/        one `train_and_evaluate` workdir per cell
    STUDY/runs/<cell>/rows.jsonl   that cell's results rows (written atomically when it ends)
    STUDY/results.jsonl       all finished cells' rows, rebuilt atomically after every cell
    STUDY/REPORT.md, tables/, plots/   the report, rebuilt from results.jsonl

Resumable at every point: a finished cell (its ``rows.jsonl`` exists) is skipped, an
interrupted one resumes from its newest checkpoint, and ``results.jsonl`` is only ever
replaced whole, so a kill never leaves a torn or duplicated row. A failed cell is reported
and the study goes on; the runner then exits non-zero.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.experiments.report import write_study_report
from flaxformer_lite.experiments.results import BLOCKS_FILE, RESULTS_FILE
from flaxformer_lite.experiments.rows import blocks_for_cell, rows_for_cell
from flaxformer_lite.experiments.sweeps import (
    apply_overrides,
    check_overrides,
    expand_sweep,
    select_cells,
)
from flaxformer_lite.train import batches, sharding
from flaxformer_lite.train.loop import (
    check_workdir,
    check_writable_dir,
    prepare_process,
    train_and_evaluate,
)
from flaxformer_lite.train.run_config import RunConfig


class Study:
    """One study directory: its cells, their state, and the merged results."""

    def __init__(self, config: Any, sweep: list[dict], workdir: str | Path, command: str):
        self.config = config
        self.sweep = sweep
        self.workdir = Path(workdir)
        self.command = command

    def cell_dir(self, name: str) -> Path:
        return self.workdir / "runs" / name

    def is_done(self, name: str) -> bool:
        return (self.cell_dir(name) / "rows.jsonl").exists()

    def write_manifest(self) -> None:
        manifest = {
            "config": self.config.to_dict(),
            "sweep": self.sweep,
            "command": self.command,
        }
        # Each cell's workdir refuses a different config; the manifest records the latest call.
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(manifest, indent=1, default=str, sort_keys=True)
        atomic_write_text(self.workdir / "study.json", text)

    def merge_results(self) -> Path:
        """Rebuild ``results.jsonl`` and ``blocks.jsonl`` from every finished cell, in sweep
        order (atomic); returns the path of ``results.jsonl``."""
        for name in (BLOCKS_FILE, RESULTS_FILE):
            lines = []
            for cell in self.sweep:
                done = self.cell_dir(cell["name"]) / "rows.jsonl"
                path = self.cell_dir(cell["name"]) / (name if name == BLOCKS_FILE else "rows.jsonl")
                if done.exists() and path.exists():
                    lines.append(path.read_text())
            atomic_write_text(self.workdir / name, "".join(lines))
        return self.workdir / RESULTS_FILE

    def run_cell(self, cell: dict) -> None:
        config = apply_overrides(self.config, cell["overrides"])
        run = RunConfig.from_config(config)
        summary = train_and_evaluate(run, self.cell_dir(cell["name"]))
        blocks = blocks_for_cell(run, cell["name"], summary)
        text = "".join(json.dumps(b, sort_keys=True) + "\n" for b in blocks)
        atomic_write_text(self.cell_dir(cell["name"]) / BLOCKS_FILE, text)
        rows = rows_for_cell(run, cell["name"], summary, self.command)
        text = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        atomic_write_text(self.cell_dir(cell["name"]) / "rows.jsonl", text)  # last: done


def run_study(
    config: Any,
    workdir: str | Path,
    *,
    sweep: list[dict] | None = None,
    only: Sequence[str] = (),
    command: str = "",
    overrides: Sequence[tuple[str, Any]] = (),
    report: bool | Callable[[Path], Any] = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every selected cell (skipping finished ones), merge rows, write the report.

    Args:
      config: the study config (``ml_collections.ConfigDict`` from ``experiments/*.py``).
      workdir: the study directory.
      sweep: the cells; default `sweeps.expand_sweep` ``(config)``.
      only: run only the cells with these names, encodings or tasks.
      command: the command line, recorded in every row.
      overrides: the command line's ``--config.`` overrides ``[(name, value)]``; one of a
        field the sweep sets for every cell is refused.
      report: True writes REPORT.md, tables and plots (`report.write_study_report`); a
        callable is called with the study directory instead; False writes none.
      progress: show progress bars.

    Every selected cell's config, data and workdir are checked before anything is written
    (`ConfigError`: a bad value, a missing corpus, a batch the devices do not divide, an
    unwritable directory, a cell workdir that holds a run of a different config), so a bad
    call fails fast and writes nothing.
    Returns ``{"done": [...], "failed": {name: error}, "results": path, "report": path}``
    (``report``: REPORT.md, or None when none was written).
    """
    sweep = expand_sweep(config) if sweep is None else sweep
    check_overrides(sweep, overrides)
    cells = select_cells(sweep, only)
    study = Study(config, sweep, workdir, command)
    check_writable_dir(study.workdir, "workdir")
    runs = [RunConfig.from_config(apply_overrides(config, c["overrides"])) for c in cells]
    for i, (cell, run) in enumerate(zip(cells, runs, strict=True)):
        if i == 0:
            prepare_process(run)  # before JAX touches a device
        batches.open_run_data(run)  # corpus / task / length errors
        sharding.make_mesh(run.mesh, batch_size=run.data.batch_size)  # batch vs devices
        check_workdir(study.cell_dir(cell["name"]), run)
    study.write_manifest()
    failed: dict[str, str] = {}
    todo = [c for c in cells if not study.is_done(c["name"])]
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(todo),
        desc="study",
        unit="cell",
        disable=not progress,
        position=0,
        dynamic_ncols=True,
    )
    t0, finished = time.perf_counter(), 0
    for cell in todo:
        bar.set_postfix_str(cell["name"])
        try:
            study.run_cell(cell)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a failed cell must not stop the study
            failed[cell["name"]] = f"{type(e).__name__}: {e}"
            tqdm.write(f"cell {cell['name']} failed: {failed[cell['name']]}")
            (study.cell_dir(cell["name"]) / "error.txt").parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(study.cell_dir(cell["name"]) / "error.txt", traceback.format_exc())
        finished += 1
        bar.update(1)
        eta = (time.perf_counter() - t0) / finished * (len(todo) - finished)
        bar.set_postfix_str(f"eta {eta / 60:.1f} min")
        study.merge_results()
    bar.close()
    results = study.merge_results()
    report_path = None
    if report is True:
        evals = config.get("eval", {}) if hasattr(config, "get") else {}
        report_path = write_study_report(
            study.workdir,
            reference=evals.get("paired_reference", "alibi"),
            all_pairs=bool(evals.get("paired_all", False)),
        )
    elif report:
        report(study.workdir)
    return {
        "done": [c["name"] for c in cells if study.is_done(c["name"])],
        "failed": failed,
        "results": results,
        "report": report_path,
    }
