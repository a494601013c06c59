"""A study's own REPORT.md says what is not in its tables: every failed cell with its error
line, the selected cells without results (another shard's), and it is written even when
every cell failed.

No training: `Study.run_cell` is replaced by one that raises for the cells made to fail and
writes hand-made rows (every row the cell's evaluation plan expects) for the others.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import extrapolation_lm
from flaxformer_lite.experiments import runner
from flaxformer_lite.experiments.rows import expected_keys


@pytest.fixture
def cells(monkeypatch):
    """``failing``: cell name -> the exception its `Study.run_cell` raises; any other cell
    gets hand-made rows."""
    failing: dict[str, BaseException] = {}

    def run_cell(self, cell):
        if cell.name in failing:
            raise failing[cell.name]
        run = cell.run
        rows = [
            {
                "study": run.study,
                "preset": run.preset,
                "run": cell.name,
                "seed": run.seed,
                "encoding": encoding,
                "train_length": run.data.train_length,
                "eval_length": length,
                "protocol": protocol,
                "task": None,
                "metric": metric,
                "value": {"loss_by_position": [1.0] * 4, "perplexity": 1.5}.get(metric, 0.5),
            }
            for encoding, length, protocol, metric in expected_keys(run)
        ]
        path = self.cell_dir(cell.name) / "rows.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr(runner.Study, "run_cell", run_cell)
    return failing


def _study(workdir: Path, **kwargs):
    config = extrapolation_lm.get_config("tiny")
    return runner.run_study(
        config, workdir, only=("alibi", "rope"), progress=False, command="test", **kwargs
    )


def test_every_cell_failed_still_writes_a_report_naming_each_error(cells, tmp_path):
    cells["rope-seed0"] = FloatingPointError("training metric 'loss' is nan at step 3")
    cells["alibi-seed0"] = ValueError("a bug\nover two lines")
    outcome = _study(tmp_path / "study")
    assert sorted(outcome["failed"]) == ["alibi-seed0", "rope-seed0"]
    assert outcome["report"] == tmp_path / "study" / "REPORT.md"
    text = outcome["report"].read_text()
    assert text.startswith("# Results: extrapolation\\_lm (tiny)\n")
    assert "No results rows: no cell has finished" in text
    assert "## Failed cells" in text and "2 cell(s) failed" in text
    assert "- `rope-seed0`: `FloatingPointError: training metric 'loss' is nan at step 3`" in text
    assert "- `alibi-seed0`: `ValueError: a bug over two lines`" in text
    assert "## Results" not in text


def test_a_failed_cell_is_listed_beside_the_tables_of_the_others(cells, tmp_path):
    cells["rope-seed0"] = FloatingPointError("loss is nan")
    outcome = _study(tmp_path / "study")
    assert list(outcome["failed"]) == ["rope-seed0"] and outcome["done"] == ["alibi-seed0"]
    text = outcome["report"].read_text()
    assert "1 cell(s) failed" in text
    assert "- `rope-seed0`: `FloatingPointError: loss is nan`" in text
    assert "## Results" in text and (tmp_path / "study" / "tables").is_dir()

    error = (tmp_path / "study" / "runs" / "rope-seed0" / "error.txt").read_text()
    assert error.startswith("Traceback") and error.rstrip().endswith(
        "FloatingPointError: loss is nan"
    )

    # `flaxformer-lite report` of the study dir says so too, from the cell's error.txt
    proc = subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "report", "study", "--out=again"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: cell rope-seed0 failed: FloatingPointError: loss is nan" in proc.stderr
    text = (tmp_path / "again" / "REPORT.md").read_text()
    assert "- `rope-seed0`: `FloatingPointError: loss is nan`" in text
    assert "## Missing cells" not in text  # failed, not missing: said once


def test_a_shard_names_the_other_shards_cells_as_missing(cells, tmp_path):
    cells["rope-seed0"] = FloatingPointError("loss is nan")
    cells["alibi-seed0"] = FloatingPointError("loss is nan")
    outcome = _study(tmp_path / "study", shard=(0, 2))
    (ran,) = outcome["failed"]
    (other,) = {"alibi-seed0", "rope-seed0"} - {ran}
    text = outcome["report"].read_text()
    assert f"- `{ran}`: `FloatingPointError: loss is nan`" in text
    assert "## Missing cells" in text
    assert (
        f"1 cell(s) of study extrapolation\\_lm (preset tiny) have no results: {other} (this "
        "workdir runs shard 0/2: merge the shards' workdirs with flaxformer-lite report)"
    ) in text


def test_the_study_report_refuses_cells_whose_rows_do_not_compare(cells, tmp_path, monkeypatch):
    """Rows of one study that differ in what changes numbers (here: hand-edited steps) are
    not pooled by the study's own report either: the report is a failure naming the cells'
    rows.jsonl, and no REPORT.md is written."""
    run_cell = runner.Study.run_cell

    def edited(self, cell):
        run_cell(self, cell)
        path = self.cell_dir(cell.name) / "rows.jsonl"
        steps = 60 if cell.name == "alibi-seed0" else 20
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows = [r | {"setting": {"train.num_steps": steps}} for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr(runner.Study, "run_cell", edited)
    outcome = _study(tmp_path / "study")
    assert outcome["report"] is None and not (tmp_path / "study" / "REPORT.md").exists()
    runs = tmp_path / "study" / "runs"
    assert outcome["failed"]["report"] == (
        f"MixedRowsError: train.num_steps: 20 (rope-seed0, {runs}/rope-seed0/rows.jsonl) vs "
        f"60 (alibi-seed0, {runs}/alibi-seed0/rows.jsonl)"
    )
