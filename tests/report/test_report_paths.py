"""`report.paths.portable_text`: each absolute path of the machine becomes relative to the
report or is named by its place; text that only looks like a path is left alone."""

from __future__ import annotations

import sys
from pathlib import Path

from flaxformer_lite.report.paths import portable, portable_text

ROOT = Path(__file__).resolve().parents[2]


def test_paths_become_relative_or_named(tmp_path):
    base = tmp_path / "study"
    assert portable_text(f"--workdir={base} --x", base) == "--workdir=. --x"
    assert (
        portable_text(f"{base}/runs/rope-seed0/rows.jsonl.", base) == "runs/rope-seed0/rows.jsonl."
    )
    # elsewhere: the last part only, whatever this machine's folders are
    assert portable_text(f"{sys.base_prefix}/lib/python3.11", base) == ".../python3.11"
    assert portable_text(str(ROOT / "tests" / "m"), None) == ".../m"
    assert portable_text("/opt/models/gpt2, and", None) == ".../gpt2, and"
    assert portable({"a": [f"{base}/x", 1]}, base) == {"a": ["x", 1]}


def test_what_only_looks_like_a_path_is_kept():
    text = "bits/byte, 1/(F-1), a / b, https://x.org/a/b, [CSV](tables/x.csv), ~/y"
    assert portable_text(text, "/tmp") == text
