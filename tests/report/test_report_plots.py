"""Plots are written atomically, like tables: a failure while rendering or writing a figure
(a full disk) leaves the previous file or none -- never a 0-byte or half-written PNG -- and
no temporary file, and the error names the figure."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from flaxformer_lite import report
from flaxformer_lite.base import faults
from flaxformer_lite.base.io import StateWriteError
from flaxformer_lite.report import plots

SERIES = {"rope": [(64, 2.0, 0.1), (128, 2.5, None)], "alibi": [(64, 2.1, None), (128, 2.2, None)]}


def _plot(stem: Path) -> list[Path]:
    return plots.plot_vs_length(SERIES, stem, train_length=64, ylabel="bits/byte", title="t")


def _files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def test_a_failure_during_savefig_leaves_no_png(tmp_path, monkeypatch):
    def savefig(self, target, **kwargs):
        target.write(b"\x89PNG half")  # what a renderer had written when the disk filled
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", savefig)
    stem = tmp_path / "plots" / "bits_vs_length"
    with pytest.raises(StateWriteError) as raised:
        _plot(stem)
    assert str(raised.value) == f"cannot write {stem}.png: [Errno 28] No space left on device"
    assert _files(tmp_path / "plots") == {}  # no 0-byte PNG, no temporary file


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_a_full_disk_while_writing_keeps_the_previous_figure(tmp_path, monkeypatch, suffix):
    stem = tmp_path / "plots" / "bits_vs_length"
    _plot(stem)
    before = {p: p.read_bytes() for p in (stem.with_suffix(".png"), stem.with_suffix(".pdf"))}
    assert all(before.values())
    monkeypatch.setattr(faults, "_counts", {})
    monkeypatch.setenv(faults.ENV, f"write:bits_vs_length{suffix}:1:ENOSPC")
    with pytest.raises(StateWriteError, match=f"cannot write {stem}{suffix}: .Errno 28."):
        _plot(stem)
    assert {p: p.read_bytes() for p in before} == before  # the previous files, whole
    assert sorted(_files(tmp_path / "plots")) == ["bits_vs_length.pdf", "bits_vs_length.png"]


def test_a_report_whose_plot_fails_leaves_no_empty_png(tmp_path, monkeypatch):
    rows = [
        {
            "study": "s",
            "run": f"{e}-seed0",
            "seed": 0,
            "encoding": e,
            "train_length": 64,
            "eval_length": n,
            "protocol": "nonoverlapping",
            "metric": "bits_per_byte",
            "value": v,
        }
        for e in ("rope", "alibi")
        for n, v in ((64, 2.0), (128, 2.5))
    ]
    monkeypatch.setattr(faults, "_counts", {})
    monkeypatch.setenv(faults.ENV, "write:bits_per_byte_nonoverlapping_vs_length.png:1:ENOSPC")
    with pytest.raises(StateWriteError, match=r"bits_per_byte_nonoverlapping_vs_length\.png"):
        report.write_report(rows, tmp_path / "out")
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written and all(p.stat().st_size > 0 for p in written)
    assert not [p for p in written if p.suffix == ".png" or ".tmp" in p.name]
