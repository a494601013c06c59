"""The pretrained-model study end to end: `pretrained:tiny` (the committed tiny Hugging Face
models) through the study runner, rows, tables and the report, with nothing trained."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from configs import pretrained
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.pretrained import families, load
from flaxformer_lite.study import runner
from flaxformer_lite.study.sweeps import expand_sweep, select_cells
from flaxformer_lite.train import loop

ROOT = Path(__file__).resolve().parents[2]


def test_the_tiny_preset_runs_end_to_end(tmp_path):
    config = pretrained.get_config("tiny")
    config.eval.update(length_multiples=(1, 2), max_bytes=512, protocols=("nonoverlapping",))
    config.eval.rope_scalings = ("yarn",)
    sweep = select_cells(expand_sweep(config), ["gpt2", "llama", "bloom"])
    typed = f"flaxformer-lite study --config=pretrained:tiny --workdir={tmp_path} --only=gpt2"
    out = run_study(config, tmp_path, sweep=sweep, progress=False, command=typed)
    assert not out.get("failed"), out
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    bpb = {
        (r["encoding"], r["eval_length"]): r
        for r in rows
        if r["metric"] == "bits_per_byte" and r["value"] is not None
    }
    # one row per model (and llama's YaRN variant) and length, named by the model
    assert set(bpb) == {(m, n) for m in ("gpt2", "llama", "llama+yarn", "bloom") for n in (16, 32)}
    for (name, _), row in bpb.items():
        assert 0 < row["value"] < 12  # random weights: about log2(vocab) bits per token
        assert row["pretrained"]["family"] == {"gpt2": "gpt2", "bloom": "bloom"}.get(name, "llama")
        assert row["pretrained"]["weights_sha256"].startswith("sha256:")
        assert row["data"]["tokenizer_sha256"].startswith("sha256:")
        assert row["train_steps"] == 0
    assert bpb[("llama", 16)]["positional"] == "rope"
    assert bpb[("bloom", 16)]["positional"] == "alibi"
    table = (tmp_path / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    for name in ("gpt2", "llama", "llama+yarn", "bloom"):
        assert f"| {name} |" in table.replace("\\_", "_")
    # REPORT.md names each model by content (family, hashes, format), says that these
    # weights are random, and names no folder of this machine
    report = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert report.startswith("# Results: pretrained (tiny), pretrained models\n")
    gpt2_row = next(r for (name, _), r in bpb.items() if name == "gpt2")
    gpt2 = gpt2_row["pretrained"]
    assert gpt2["random_weights"] is True
    line = next(x for x in report.splitlines() if x.startswith("| .../gpt2 "))
    weights, tokenizer = gpt2["weights_sha256"][7:19], gpt2["tokenizer_sha256"][7:19]
    assert line == (  # learned positions: no RoPE scaling rows
        f"| .../gpt2 (random weights) | gpt2 | — | `sha256:{weights}` | `sha256:{tokenizer}` | "
        f"safetensors | {gpt2_row['train_length']} | — |"
    )
    llama = next(x for x in report.splitlines() if x.startswith("| .../llama "))
    assert llama.endswith(" | safetensors | 16 | yarn |"), llama  # the test runs yarn only
    assert "**Random weights: the numbers only show that the pipeline runs.**" in report
    assert "Peak learning rate" not in report and "Training steps" not in report
    for place in (tmp_path, Path.home(), sys.prefix, sys.base_prefix, ROOT):
        assert str(place) not in report, place


def test_a_pretrained_cell_maps_its_config_once_and_runs_one_preflight(tmp_path, monkeypatch):
    """From the study command's function to the scored windows, one pretrained cell reads and
    maps its config.json once (the run config, the pre-flight's tokenized text and the loaded
    weights share one `Checkpoint`) and is checked by one pre-flight (the runner's, which the
    cell keeps and its run reuses)."""
    monkeypatch.setattr(load, "_OPENED", {})  # nothing opened by an earlier test
    counts = {"model_config": 0, "preflight": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(families, "model_config", counted("model_config", families.model_config))
    monkeypatch.setattr(load.families, "model_config", families.model_config)
    spy = counted("preflight", loop.preflight)
    monkeypatch.setattr(loop, "preflight", spy)
    monkeypatch.setattr(runner, "preflight", spy)
    config = pretrained.get_config("tiny")
    config.eval.update(length_multiples=(1,), max_bytes=256, protocols=("nonoverlapping",))
    config.eval.rope_scalings = ()
    sweep = select_cells(expand_sweep(config), ["llama"])
    out = run_study(config, tmp_path, sweep=sweep, progress=False, report=False)
    assert out["done"] == ["llama-seed0"] and not out["failed"]
    assert counts == {"model_config": 1, "preflight": 1}


def test_the_offline_preset_resolves_to_its_packaged_models_at_quarter_to_four_times_l():
    """`pretrained:offline`: the GGUF files that packages ship, each at its training context
    L, evaluated at L/4 ... 4L with every window within the cap, RoPE rows under PI, NTK,
    dynamic NTK (scored at each target's prefix length, in one pass) and YaRN. A model whose
    packages are missing is left out; skipped, naming the pip commands, when both are."""
    from flaxformer_lite.study.sweeps import apply_overrides
    from flaxformer_lite.train.run_config import RunConfig

    config = pretrained.get_config("offline")
    cells = expand_sweep(config)
    assert [c["name"] for c in cells] == ["smollm2-135m-instruct-seed0", "gemma3-270m-seed0"]
    missing = [c["labels"]["unavailable"] for c in cells if "unavailable" in c.get("labels", {})]
    if len(missing) == len(cells):
        pytest.skip("; ".join(missing))
    for cell, (family, L) in zip(cells, (("llama", 8192), ("gemma3_text", 32768)), strict=True):
        if "unavailable" in cell.get("labels", {}):
            continue
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        assert run.pretrained.checkpoint().family.name == family
        assert run.eval_lengths == (L // 4, L // 2, L, 2 * L, 4 * L)
        plan = run.eval_plan()  # max_bytes >= the longest window: checked here
        lengths = sorted({c.scoring.length for c in plan.cells if c.na is None})
        assert lengths == list(run.eval_lengths)
        variants = {c.label.variant: c.incremental for c in plan.cells}
        assert variants == {
            "base": False,
            "pi": False,
            "ntk": False,
            "dynamic_ntk": True,
            "yarn": False,
        }


@__import__("pytest").mark.slow
def test_every_window_of_the_offline_preset_fits_its_text(request):
    """Each model's tokens of the scored split (tokenized, every byte reproduced) hold its
    longest window, 4L + 1 tokens (minutes: two tokenizers over 731 kB; run with -m slow)."""
    import pytest

    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("minutes of tokenizing: select it with -m slow")

    from flaxformer_lite.base.checks import ConfigError
    from flaxformer_lite.study.sweeps import apply_overrides
    from flaxformer_lite.train import batches
    from flaxformer_lite.train.run_config import RunConfig

    try:
        config = pretrained.get_config("offline")
    except ConfigError as e:
        pytest.skip(str(e))
    for cell in expand_sweep(config):
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        split = batches.open_run_data(run).split(config.eval.split)  # the plan's checks too
        assert split.num_tokens > 4 * run.data.train_length + 1
        assert split.token_bytes[split.scored].sum() == split.num_text_bytes


def test_the_offline_preset_refuses_a_missing_package_only_when_its_cells_are_selected(
    tmp_path, monkeypatch
):
    """Without the packages, ``pretrained:offline`` still loads as a config; a study that
    selects a model whose package is missing is refused in one line naming its pip command
    and its cells, before anything is written, and ``--only`` runs the model that is there."""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    config = pretrained.get_config("offline")
    entries = {m["name"]: m for m in config.sweep.models}
    assert {n: m["source"] for n, m in entries.items()} == {
        "smollm2-135m-instruct": "",
        "gemma3-270m": "",
    }
    assert entries["smollm2-135m-instruct"]["unavailable"].endswith(pretrained.SMOLLM2_PIP)
    assert entries["gemma3-270m"]["unavailable"].endswith(pretrained.GEMMA3_PIP)
    with pytest.raises(ConfigError) as e:
        run_study(config, tmp_path / "study", progress=False)
    message = str(e.value)
    assert "\n" not in message
    assert f"{pretrained.SMOLLM2_PIP} (cells smollm2-135m-instruct-seed0)" in message
    assert f"{pretrained.GEMMA3_PIP} (cells gemma3-270m-seed0)" in message
    assert message.endswith("--only=NAME runs the other cells")
    assert not (tmp_path / "study").exists()

    # SmolLM2 installed, Gemma 3 not: only Gemma's cells are refused
    monkeypatch.setattr(pretrained, "smollm2_gguf", lambda: str(tmp_path / "smollm2.gguf"))
    config = pretrained.get_config("offline")
    sweep = expand_sweep(config)
    runner.check_available(select_cells(sweep, ["smollm2-135m-instruct"]))
    with pytest.raises(ConfigError, match=r"part4 \(cells gemma3-270m-seed0\); --only"):
        runner.check_available(select_cells(sweep, ["gemma3-270m"]))
    # a run of Gemma 3 already in the workdir is left as it is, with --restart_changed too:
    # without its model it can be neither checked nor started again
    study = runner.Study(config, sweep, tmp_path / "held", "")
    held = study.cell_dir("gemma3-270m-seed0")
    held.mkdir(parents=True)
    (held / "identity.json").write_text(json.dumps({"config": {"seed": 0}}))
    for restart_changed in (False, True):
        study.check_identities(restart_changed)
        study.restart_changed_cells()
    assert (held / "identity.json").read_text() == json.dumps({"config": {"seed": 0}})
    with pytest.raises(ConfigError, match="must be a str"):
        config.sweep.models = ({**config.sweep.models[0], "unavailable": 1},)
        expand_sweep(config)


def test_offline_every_missing_hub_model_is_named_with_its_fetch_command(tmp_path, monkeypatch):
    """`pretrained:small` offline with an empty Hugging Face cache: one error naming each of
    its hub models with the command that fetches it and the --model= that takes the result,
    before anything is written."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    config = pretrained.get_config("small")
    with pytest.raises(ConfigError) as e:
        run_study(config, tmp_path / "study", progress=False)
    message = str(e.value)
    assert message.startswith(
        f"{len(pretrained.SMALL_MODELS)} hub model(s) are not in the local Hugging Face cache"
    )
    for model in pretrained.SMALL_MODELS:
        folder = "models/" + model["source"].rsplit("/", 1)[-1]
        assert f"{model['source']}: `hf download {model['source']} --include" in message
        assert f"--local-dir {folder}`, then --model={folder}" in message
    assert "\n" not in message
    assert not (tmp_path / "study").exists()
