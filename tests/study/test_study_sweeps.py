"""Sweeps (`study.sweeps`): sweeps as data, overrides, cell names and selection, shards of a
study's cells (``--shard=I/N``: deterministic, disjoint, covering, balanced by cost), the rows of
a cell, and every preset of every study config building and validating every run of its sweep
without training. (A killed study rerun: tests/integration/test_integration_kill_resume.py;
shards merged by make_report: tests/integration/test_integration_shard.py.)"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import STUDY_ARGS

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite.results import rows as results_rows
from flaxformer_lite.study import sweeps
from flaxformer_lite.study.sweeps import apply_overrides, expand_sweep
from flaxformer_lite.train.loop import build_model
from flaxformer_lite.train.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_lists_every_encoding_and_seed():
    c = extrapolation_lm.get_config("cpu")
    sweep = sweeps.expand_sweep(c)
    assert len(sweep) == 5 * 5
    assert sweep[0] == {
        "name": "sinusoidal-seed0",
        "overrides": {"model.positional": "sinusoidal", "seed": 0},
    }
    assert len({s["name"] for s in sweep}) == len(sweep)


def test_sweep_randomized_encodings_and_tasks():
    c = extrapolation_lm.get_config("all")
    sweep = sweeps.expand_sweep(c)
    names = [s["name"] for s in sweep]
    assert names[-2:] == ["sinusoidal-randomized-seed0", "rope-randomized-seed0"]
    assert sweep[-1]["overrides"] == {
        "model.positional": "rope",
        "model.randomized_positions": True,
        "seed": 0,
    }
    tasks = sweeps.expand_sweep(extrapolation_tasks.get_config("quick"))
    assert len(tasks) == 3 * 5
    assert tasks[0]["name"] == "copy-sinusoidal-seed0"
    assert tasks[-1]["overrides"]["data.task"] == "associative_recall"


def test_sweep_errors_name_the_field():
    c = extrapolation_lm.get_config("tiny")
    with c.unlocked():
        c.sweep.seeds = ()
    with pytest.raises(ConfigError, match=r"config\.sweep: encodings=.*seeds=\(\)"):
        sweeps.expand_sweep(c)
    d = extrapolation_lm.get_config("tiny").to_dict()
    d["sweep"]["colours"] = ("red",)
    with pytest.raises(ConfigError, match=r"config\.sweep has unknown field\(s\) \['colours'\]"):
        sweeps.expand_sweep(d)


@pytest.mark.parametrize("seeds", [(-1,), (0, -3), (1.5,), (True,), (2**40,)])
def test_a_bad_seed_is_refused_naming_sweep_seeds(seeds):
    """A bad seed in sweep.seeds is refused before the workdir is written, in an error that
    names the field."""
    c = extrapolation_lm.get_config("tiny").to_dict()
    c["sweep"]["seeds"] = seeds
    with pytest.raises(ConfigError, match=r"^config\.sweep\.seeds=.*: each seed must be an int in"):
        sweeps.expand_sweep(c)
    c = extrapolation_lm.get_config("tiny").to_dict()
    c["seed"] = seeds[-1]
    with pytest.raises(ConfigError, match=r"^config\.(seed=.*: must be an int in|seed=.*must be)"):
        RunConfig.from_config(c)


@pytest.mark.parametrize(
    "name", ["../../x", "..", "a/b", "a\\b", "/abs", ".hidden", "-x", "", "a b", "x..y", "é", None]
)
def test_a_cell_name_outside_runs_is_refused(name):
    """A sweep cell whose name would put it outside the study's runs/ (../../x) is refused."""
    sweep = [{"name": "rope-seed0", "overrides": {}}, {"name": name, "overrides": {}}]
    with pytest.raises(ConfigError, match=r"^sweep cell name=.*: must be a plain directory name"):
        sweeps.check_cell_names(sweep)


def test_cell_names_are_unique_and_every_preset_s_names_are_accepted():
    with pytest.raises(ConfigError, match=r"sweep cell name='a': is given twice"):
        sweeps.check_cell_names([{"name": "a"}, {"name": "a"}])
    for module in (extrapolation_lm, extrapolation_tasks):
        for preset in ("tiny", "quick", "cpu", "all"):
            sweeps.check_cell_names(sweeps.expand_sweep(module.get_config(preset)))


def test_apply_overrides_and_errors():
    c = extrapolation_lm.get_config("tiny")
    d = sweeps.apply_overrides(c, {"model.positional": "rope", "seed": 3})
    assert (d.model.positional, d.seed) == ("rope", 3)
    assert c.model.positional == "alibi"  # the original is untouched
    with pytest.raises(ConfigError, match="no field 'bogus'"):
        sweeps.apply_overrides(c, {"model.bogus": 1})


def test_select_cells_by_encoding_or_name():
    sweep = sweeps.expand_sweep(extrapolation_lm.get_config("cpu"))
    picked = sweeps.select_cells(sweep, ["alibi", "rope-seed2"])
    assert [c["name"] for c in picked] == [
        "rope-seed2",
        "alibi-seed0",
        "alibi-seed1",
        "alibi-seed2",
        "alibi-seed3",
        "alibi-seed4",
    ]
    with pytest.raises(ConfigError, match=r"--only=.*\['xpos'\] not in this sweep"):
        sweeps.select_cells(sweep, ["xpos"])


def test_command_line_override_of_a_swept_field_is_refused():
    sweep = sweeps.expand_sweep(extrapolation_lm.get_config("tiny"))
    sweeps.check_overrides(sweep, [("config.optim.learning_rate", "0.1")])
    with pytest.raises(ConfigError, match=r"--config\.seed=4: set for every cell by the study"):
        sweeps.check_overrides(sweep, [("config.seed", "4")])


def test_rows_for_cell_carry_the_plan_labels():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    c.eval.length_multiples = (1, 2)
    c.eval.rope_scalings = ("pi",)
    run = RunConfig.from_config(c)
    env = {
        "git_commit": "abc",
        "packages": {},
        "python": "3.11",
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "data": {"sha256": "x"},
    }
    evals = []
    for cell in run.eval_plan().cells:
        length = cell.length
        metrics = {
            "eval_length": length,
            "protocol": cell.protocol,
            "stride": length,
            "tokens": 100,
            "loss": 1.0,
            "bits_per_byte": 1.4,
            "perplexity": 2.7,
            "accuracy": 0.5,
            "bucket_loss": {"[0,16)": 1.0} | ({"[16,32)": 1.1} if length == 32 else {}),
            "loss_by_position": [1.0] * length,
        }
        evals.append(metrics | cell.label.fields() | {"encoding_options": cell.encoding_options()})
    summary = {
        "config_hash": run.hash(),
        "provenance": env,
        "train_seconds": 1.0,
        "eval_seconds": 2.0,
        "eval": evals,
        "finished_at": "2026-01-01T00:00:00+00:00",
    }
    rows = results_rows.rows_for_cell(run, "rope-seed0", summary, "cmd")
    # per length: 4 scalars + buckets (1 or 2) + 1 curve; 2 variants
    assert len(rows) == 2 * ((4 + 1 + 1) + (4 + 2 + 1))
    assert {r["encoding"] for r in rows} == {"rope", "rope+pi"}
    assert {r["positional"] for r in rows} == {"rope"}
    assert {r["variant"] for r in rows} == {"base", "pi"}
    pi = next(r for r in rows if r["variant"] == "pi" and r["eval_length"] == 32)
    assert pi["encoding"] == "rope+pi" and pi["randomized_positions"] is False
    # the exact settings of the evaluated model: PI with s = 32 / 16
    assert pi["encoding_options"]["scaling"] == "pi" and pi["encoding_options"]["scale"] == 2.0
    base = next(r for r in rows if r["variant"] == "base")
    assert base["encoding_options"]["scaling"] == "none"
    assert {r["eval_multiple"] for r in rows} == {1, 2}
    json.dumps(rows)  # serialisable


def test_encoding_hyperparameters_are_sized_to_the_training_length():
    """T5 max_distance L / 4 (T5: 128 with inputs of 512), FIRE's threshold L / 4, xPos's
    scale base L / 2 (torchscale: 512 at 1024), the learned table L rows."""
    for preset, length in (("quick", 64), ("tiny", 16), ("wikitext103_bytes", 512)):
        c = extrapolation_lm.get_config(preset)
        o = c.model.positional_options
        assert c.data.train_length == length
        assert o.t5.max_distance == max(length // 4, 3)
        assert o.t5.num_buckets // 2 < o.t5.max_distance  # above the exact buckets
        assert o.fire.threshold_init == length / 4
        assert o.xpos.scale_base == length / 2
        assert o.learned.max_length == length
        assert o.rope.original_length == length
        assert c.model.max_position == length * max(c.eval.length_multiples)
    assert (
        extrapolation_lm.get_config("wikitext103_bytes").model.positional_options.t5.num_buckets
        == 32
    )
    assert extrapolation_lm.get_config("all").eval.local_window == 64


def test_presets_of_the_citeable_study():
    """The cpu preset: 5 seeds, both protocols, the whole split; quick: 1 seed, whole split;
    only the smoke preset caps the evaluation; the old "paper" name is an unknown preset."""
    cpu = extrapolation_lm.get_config("cpu")
    assert tuple(cpu.sweep.seeds) == (0, 1, 2, 3, 4)
    assert tuple(cpu.eval.protocols) == ("nonoverlapping", "context")
    assert cpu.eval.max_bytes == 0 and cpu.eval.split == "validation"
    quick = extrapolation_lm.get_config("quick")
    assert tuple(quick.sweep.seeds) == (0,) and quick.eval.max_bytes == 0
    assert extrapolation_lm.get_config("tiny").eval.max_bytes > 0
    with pytest.raises(
        ValueError, match=r"preset='paper' is not known; allowed: \[.*'wikitext103_bytes'"
    ):
        extrapolation_lm.get_config("paper")


@pytest.mark.parametrize("value, expected", [("0/1", (0, 1)), ("3/4", (3, 4)), ((1, 2), (1, 2))])
def test_parse_shard(value, expected):
    assert sweeps.parse_shard(value) == expected


@pytest.mark.parametrize("value", ["4/4", "-1/4", "0/0", "1", "a/b", "1/2/3", ""])
def test_a_bad_shard_is_refused_naming_the_flag(value):
    with pytest.raises(ConfigError, match=r"^--shard=.*: must be I/N with integers"):
        sweeps.parse_shard(value)


@pytest.mark.parametrize("preset, n", [("tiny", 2), ("tiny", 3), ("cpu", 4), ("all", 5)])
def test_shards_are_deterministic_disjoint_covering_and_balanced(preset, n):
    config = extrapolation_lm.get_config(preset)
    cells = sweeps.expand_sweep(config)
    shards = [sweeps.shard_cells(cells, (i, n), config) for i in range(n)]
    again = [sweeps.shard_cells(cells, (i, n), config) for i in range(n)]
    assert shards == again  # deterministic
    names = [c["name"] for shard in shards for c in shard]
    assert sorted(names) == sorted(c["name"] for c in cells)  # disjoint and covering
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # equal costs: balanced by count
    for shard in shards:  # each shard keeps sweep order
        order = [cells.index(c) for c in shard]
        assert order == sorted(order)


def test_shards_balance_unequal_costs():
    """Greedy longest-processing-time: no shard exceeds another by more than the largest cell."""
    config = extrapolation_lm.get_config("tiny")
    steps = [10, 80, 20, 40, 40, 70, 10, 30, 50, 60]
    cells = [
        {"name": f"c{k}", "overrides": {"train.num_steps": s, "seed": k}}
        for k, s in enumerate(steps)
    ]
    costs = {c["name"]: sweeps.cell_cost(config, c) for c in cells}
    assert costs["c1"] > costs["c5"] > costs["c0"]  # more steps, more cost
    loads = [
        sum(costs[c["name"]] for c in sweeps.shard_cells(cells, (i, 3), config)) for i in range(3)
    ]
    assert max(loads) - min(loads) <= max(costs.values())
    assert max(loads) <= sum(costs.values()) / 3 + max(costs.values()) * 0.5


def test_more_shards_than_cells_is_refused():
    cells = [{"name": "a", "overrides": {}}, {"name": "b", "overrides": {}}]
    with pytest.raises(ConfigError, match=r"^--shard='2/3': N must be at most .* \(2\)"):
        sweeps.shard_cells(cells, (2, 3))


def test_run_study_refuses_a_bad_shard_in_one_line(tmp_path):
    cmd = [sys.executable, "scripts/run_study.py", f"--workdir={tmp_path / 's'}", *STUDY_ARGS]
    proc = subprocess.run(
        [*cmd, "--shard=2/2"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --shard='2/2': must be I/N with integers N >= 1 and 0 <= I < N (0-based)"
    ]
    assert not (tmp_path / "s").exists()


CONFIG_MODULES = ("configs.extrapolation_lm", "configs.extrapolation_tasks")


PRESETS = [
    (module, preset)
    for module in CONFIG_MODULES
    for preset in importlib.import_module(module).PRESETS
]


def test_the_presets_are_found():
    assert ("configs.extrapolation_lm", "cpu") in PRESETS
    assert ("configs.extrapolation_tasks", "quick") in PRESETS


@pytest.mark.parametrize(("module", "preset"), PRESETS)
def test_every_run_of_every_preset_validates(module, preset):
    config = importlib.import_module(module).get_config(preset)
    sweep = expand_sweep(config)
    assert sweep, f"{module}:{preset} has no cells"
    names = [cell["name"] for cell in sweep]
    assert len(set(names)) == len(names)
    for cell in sweep:
        run = RunConfig.from_config(apply_overrides(config, cell["overrides"]))
        assert run.eval_plan() is not None  # every evaluation cell is buildable


def test_the_dev_preset_is_quicks_model_at_a_small_part_of_its_cost():
    """`dev`: RoPE and ALiBi with quick's model, evaluation capped in bytes of text; its
    estimated compute (`sweeps.cell_cost`) is under a tenth of quick's."""
    dev, quick = extrapolation_lm.get_config("dev"), extrapolation_lm.get_config("quick")
    assert [c["name"] for c in expand_sweep(dev)] == ["rope-seed0", "alibi-seed0"]
    for field in ("d_model", "num_heads", "d_ff", "num_decoder_layers", "norm", "activation"):
        assert dev.model[field] == quick.model[field], field
    assert dev.eval.max_bytes == 65536 and quick.eval.max_bytes == 0
    cost = {
        name: sum(sweeps.cell_cost(c, cell) for cell in expand_sweep(c))
        for name, c in (("dev", dev), ("quick", quick))
    }
    assert cost["dev"] < cost["quick"] / 10, cost


def test_associative_recall_holds_the_task_studies_longest_length():
    """64 pairs (16 x 4, the task studies' longest evaluation): distinct keys per row, and
    the one scored target is the value that followed the queried key."""
    import numpy as np

    from flaxformer_lite.data import get_task

    task = get_task("associative_recall")
    assert task.max_length == 83
    batch = task.sample(np.random.default_rng(0), 32, 64)
    seq = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)  # [B, 2n + 3]
    assert seq.shape == (32, 2 * 64 + 3)
    for row, mask in zip(seq, batch["loss_mask"], strict=True):
        keys, values = row[0:128:2], row[1:128:2]
        assert len(set(keys.tolist())) == 64 and all(chr(k) not in "0123456789? " for k in keys)
        assert row[128] == ord("?") and np.flatnonzero(mask).tolist() == [129]
        (where,) = np.flatnonzero(keys == row[129])
        assert row[130] == values[where]
    with pytest.raises(ValueError, match=r"must be in \[1, 83\], got 84"):
        task.sample(np.random.default_rng(0), 1, 84)


def test_the_modern_preset_expands_and_every_cell_validates():
    """75 cells (5 encodings x 3 designs x 5 seeds), each a valid run config that builds its
    model and whose evaluation
    plan has the rows of its design: a window shorter than L, a pattern cycling over the
    layers, YaRN / ALiBi-PI / temperature rows where they apply (none for SSMax's cells), and
    both protocols, the context protocol with its key targets beyond L."""
    c = extrapolation_lm.get_config("modern")
    cells = sweeps.expand_sweep(c)
    sweeps.check_cell_names(cells)
    assert len(cells) == 75
    encodings = {}
    for cell in cells[::5]:  # seed 0 of each design (seeds change nothing else)
        run = RunConfig.from_config(sweeps.apply_overrides(c, cell["overrides"]))
        model = run.model
        layers = model.layer_kinds()
        assert len(layers) == model.num_decoder_layers == 4
        if any(layer.window is not None for layer in layers):
            assert all(layer.window < run.data.train_length for layer in layers if layer.window)
            assert model.num_decoder_layers % len(model.layer_pattern) == 0
        if model.attention_temperature == "ssmax":  # log L with the run's L, filled by the run
            assert model.temperature_length == run.data.train_length
        build_model(run)  # every design's model builds (an unfilled L failed here)
        plan = run.eval_plan().cells
        encodings[cell["name"]] = {x.label.encoding for x in plan}
        context = [x.scoring for x in plan if x.protocol == "context"]
        assert {x.context for x in context} == {32, 64, 128, 256, 512, 1024}
        assert {x.key_near for x in context} == {run.data.train_length}
    assert encodings["rope-plain-seed0"] == {"rope", "rope+yarn", "rope+logn", "rope+llama4"}
    assert encodings["alibi-plain-seed0"] == {"alibi", "alibi+pi", "alibi+logn", "alibi+llama4"}
    assert encodings["p_rope-plain-seed0"] >= {"p_rope+yarn", "p_rope+logn"}
    assert encodings["fox-ssmax-seed0"] == {"fox+ssmax"}
    assert "rope+gpt_oss+sinks+logn" in encodings["rope-gpt_oss-seed0"]
    assert "none+gpt_oss+sinks" in encodings["none-gpt_oss-seed0"]


def test_a_copied_pretrained_config_still_finds_the_tiny_models(tmp_path):
    """The tiny preset's models are found from the package, not from the config file's own
    folder, so a researcher's copy of configs/pretrained.py elsewhere keeps its tiny preset."""
    import importlib.util
    import shutil

    from configs import pretrained

    copy = tmp_path / "my_pretrained.py"
    shutil.copy(pretrained.__file__, copy)
    spec = importlib.util.spec_from_file_location("my_pretrained", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sources = [m["source"] for m in module.get_config("tiny").sweep.models]
    assert sources and all(Path(s).is_dir() for s in sources), sources


def test_the_modern_rate_sweep_is_modern_at_three_rates_without_variants():
    """45 cells (15 designs x 3 rates, seed 0): modern's models and training at each rate,
    only non-overlapping windows and only the plain row of each design."""
    c = extrapolation_lm.get_config("modern_lr")
    cells = sweeps.expand_sweep(c)
    sweeps.check_cell_names(cells)
    assert len(cells) == 45
    rates = {cell["overrides"]["optim.learning_rate"] for cell in cells}
    assert rates == {3e-3, 1e-2, 3e-2}
    assert {cell["overrides"]["seed"] for cell in cells} == {0}
    modern = {c["name"] for c in sweeps.expand_sweep(extrapolation_lm.get_config("modern"))}
    for cell in cells:
        rate = sweeps.learning_rate_tag(cell["overrides"]["optim.learning_rate"])
        assert cell["name"].replace(f"-lr{rate}", "") in modern
    run = RunConfig.from_config(sweeps.apply_overrides(c, cells[0]["overrides"]))
    plan = run.eval_plan().cells
    assert {x.protocol for x in plan} == {"nonoverlapping"}
    assert {x.label.encoding for x in plan} == {cells[0]["overrides"]["model.positional"]}
    assert sorted({x.length for x in plan}) == [64, 128, 256, 512, 1024]


def test_modern_best_lr_is_modern_at_the_best_rate_with_p_rope_within_l():
    modern, best = (extrapolation_lm.get_config(p) for p in ("modern", "modern_best_lr"))
    assert best.optim.learning_rate == extrapolation_lm.BEST_LEARNING_RATE == 1e-2
    assert modern.model.positional_options.p_rope.p == 0.75
    assert best.model.positional_options.p_rope.p == 3 / 8
    best.optim.learning_rate = modern.optim.learning_rate
    best.model.positional_options.p_rope.p = modern.model.positional_options.p_rope.p
    best.preset = modern.preset
    assert best.to_dict() == modern.to_dict()  # nothing else differs
    # wavelength 2 pi 10000^(i/8) of pair i at head_dim 16: 6.28, 19.9, 62.8, 198.7, 628.3, ...
    assert extrapolation_lm.p_rope_within(64, 16) == 3 / 8
    assert extrapolation_lm.p_rope_within(628, 16) == 4 / 8
    assert extrapolation_lm.p_rope_within(629, 16) == 5 / 8
    assert extrapolation_lm.p_rope_within(6, 16) == 0.0
