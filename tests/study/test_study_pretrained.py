"""The pretrained-model study end to end: `pretrained:tiny` (the committed tiny Hugging Face
models) through the study runner, rows, tables and the report, with nothing trained."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from configs import pretrained
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
    gpt2 = next(r["pretrained"] for (name, _), r in bpb.items() if name == "gpt2")
    assert gpt2["random_weights"] is True
    line = next(x for x in report.splitlines() if x.startswith("| .../gpt2 "))
    assert line == (
        "| .../gpt2 (random weights) | gpt2 | — | "
        f"`sha256:{gpt2['weights_sha256'][7:19]}` | `sha256:{gpt2['tokenizer_sha256'][7:19]}` | "
        "safetensors |"
    )
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
