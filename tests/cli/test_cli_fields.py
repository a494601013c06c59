"""``--list-fields`` and ``--version``: every ``--config.*`` field with its type, value and
meaning, and the package's version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import env

import flaxformer_lite
from configs import extrapolation_lm, extrapolation_tasks, pretrained
from flaxformer_lite import cli
from flaxformer_lite.cli import common

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"config\.[\w.]+ \([^)]+\) = .+  # \S.*")


def test_list_fields_names_nested_fields_with_the_overridden_value_and_needs_no_workdir():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flaxformer_lite",
            "study",
            "--config=extrapolation_lm:quick",
            "--config.model.positional_options.rope.base=500000.0",
            "--list-fields",
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert (
        "config.model.positional_options.rope.base (float) = 500000.0  # frequency base; "
        "theta_i = base^(-2i/d) [rope_theta]"
    ) in lines
    assert "config.train.num_steps (int) = 1000  # optimizer steps" in lines  # quick's value
    assert (
        "config.sweep.seeds (tuple) = (0,)  # one cell per seed (initialisation and data order)"
        in lines
    )
    assert lines == common.config_fields(_overridden())


def _overridden():
    config = extrapolation_lm.get_config("quick")
    config.model.positional_options.rope.base = 500000.0
    return config


@pytest.mark.parametrize(
    ("module", "preset"),
    [(extrapolation_lm, "quick"), (extrapolation_tasks, "quick"), (pretrained, "small")],
)
def test_every_field_of_every_config_is_listed_with_a_meaning(module, preset):
    config = module.get_config(preset)
    lines = common.config_fields(config)
    bad = [line for line in lines if not LINE.fullmatch(line)]
    assert bad == []
    listed = {line.split(" ", 1)[0] for line in lines}
    assert "config.eval.max_bytes" in listed and "config.data.train_length" in listed
    # every listed field is one an override can set
    assert all(common._check_path(config, name) is None for name in listed)


def test_a_command_without_a_config_refuses_list_fields_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        common.parse_flags(["flaxformer-lite report", "--list-fields"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: --list-fields: name a config")


def test_version_prints_the_package_version(capsys):
    for argv in (["flaxformer-lite", "--version"], ["flaxformer-lite study", "--version"]):
        with pytest.raises(SystemExit) as e:
            if len(argv[0].split()) == 1:
                cli.main(argv)
            else:
                common.parse_flags(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"flaxformer-lite {flaxformer_lite.__version__} (python ")
