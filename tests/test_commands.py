"""The ``flaxformer-lite`` command (issue 18): subcommands, configs by name, help, output.

In-process where nothing global is touched (the dispatcher's usage, the config resolution);
one subprocess for ``--help`` (absl flags are global to a process). The installed command from
a wheel is tested in test_wheel.py; bad flags of study/train in test_bad_input.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from experiments import extrapolation_lm, extrapolation_tasks
from flaxformer_lite.experiments import cli, commands
from flaxformer_lite.experiments.commands.train import result_lines

ROOT = Path(__file__).resolve().parent.parent


def test_the_dispatcher_lists_subcommands_and_refuses_unknown_ones(capsys):
    with pytest.raises(SystemExit) as e:
        commands.main(["flaxformer-lite"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    for name in ("study", "train", "report", "generate", "demo"):
        assert f"\n  {name} " in err
    with pytest.raises(SystemExit) as e:
        commands.main(["flaxformer-lite", "--help"])
    assert e.value.code == 0 and "SUBCOMMAND" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        commands.main(["flaxformer-lite", "studdy"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: unknown subcommand 'studdy'; allowed: study, train, report, generate, demo "
        "(flaxformer-lite --help)\n"
    )


def test_configs_resolve_by_name_to_the_experiments_files():
    configs = cli.packaged_configs()
    assert configs["extrapolation_lm"].resolve() == ROOT / "experiments" / "extrapolation_lm.py"
    assert set(configs) == {"extrapolation_lm", "extrapolation_tasks", "pretrained"}
    argv = cli.resolve_config(["prog", "--config=extrapolation_tasks:tiny", "--only=rope"])
    assert argv == ["prog", f"--config={configs['extrapolation_tasks']}:tiny", "--only=rope"]
    assert cli.resolve_config(["prog", "--config", "extrapolation_lm:cpu"])[2] == (
        f"{configs['extrapolation_lm']}:cpu"
    )
    by_path = ["prog", "--config=experiments/extrapolation_lm.py:tiny"]
    assert cli.resolve_config(by_path) == by_path
    assert cli.config_presets(configs["extrapolation_tasks"]) == list(extrapolation_tasks.PRESETS)


def test_an_unknown_config_name_is_one_line_naming_the_packaged_ones(capsys):
    with pytest.raises(SystemExit) as e:
        cli.resolve_config(["prog", "--config=extrapolation:quick"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: --config=extrapolation:quick: no packaged study config 'extrapolation'; allowed: "
        "['extrapolation_lm', 'extrapolation_tasks', 'pretrained'] "
        "(or a config file FILE.py:PRESET)\n"
    )


def test_help_exits_0_keeps_the_usage_lines_and_lists_every_preset():
    proc = subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the backslash continuation of the usage example is printed as written
    assert "--workdir=runs/tiny \\\n        --config.model.positional=rope" in proc.stdout
    flat = " ".join(proc.stdout.split())
    assert f"extrapolation_lm: {', '.join(extrapolation_lm.PRESETS)};" in flat
    assert f"extrapolation_tasks: {', '.join(extrapolation_tasks.PRESETS)}" in flat


def test_train_prints_one_aligned_line_per_length_with_rounded_values():
    summary = {
        "eval": [
            {"encoding": "rope", "protocol": "nonoverlapping", "eval_length": 64,
             "bits_per_byte": 1.964213456},
            {"encoding": "learned", "protocol": "nonoverlapping", "eval_length": 128,
             "bits_per_byte": None, "na": "no embedding past 64"},
            {"encoding": "alibi", "protocol": "task", "eval_length": 32, "exact_match": 0.375},
        ]
    }  # fmt: skip
    assert result_lines(summary) == [
        "rope                     nonoverlapping  length     64  1.9642 bits/byte",
        "learned                  nonoverlapping  length    128  n/a (no embedding past 64)",
        "alibi                    task            length     32  37.5 % exact match",
    ]
