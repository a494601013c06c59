"""The README's commands, read out of README.md itself so that the two cannot drift apart.

Every command in a ``bash`` block is checked as written: its subcommand and flags exist, its
``--config=NAME:PRESET`` names a packaged config (or a file an earlier ``cp`` made) with that
preset, its ``--config.FIELD`` overrides name fields of that config, its pip extras exist and
its scripts are in the checkout. The short ones run, from a fresh directory: ``--help``, the
``tiny`` training run and its report, the ``python -c`` snippet and the Python usage block.
Long ones (a study, the test suite, an install) are only checked.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from flaxformer_lite.cli import COMMANDS, common

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMANDS_DIR = ROOT / "flaxformer_lite" / "cli"
HELP = {"help", "helpshort", "helpfull"}


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``."""
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def commands() -> list[list[str]]:
    """Every command of the README's bash blocks, as argv lists (``&&`` chains split, line
    continuations joined, comments dropped)."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#") or line.startswith("for ") or line == "done":
                continue
            for part in line.split("&&"):
                out.append(shlex.split(part))
    return out


def flaxformer_commands() -> list[list[str]]:
    """The ``flaxformer-lite`` commands, environment assignments and venv paths removed."""
    found = []
    for argv in commands():
        argv = [a for a in argv if not re.fullmatch(r"[A-Z_]+=\S*", a)]
        if argv and Path(argv[0]).name == "flaxformer-lite":
            found.append(argv[1:])
    return found


def defined_flags(subcommand: str) -> set[str]:
    source = (COMMANDS_DIR / f"{subcommand}.py").read_text(encoding="utf-8")
    return set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))


def config_file(spec: str, cwd: Path) -> tuple[Path, str]:
    """The file and preset of ``--config=NAME:PRESET`` or ``FILE.py:PRESET``."""
    name, _, preset = spec.partition(":")
    packaged = common.packaged_configs()
    if name in packaged:
        return packaged[name], preset
    for base in (cwd, ROOT):
        if (base / name).is_file():
            return base / name, preset
    raise AssertionError(f"README: --config={spec}: no packaged config or file {name!r}")


def check_flaxformer_command(args: list[str], cwd: Path) -> None:
    """Fail naming the README command when a subcommand, flag, config or preset is unknown."""
    shown = "flaxformer-lite " + shlex.join(args)
    if not args or args[0].lstrip("-") in HELP:
        return
    sub, rest = args[0], args[1:]
    assert sub in COMMANDS, f"README: {shown}: no subcommand {sub!r} (allowed: {list(COMMANDS)})"
    known = defined_flags(sub) | HELP
    flags = [a[2:].partition("=")[0] for a in rest if a.startswith("--")]
    spec = next((a.split("=", 1)[1] for a in rest if a.startswith("--config=")), None)
    for flag in flags:
        if flag.startswith("config."):
            continue
        bare = flag[2:] if flag.startswith("no") and flag[2:] in known else flag
        assert bare.replace("-", "_") in known, f"README: {shown}: {sub} has no flag --{flag}"
    if spec is None:
        return
    path, preset = config_file(spec, cwd)
    presets = common.config_presets(path)
    assert preset in presets, f"README: {shown}: preset {preset!r} not in {presets}"
    overrides = [a[2:] for a in rest if a.startswith("--config.")]
    if overrides:
        config = common._load_config([f"--config={path}:{preset}"])
        assert config is not None, f"README: {shown}: {path} does not load"
        for override in overrides:
            name = override.partition("=")[0]
            problem = common._check_path(config, name)
            assert problem is None, f"README: {shown}: --{name}: {problem}"


def test_readme_has_the_commands_this_test_runs():
    runnable = [a for a in flaxformer_commands() if a[:1] in (["--help"], ["train"], ["report"])]
    assert len(runnable) >= 3, "README: the --help, train and report commands are missing"
    assert blocks("python"), "README: the Python usage block is missing"


def test_every_readme_command_exists_as_written(tmp_path):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for argv in commands():
        if argv[:1] == ["cp"]:  # a copied config is what a later --config= names
            shutil.copy(ROOT / argv[1], tmp_path / argv[2])
        for extra in re.findall(r"\.\[(\w+)\]", " ".join(argv)):
            assert extra in extras, f"README: {shlex.join(argv)}: no extra {extra!r}"
        scripts = [a for a in argv if a.startswith(("scripts/", "benchmarks/"))]
        for script in scripts:
            assert (ROOT / script).is_file(), f"README: {shlex.join(argv)}: no {script}"
    for args in flaxformer_commands():
        check_flaxformer_command(args, tmp_path)


def _tool() -> list[str]:
    exe = Path(sys.executable).parent / "flaxformer-lite"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "flaxformer_lite"]


def _run(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README command failed: {shlex.join(argv)}\n{done.stderr[-3000:]}"
    return done.stdout


def test_short_readme_commands_run(tmp_path):
    """``--help``, the tiny training run and its report, in that order, in a fresh directory."""
    for args in flaxformer_commands():
        tiny = any(a.endswith(":tiny") for a in args) and args[0] == "train"
        if args[:1] == ["--help"] or tiny or args == ["report", "runs/tiny"]:
            out = _run([*_tool(), *args], tmp_path)
            if tiny:
                assert "bits/byte" in out
    assert (tmp_path / "runs" / "tiny" / "REPORT.md").is_file()


def test_readme_python_runs(tmp_path):
    """The ``python -c`` commands and every Python block, one after another in one fresh
    process (one JAX start-up), each in its own namespace."""
    snippets = [argv[2] for argv in commands() if argv[:2] == ["python", "-c"]]
    assert snippets, "README: the python -c command is missing"
    program = "\n".join(f"exec({code!r}, {{}})" for code in [*snippets, *blocks("python")])
    _run([sys.executable, "-c", program], tmp_path)
