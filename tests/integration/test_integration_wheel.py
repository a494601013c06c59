"""The package as a pip user gets it: a wheel, installed into a fresh environment,
runs a study by config name from another directory with the ``flaxformer-lite`` command.

The wheel is built offline from this checkout (no build isolation: the test extra installs
setuptools and wheel) and installed with ``--no-deps`` into a fresh venv whose only other
entry on ``sys.path`` is this environment's site-packages, for the dependencies: the package
itself comes from the wheel (checked), not from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flaxformer_lite"


def test_the_package_list_names_every_package_folder():
    """pyproject.toml lists the packages (the configs are mapped from configs/): a new
    folder missing from the list would be missing from the wheel."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert set(setup["packages"]) == folders | {"flaxformer_lite.configs"}
    assert setup["package-dir"] == {"flaxformer_lite.configs": "configs"}
    assert (ROOT / "configs" / "__init__.py").is_file()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel of this checkout installed: its ``bin`` directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # Build from a copy of the source: an in-tree build would write build/ and *.egg-info into
    # the checkout, and a stale build/ could put removed modules into the wheel.
    source = tmp / "source"
    skip = (".*", "runs", "build", "dist", "*.egg-info", "__pycache__", "notebooks", "docs")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*skip))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, source],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = dist.glob("flaxformer_lite-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in (
        "flaxformer_lite/configs/extrapolation_lm.py",
        "flaxformer_lite/configs/extrapolation_tasks.py",
        "flaxformer_lite/cli/study.py",
        "flaxformer_lite/__main__.py",
    ):
        assert name in names, f"{name} is not in the wheel"
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "configs/"))]

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies, from this environment (a plain path entry: its .pth files, among
    # them the editable install of this checkout, are not processed).
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    return venv / "bin"


def _env() -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "FLAXFORMER_LITE_FAULT")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"JAX_PLATFORMS": "cpu"}


def test_the_installed_command_runs_a_study_by_config_name_from_another_directory(
    installed, tmp_path
):
    where = subprocess.run(
        [installed / "python", "-c", "import flaxformer_lite as f; print(f.__file__)"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(installed.parent)), f"imported from {where}, not the wheel"

    cmd = [
        installed / "flaxformer-lite",
        "study",
        "--config=extrapolation_lm:tiny",
        "--workdir=study",
        "--only=rope",
        "--config.train.num_steps=4",
        "--config.train.checkpoint_every=4",
        "--config.eval.length_multiples=(1,2)",
        "--config.eval.max_bytes=256",
        "--progress=false",
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "study" / "REPORT.md").is_file()
    rows = [json.loads(x) for x in (tmp_path / "study" / "results.jsonl").read_text().splitlines()]
    assert {r["run"] for r in rows} == {"rope-seed0"}
    assert {r["eval_multiple"] for r in rows} == {1, 2}
    assert rows[0]["command"].startswith("flaxformer-lite study --config=extrapolation_lm:tiny")
    assert rows[0]["git_commit"] == "unknown"  # no checkout: the config came from the wheel

    # the same command as `python -m flaxformer_lite`, and its help lists the presets
    help_ = subprocess.run(
        [installed / "python", "-m", "flaxformer_lite", "study", "--help"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert help_.returncode == 0, help_.stderr[-2000:]
    assert "extrapolation_lm: tiny, dev, quick, cpu" in " ".join(help_.stdout.split())


def test_the_notebook_takes_its_config_from_an_uploaded_wheel(installed, tmp_path):
    """The notebook's install, backend and study cells run where there is no checkout and no
    repository URL, only the uploaded wheel: the study config comes from the wheel."""
    (wheel,) = (installed.parent.parent / "dist").glob("flaxformer_lite-*.whl")
    shutil.copy(wheel, tmp_path / wheel.name)
    cells = json.loads((ROOT / "notebooks" / "extrapolation.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    script = "\n".join("".join(c["source"]) for c in code[:3])  # install, backend, the study
    proc = subprocess.run(
        [installed / "python", "-c", script],
        cwd=tmp_path,
        env=_env() | {"FLAXFORMER_LITE_NOTEBOOK_PRESET": "tiny"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"flaxformer_lite installed from: {tmp_path / wheel.name}" in proc.stdout
    assert "preset 'tiny': " in proc.stdout
