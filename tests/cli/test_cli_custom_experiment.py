"""docs/experiments.md, followed literally: its files written, its commands run in order.

The page's ``# file: NAME`` code blocks are written to an empty folder, its other ``python``
blocks run there as scripts and its ``bash`` blocks run there as written (the test's
interpreter first on PATH, as an activated virtual environment would be), so a command or a
name on the page that no longer works fails here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "experiments.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_MARK = "# file: "


def blocks(kind: str | None = None) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced code block of the page, in order."""
    found = BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    return [(lang, text) for lang, text in found if kind is None or lang == kind]


def test_the_page_has_what_the_test_runs():
    langs = [lang for lang, _ in blocks()]
    assert langs.count("bash") >= 3, langs
    files = [t for lang, t in blocks("python") if t.startswith(FILE_MARK)]
    assert [f.splitlines()[0] for f in files] == ["# file: my_encoding.py"]
    for _, text in blocks("python"):
        ast.parse(text)  # every Python block is valid Python
    page = PAGE.read_text(encoding="utf-8")
    # the names the code uses, not paraphrases of them
    for name in ("factory(dims, options, *, rngs)", "`hook`", "EncodingSpec", "--import", "--only"):
        assert name in page, name
    assert "builder" not in page


def test_the_page_runs_as_written(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("PYTHONPATH", None)
    outputs = []
    for lang, text in blocks():
        if lang == "python" and text.startswith(FILE_MARK):
            name = text.splitlines()[0].removeprefix(FILE_MARK).strip()
            (tmp_path / name).write_text(text, encoding="utf-8")
            continue
        if lang == "python":
            command = [sys.executable, "-c", text]
        elif lang == "bash":
            command = ["bash", "-euo", "pipefail", "-c", text]
        else:
            continue
        proc = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"{text}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        outputs.append(proc.stdout)

    assert (tmp_path / "my_study.py").is_file()  # the copied config
    assert "(1, 8, 256)" in outputs[1]  # the Python block's printed shape (after the copy)
    study = tmp_path / "runs" / "mine"
    assert [p.name for p in (study / "runs").iterdir()] == ["log_distance-seed0"]  # --only
    report = (study / "REPORT.md").read_text(encoding="utf-8")
    assert "log\\_distance" in report and "my\\_study" in report
    assert "flaxformer-lite report" in report
    # provenance: the options and where the factory is defined, as the page shows
    shown = ast.literal_eval(outputs[-1].strip())
    assert shown["name"] == "log_distance" and shown["options"] == {"scale": 0.5}
    assert shown["factory"] == "my_encoding.LogDistanceBias" and shown["builtin"] is False
    assert Path(shown["file"]) == (tmp_path / "my_encoding.py").resolve()


def test_import_flag_loads_a_module_or_a_file_and_refuses_a_missing_one(tmp_path, capsys):
    from flaxformer_lite.cli import common

    (tmp_path / "planted_by_the_test.py").write_text("LOADED = True\n", encoding="utf-8")
    path = str(tmp_path / "planted_by_the_test.py")
    assert common.import_modules(["prog", f"--import={path}", "--config=x"]) == [
        "planted_by_the_test"
    ]
    assert sys.modules["planted_by_the_test"].LOADED
    with pytest.raises(SystemExit) as e:
        common.import_modules(["prog", "--import", "no_such_module_anywhere"])
    assert e.value.code == common.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: --import=no_such_module_anywhere: ") and err.count("\n") == 1
