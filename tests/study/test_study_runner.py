"""The study runner (`study.runner`): what a study does with failed, damaged and unfinished
cells.

A study's own REPORT.md says what is not in its tables: every failed cell with its error
line, the selected cells without results (another shard's), and it is written even when
every cell failed. A storage error (full disk, quota, read-only file system) stops the study
at once, also while writing a cell's error.txt; any other failure of a cell does not. For
these, `Study.run_cell` is replaced by one that raises or writes hand-made rows (every row the
cell's evaluation plan expects); nothing is trained.

Damaged state is unfinished state: a study recomputes a cell whose ``rows.jsonl`` or
``eval.json`` is empty, cut short or unparsable (with a warning naming the file), leaves a
damaged cell outside ``--only`` out with a warning, and refuses to average two rows of one
measurement. One tiny study (two cells, 4 steps) is trained once; every test damages a copy of
it and reruns the study in-process."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from subprocess_checks import temporary_files

from configs import extrapolation_lm
from flaxformer_lite.base import faults
from flaxformer_lite.base.io import StateWriteError
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.results import store
from flaxformer_lite.results.rows import expected_keys
from flaxformer_lite.study import runner


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
    return run_study(
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


ROPE = Path("runs") / "rope-seed0"


@pytest.fixture
def fake_cells(monkeypatch):
    """The tiny study's rope and alibi cells, whose `Study.run_cell` raises what the test
    sets in ``raises`` instead of training; ``calls`` lists the cells started."""
    calls: list[str] = []
    raises: list[BaseException] = []

    def run_cell(self, cell):
        calls.append(cell.name)
        raise raises[0]

    monkeypatch.setattr(runner.Study, "run_cell", run_cell)
    monkeypatch.setattr(faults, "_counts", {})
    return calls, raises


def _run_tiny_study(workdir: Path):
    config = extrapolation_lm.get_config("tiny")
    return run_study(
        config, workdir, only=("alibi", "rope"), report=False, progress=False, command="test"
    )


def test_a_full_disk_while_writing_error_txt_stops_the_study(fake_cells, tmp_path, monkeypatch):
    """A cell fails (its math), then writing its error.txt hits ENOSPC: one error naming
    error.txt, not a traceback from the error handler, and the next cell is not started."""
    calls, raises = fake_cells
    raises.append(FloatingPointError("loss is nan"))
    monkeypatch.setenv(faults.ENV, "write:error.txt:1:ENOSPC")
    with pytest.raises(StateWriteError) as raised:
        _run_tiny_study(tmp_path / "study")
    error = tmp_path / "study" / ROPE / "error.txt"
    assert str(raised.value) == f"cannot write {error}: [Errno 28] No space left on device"
    assert calls == ["rope-seed0"]
    assert not error.exists() and temporary_files(tmp_path) == []


@pytest.mark.parametrize(
    ("error", "stops"),
    [
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/q/metrics.jsonl"), True),
        (OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/eval.json"), True),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), False),
        (ValueError("a bug in one cell"), False),
    ],
    ids=["quota", "read-only", "enoent", "bug"],
)
def test_storage_errors_stop_the_study_other_failures_do_not(fake_cells, tmp_path, error, stops):
    calls, raises = fake_cells
    raises.append(error)
    if stops:
        with pytest.raises(StateWriteError, match=re.escape(f"cannot write {error.filename}: ")):
            _run_tiny_study(tmp_path / "study")
        assert calls == ["rope-seed0"]
    else:
        outcome = _run_tiny_study(tmp_path / "study")
        assert calls == ["rope-seed0", "alibi-seed0"]
        assert sorted(outcome["failed"]) == ["alibi-seed0", "rope-seed0"]
        assert (tmp_path / "study" / ROPE / "error.txt").exists()


CELLS = ("rope-seed0", "alibi-seed0")


def config():
    c = extrapolation_lm.get_config("tiny")
    c.sweep.encodings = ("rope", "alibi")
    c.train.update(num_steps=4, checkpoint_every=4)
    c.eval.update(length_multiples=(1, 2), max_bytes=256)
    return c


def run(workdir: Path) -> tuple[dict, list[str]]:
    """The study rerun in ``workdir``: its outcome and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_study(config(), workdir, progress=False, command=command(workdir))
    return outcome, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def command(workdir: Path) -> str:
    """The command line `config` stands for, as the study command records it."""
    return (
        f"flaxformer-lite study --config=extrapolation_lm:tiny --workdir={workdir} "
        "--config.sweep.encodings=\"('rope', 'alibi')\" --config.train.num_steps=4 "
        "--config.train.checkpoint_every=4 --config.eval.length_multiples=(1,2) "
        "--config.eval.max_bytes=256"
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished study (read-only: tests copy it)."""
    workdir = tmp_path_factory.mktemp("damaged") / "study"
    outcome, _ = run(workdir)
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    return workdir


@pytest.fixture
def study(finished, tmp_path) -> Path:
    copy = tmp_path / "study"
    shutil.copytree(finished, copy)
    return copy


def test_the_report_says_what_ran_and_names_no_path_of_the_machine(finished):
    """REPORT.md's title names the preset and the steps, its Setup every command-line
    override of the preset; no absolute path of this machine is in it (the workdir, the
    corpus cache, the interpreter's folders, the home directory)."""
    text = (finished / "REPORT.md").read_text(encoding="utf-8")
    assert text.startswith("# Results: extrapolation\\_lm (tiny), 4 training steps\n")
    overrides = (
        "| Overrides of the preset | `sweep.encodings=('rope', 'alibi')`, `train.num_steps=4`, "
        "`train.checkpoint_every=4`, `eval.length_multiples=(1,2)`, `eval.max_bytes=256` |"
    )
    assert overrides in text
    assert "| Training steps | 4 |" in text
    assert "--workdir=. " in text  # the recorded command, relative to the report
    for place in (finished, finished.parent, Path.home(), sys.prefix, sys.base_prefix):
        assert str(place) not in text, place
    assert "/home/" not in text and "/usr/" not in text and "/root/" not in text


def measurements(workdir: Path) -> dict:
    """``{(run, encoding, length, metric, bucket): value}`` of results.jsonl (no problems)."""
    rows, problems = store.read_rows_file(workdir / "results.jsonl")
    assert problems == []
    return {
        (r["run"], r["encoding"], r["eval_length"], r["metric"], r.get("bucket")): r["value"]
        for r in rows
    }


def snapshot(cell: Path) -> dict[str, bytes]:
    """The training state of a cell: its checkpoints and metrics (unchanged by a recompute
    from the final checkpoint)."""
    files = [cell / "metrics.jsonl", *(cell / "checkpoints").rglob("*")]
    return {str(p.relative_to(cell)): p.read_bytes() for p in files if p.is_file()}


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("empty", "is empty"),
        ("cut", "misses 1 expected row(s)"),  # its last line (a loss_by_position row) gone
        ("torn", "line 3 is not a valid row (not valid JSON"),
        ("garbage", "line 1 is not a valid row (not valid JSON"),
        ("other_run", "line 1 is a row of run 'alibi-seed0'"),
    ],
)
def test_a_damaged_rows_file_is_an_unfinished_cell_recomputed_from_its_checkpoint(
    finished, study, damage, problem
):
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    lines = rows_file.read_text().splitlines(keepends=True)
    if damage == "empty":
        rows_file.write_text("")
    elif damage == "cut":
        rows_file.write_text("".join(lines[:-1]))
    elif damage == "torn":
        rows_file.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2] + "\n")
    elif damage == "garbage":
        rows_file.write_bytes(b"\x00\xff not json\n")
    else:
        rows_file.write_text((study / "runs" / "alibi-seed0" / "rows.jsonl").read_text())
    before = snapshot(rows_file.parent)

    outcome, messages = run(study)

    assert any(str(rows_file) in m and problem in m for m in messages), messages
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    assert measurements(study) == measurements(finished)  # rope is back in the results
    assert snapshot(rows_file.parent) == before  # recomputed from the final checkpoint
    for table in (study / "tables").glob("bits_per_byte*.md"):
        text = table.read_text()
        assert "| rope |" in text and "| alibi |" in text


def test_a_damaged_cell_outside_only_is_left_out_with_a_warning(study):
    """Not selected (--only): not recomputed, but never merged silently as finished."""
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    rows_file.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_study(config(), study, only=["alibi"], progress=False)
    assert outcome["done"] == ["alibi-seed0"]
    assert any(str(rows_file) in str(w.message) for w in caught)
    assert {k[0] for k in measurements(study)} == {"alibi-seed0"}


@pytest.mark.parametrize("garbage", [b"{not json", b"", b"[1, 2]", b'{"config_hash": 1}'])
def test_a_garbage_eval_cache_is_evaluated_again(finished, study, garbage):
    cell = study / "runs" / "rope-seed0"
    (cell / "rows.jsonl").unlink()
    (cell / "eval.json").write_bytes(garbage)
    before = snapshot(cell)

    outcome, messages = run(study)

    eval_file = str(cell / "eval.json")
    assert any(eval_file in m and "evaluating again" in m for m in messages), messages
    assert outcome["failed"] == {} and outcome["done"] == list(CELLS)
    assert json.loads((cell / "eval.json").read_text())["eval"]  # rewritten whole
    assert measurements(study) == measurements(finished)
    assert snapshot(cell) == before  # no training: the final checkpoint was valid


def test_a_duplicated_row_of_one_seed_is_an_error_not_an_interval(study):
    rows_file = study / "runs" / "rope-seed0" / "rows.jsonl"
    first = json.loads(rows_file.read_text().splitlines()[0])
    with rows_file.open("a") as f:  # the same measurement again, another value
        f.write(json.dumps(dict(first, value=first["value"] + 5.0), sort_keys=True) + "\n")
    report_before = (study / "REPORT.md").read_bytes()

    outcome, _ = run(study)

    error = outcome["failed"]["report"]
    assert error.startswith("DuplicateRowsError: duplicate results rows for")
    assert f"run='rope-seed0' seed=0 encoding={first['encoding']!r}" in error
    assert f"metric={first['metric']!r}" in error
    assert f"{study / 'results.jsonl'}:1 and" in error and str(rows_file) in error
    assert (study / "REPORT.md").read_bytes() == report_before  # no averaged table written


def test_off_a_terminal_a_study_prints_one_line_per_cell_and_no_bar(cells, tmp_path, capsys):
    """stderr captured by pytest is no terminal: no tqdm bar (no carriage return, no ``it/s``),
    one line per finished cell instead; ``progress=False`` prints neither."""
    cells["rope-seed0"] = FloatingPointError("loss is nan")
    config = extrapolation_lm.get_config("tiny")
    run_study(config, tmp_path / "a", only=("alibi", "rope"), progress=True, command="test")
    err = capsys.readouterr().err
    assert "\r" not in err and "it/s" not in err and "cell/s" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("cell ")]
    assert [line.split(" in ")[0] for line in lines] == [
        "cell 1/2 rope-seed0 failed",
        "cell 2/2 alibi-seed0 done",
    ]
    assert all(re.fullmatch(r".* in \d+\.\d s; eta \d+\.\d min", line) for line in lines), lines
    # before the first cell: what to expect (train.cost), the estimate and what it rests on
    (first,) = [line for line in err.splitlines() if line.startswith("study: ")]
    assert re.fullmatch(
        r"study: 2 cell\(s\) to run \(0 done\), ≈ \d+ s \(\d\.\de\+\d+ FLOP at \d+% of this "
        r"machine's \d+ GFLOP/s matmul rate, \d+ compiles\)",
        first,
    ), first
    run_study(config, tmp_path / "b", only=("alibi", "rope"), progress=False, command="test")
    err = capsys.readouterr().err
    assert "cell " not in err and "study: " not in err
