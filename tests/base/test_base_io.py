"""A failed atomic write (`base.io.atomic_write_text`): a full disk (ENOSPC) or a failing
one (EIO) raises `StateWriteError` naming the file and what to do, keeps the old content and
leaves no temporary file."""

from __future__ import annotations

import errno
import os

import pytest

from flaxformer_lite.base.io import StateWriteError, atomic_write_text


@pytest.mark.parametrize(
    ("patched", "code"), [("fsync", errno.ENOSPC), ("replace", errno.EIO)], ids=["enospc", "eio"]
)
def test_a_failed_atomic_write_names_the_file_and_leaves_no_temporary(
    tmp_path, monkeypatch, patched, code
):
    target = tmp_path / "rows.jsonl"
    target.write_text("old\n")

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, patched, fail)
    with pytest.raises(StateWriteError) as raised:
        atomic_write_text(target, "new\n")
    monkeypatch.undo()
    assert str(raised.value) == f"cannot write {target}: [Errno {code}] {os.strerror(code)}"
    assert raised.value.errno == code
    hint = "free space" if code == errno.ENOSPC else "fix the cause"
    assert raised.value.hint == f"{hint} and rerun the same command to resume"
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]
