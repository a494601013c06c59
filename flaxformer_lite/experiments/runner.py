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

import copy
import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections
from tqdm.auto import tqdm

from flaxformer_lite.base.io import atomic_write_text
from flaxformer_lite.nn.encodings import encoding_row_name, get_positional_encoding
from flaxformer_lite.train import allocator, batches, provenance, sharding
from flaxformer_lite.train.loop import check_workdir, check_writable_dir, train_and_evaluate
from flaxformer_lite.train.run_config import ConfigError, RunConfig

SCALAR_METRICS = ("bits_per_byte", "loss", "perplexity", "accuracy")


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]):
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


def cell_label(run: RunConfig) -> str:
    """The encoding's row label: registry name (+RoPE scaling) (+``randomized``)."""
    label = encoding_row_name(run.model)
    if run.model.randomized_positions:
        label += "+randomized"
    return label


def rows_for_cell(
    run: RunConfig, name: str, summary: dict[str, Any], command: str
) -> list[dict[str, Any]]:
    """Results rows (DESIGN.md §7) of one finished cell: one per length x metric."""
    env = summary["provenance"]
    base_label = cell_label(run)
    common = {
        "study": run.study,
        "preset": run.preset,
        "run": name,
        "seed": run.seed,
        "train_length": run.data.train_length,
        "task": run.data.task or None,
        "config_hash": summary["config_hash"],
        "git_commit": env["git_commit"],
        "packages": env["packages"],
        "python": env["python"],
        "backend": env["backend"],
        "device_kind": env["device_kind"],
        "device_count": env["device_count"],
        "data": env["data"],
        "train_seconds": round(summary["train_seconds"], 3),
        "eval_seconds": round(summary["eval_seconds"], 3),
        "command": command,
        "timestamp": summary.get("finished_at"),
    }
    rows = []
    for r in summary["eval"]:
        variant_cfg = run.model
        label = base_label
        if r["variant"] != "base":
            variant_cfg = run.model.replace(rope_scaling=r["variant"])
            label = encoding_row_name(variant_cfg) + base_label[len(run.model.positional) :]
        head = common | {
            "encoding": label,
            "variant": get_positional_encoding(run.model.positional).variant(variant_cfg)
            | {"randomized_positions": run.model.randomized_positions}
            | ({"max_position": run.model.max_position} if run.model.randomized_positions else {}),
            "eval_length": r["eval_length"],
            "eval_multiple": r["eval_length"] // run.data.train_length,
            "protocol": r["protocol"],
            "stride": r.get("stride"),
            "tokens": r.get("tokens"),
            "examples": r.get("examples"),
        }
        metrics = ["exact_match", "accuracy"] if r["protocol"] == "task" else SCALAR_METRICS
        rows += [head | {"metric": m, "value": r[m]} for m in metrics]
        for bucket, value in r.get("bucket_loss", {}).items():
            rows.append(head | {"metric": "bucket_loss", "bucket": bucket, "value": value})
        if "loss_by_position" in r:
            rows.append(head | {"metric": "loss_by_position", "value": r["loss_by_position"]})
    return rows


class Study:
    """One study directory: its cells, their state, and the merged results."""

    def __init__(self, config: ml_collections.ConfigDict, sweep: list[dict], workdir, command):
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
        """Rebuild ``results.jsonl`` from every finished cell, in sweep order (atomic)."""
        lines = []
        for cell in self.sweep:
            path = self.cell_dir(cell["name"]) / "rows.jsonl"
            if path.exists():
                lines.append(path.read_text())
        out = self.workdir / "results.jsonl"
        atomic_write_text(out, "".join(lines))
        return out

    def run_cell(self, cell: dict) -> None:
        config = apply_overrides(self.config, cell["overrides"])
        run = RunConfig.from_config(config)
        summary = train_and_evaluate(run, self.cell_dir(cell["name"]))
        rows = rows_for_cell(run, cell["name"], summary, self.command)
        text = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        atomic_write_text(self.cell_dir(cell["name"]) / "rows.jsonl", text)


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


def run_study(
    config: ml_collections.ConfigDict,
    sweep: list[dict],
    workdir: str | Path,
    *,
    only: Sequence[str] = (),
    command: str = "",
    report: Callable[[Path], Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every selected cell (skipping finished ones), merge rows, write the report.

    Every selected cell's config, data and workdir are checked before anything is written
    (`ConfigError`: a bad value, a missing corpus, a batch the devices do not divide, an
    unwritable directory, a cell workdir that holds a run of a different config), so a bad
    call fails fast and writes nothing.
    Returns ``{"done": [...], "failed": {name: error}, "results": path}``.
    """
    cells = select_cells(sweep, only)
    study = Study(config, sweep, workdir, command)
    check_writable_dir(study.workdir, "workdir")
    allocator.configure_host_allocator()  # CPU: keep freed memory (before JAX's CPU client)
    provenance.git_commit()  # read (and cache) the commit now: the code that runs is this one
    for cell in cells:
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        batches.build(run)  # corpus / task / length errors
        sharding.initialize_distributed(run.mesh)  # (multi-host only) before devices are used
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
    if report is not None:
        report(study.workdir)
    return {
        "done": [c["name"] for c in cells if study.is_done(c["name"])],
        "failed": failed,
        "results": results,
    }
