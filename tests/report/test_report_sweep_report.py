"""Sweeps over learning rates and model sizes, and the report pieces they need (best rate per
encoding, extrapolation gap vs parameters) plus the cost table of every study: cells and
names as data, numbers worked by hand on synthetic rows, one tiny study end to end."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math

import pytest

from configs import extrapolation_lm, extrapolation_tasks
from flaxformer_lite import report
from flaxformer_lite.cli.pipeline import run_study
from flaxformer_lite.report import cost, sweep_report
from flaxformer_lite.results import store
from flaxformer_lite.study import sweeps
from flaxformer_lite.train.memory import count_parameters
from flaxformer_lite.train.run_config import ConfigError, RunConfig

ENCODINGS = extrapolation_lm.ENCODINGS


def _run(config, cell) -> RunConfig:
    return RunConfig.from_config(sweeps.apply_overrides(config, cell["overrides"]))


# ----------------------------------------------------------------------------- cells


# Run hashes (`RunConfig.hash`, the identity without corpus and versions) of presets whose
# finished workdirs must stay valid: `quick` (docs/results.md) and the tasks `cpu` study.
QUICK_HASHES = {
    "sinusoidal-seed0": "bc29e1192c86aebc",
    "learned-seed0": "59ad6401fddbd1d5",
    "rope-seed0": "477d350808c52f8d",
    "alibi-seed0": "8a07e587829cfcfc",
    "none-seed0": "e38d2e32045a80d6",
}
TASKS_CPU_DIGEST = "d2046f0836b4c5b8"  # sha256 of "name hash" lines of its 45 cells, [:16]


def _digest(config) -> str:
    lines = "".join(f"{c['name']} {_run(config, c).hash()}\n" for c in sweeps.expand_sweep(config))
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def test_existing_presets_keep_their_cells_names_and_hashes():
    """The new sweep dimensions (empty by default) leave old presets' cells as they were:
    same names, same overrides (no labels), same run identities -- a change here voids the
    finished quick/cpu workdirs (their cells would be refused or recomputed). If a config
    change is meant to void them, update the hashes and say so in docs/results.md."""
    quick = extrapolation_lm.get_config("quick")
    cells = sweeps.expand_sweep(quick)
    assert cells == [
        {"name": f"{e}-seed0", "overrides": {"model.positional": e, "seed": 0}} for e in ENCODINGS
    ]
    assert {c["name"]: _run(quick, c).hash() for c in cells} == QUICK_HASHES
    assert _digest(extrapolation_tasks.get_config("cpu")) == TASKS_CPU_DIGEST
    for module in (extrapolation_lm, extrapolation_tasks):
        for preset in module.PRESETS:
            config = module.get_config(preset)
            if config.sweep.learning_rates or config.sweep.model_sizes:
                continue
            without = config.to_dict()
            del without["sweep"]["learning_rates"], without["sweep"]["model_sizes"]
            assert sweeps.expand_sweep(config) == sweeps.expand_sweep(without), preset


def test_lr_preset_cells_are_rate_x_encoding_named_by_the_rate():
    config = extrapolation_lm.get_config("lr")
    cells = sweeps.expand_sweep(config)
    tags = ("1e-3", "3e-3", "1e-2", "3e-2")
    assert [c["name"] for c in cells] == [f"{e}-lr{t}-seed0" for t in tags for e in ENCODINGS]
    rates = [_run(config, c).optim.learning_rate for c in cells]
    assert rates == [r for r in (1e-3, 3e-3, 1e-2, 3e-2) for _ in ENCODINGS]
    assert all("labels" not in c for c in cells)
    # its 3e-3 cells are quick's runs (same identity) under another study name
    for cell in cells[5:10]:
        assert _run(config, cell).hash() == QUICK_HASHES[cell["name"].replace("-lr3e-3", "")]
    assert config.optim.learning_rate == 3e-3  # the common rate the report compares with
    assert sweeps.select_cells(cells, ["lr1e-2"]) == cells[10:15]


def test_scaling_preset_spans_ten_times_the_parameters_and_labels_the_size():
    config = extrapolation_lm.get_config("scaling")
    cells = sweeps.expand_sweep(config)
    sizes = [s["name"] for s in extrapolation_lm.SCALING_SIZES]
    assert len(cells) == 3 * 5 * 2
    assert [c["name"] for c in cells[:2]] == [f"sinusoidal-{sizes[0]}-seed{s}" for s in (0, 1)]
    assert cells[-1]["name"] == f"none-{sizes[-1]}-seed1"
    assert [c["labels"]["model_size"] for c in cells] == [s for s in sizes for _ in range(10)]
    params = {}
    for cell in cells:
        run = _run(config, cell)
        assert run.train.num_steps == 2000  # trained longer than quick (1000 steps)
        if run.model.positional == "rope":
            params[cell["labels"]["model_size"]] = count_parameters(run.model)
    assert params[sizes[1]] == 216_448  # quick's model in the middle
    assert params[sizes[-1]] / params[sizes[0]] >= 10
    assert sweeps.select_cells(cells, [sizes[0]]) == cells[:10]
    base = extrapolation_lm.get_config("scaling")
    assert _run(base, cells[12]).model.d_model == 64  # the size's override, not quick's


def test_sizes_x_rates_x_encodings_x_seeds_and_tasks_keep_the_labels():
    config = extrapolation_tasks.get_config("tiny").to_dict()
    config["sweep"].update(
        encodings=("rope", "alibi"),
        seeds=(0, 1),
        learning_rates=(1e-2, 2.5e-4),
        model_sizes=({"name": "s", "d_model": 16}, {"name": "m", "d_model": 32}),
    )
    cells = sweeps.expand_sweep(config)
    assert len(cells) == 2 * 2 * 2 * 2
    assert cells[0] == {
        "name": "copy-rope-s-lr1e-2-seed0",
        "overrides": {
            "model.positional": "rope",
            "model.d_model": 16,
            "optim.learning_rate": 1e-2,
            "seed": 0,
            "data.task": "copy",
        },
        "labels": {"model_size": "s"},
    }
    assert cells[-1]["name"] == "copy-alibi-m-lr2.5e-4-seed1"
    sweeps.check_cell_names(cells)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("learning_rates", (0.0,), "each rate must be a finite number > 0"),
        ("learning_rates", (1e-3, "3e-3"), "each rate must be a finite number > 0"),
        ("learning_rates", (1e-3, 0.001), "each rate must be given once"),
        ("learning_rates", 1e-3, "must be a tuple"),
        ("model_sizes", ({"d_model": 16},), "each size must be a dict with a 'name'"),
        ("model_sizes", ({"name": "a-b", "d_model": 16},), "each size must be a dict"),
        ("model_sizes", ({"name": "s"},), "at least one model field"),
        ("model_sizes", ({"name": "s", "positional": "rope"},), "other than positional"),
        ("model_sizes", ({"name": "s", "d": 1}, {"name": "s", "d": 2}), "given once"),
    ],
)
def test_a_bad_rate_or_size_is_refused_naming_the_field(field, value, message):
    config = extrapolation_lm.get_config("tiny").to_dict()
    config["sweep"][field] = value
    with pytest.raises(ConfigError, match=rf"config\.sweep\.{field}.*{message}"):
        sweeps.expand_sweep(config)


@pytest.mark.parametrize(
    ("rate", "tag"),
    [(1e-3, "1e-3"), (3e-3, "3e-3"), (1e-2, "1e-2"), (2.5e-4, "2.5e-4"), (1, "1e0")],
)
def test_learning_rate_tag(rate, tag):
    assert store.learning_rate_tag(rate) == tag


# ----------------------------------------------------------------------------- rows


def _row(encoding, multiple, value, *, seed=0, rate=3e-3, size=None, protocol="nonoverlapping"):
    L = 64
    return {
        "study": "s",
        "preset": "p",
        "run": f"{encoding}-{size}-lr{rate}-seed{seed}",
        "seed": seed,
        "encoding": encoding,
        "positional": encoding,
        "variant": "base",
        "randomized_positions": False,
        "train_length": L,
        "eval_length": int(L * multiple),
        "eval_multiple": multiple,
        "protocol": protocol,
        "task": None,
        "metric": "bits_per_byte",
        "value": value,
        "learning_rate": rate,
        "model_size": size,
        "split": "validation",
        "config_hash": f"{encoding}{seed}{rate}{size}",
    }


# bits/byte at 1x and 4x per (encoding, rate): rope is best at 1e-2, alibi at 3e-3 (a tie
# with 1e-3: the lower rate wins), none diverged at 1e-2 (NaN is never chosen).
LR_GRID = {
    ("rope", 1e-3): (2.30, 3.0),
    ("rope", 3e-3): (2.10, 2.9),
    ("rope", 1e-2): (2.00, 2.4),
    ("alibi", 1e-3): (2.05, 2.05),
    ("alibi", 3e-3): (2.05, 2.05),
    ("alibi", 1e-2): (2.20, 2.2),
    ("none", 1e-3): (2.50, 2.6),
    ("none", 3e-3): (2.15, 2.3),
    ("none", 1e-2): (math.nan, math.nan),
}


def _lr_rows():
    return [
        _row(e, m, v, rate=rate)
        for (e, rate), values in LR_GRID.items()
        for m, v in zip((1, 4), values, strict=True)
    ]


def test_best_rate_is_the_minimum_at_1x_ties_to_the_lower_rate_never_nan():
    rows = _lr_rows()
    choices = sweep_report.select_rates(rows)
    assert [(c.label, c.best) for c in choices] == [("rope", 1e-2), ("alibi", 1e-3), ("none", 3e-3)]
    none = choices[2]
    assert [s[0] for s in none.scores] == [1e-3, 3e-3, 1e-2] and math.isnan(none.scores[2][1])
    assert (none.metric, none.protocol, none.split) == (
        "bits_per_byte",
        "nonoverlapping",
        "validation",
    )
    kept = sweep_report.rows_at_best_rates(rows, choices)
    assert {(r["encoding"], r["learning_rate"]) for r in kept} == {
        ("rope", 1e-2),
        ("alibi", 1e-3),
        ("none", 3e-3),
    }
    assert len(kept) == 6
    # exact match is higher-is-better: the maximum wins
    task = [
        dict(_row("rope", 1, v, rate=r), metric="exact_match", protocol="task", task="copy")
        for r, v in ((1e-3, 0.9), (3e-3, 0.4))
    ]
    (choice,) = sweep_report.select_rates(task)
    assert (choice.best, choice.better) == (1e-3, "higher")
    # one rate per encoding (every other study): nothing is chosen, every row kept
    single = [r for r in rows if r["learning_rate"] == 3e-3]
    assert sweep_report.select_rates(single) == []
    assert sweep_report.rows_at_best_rates(single, []) == single


def test_learning_rate_table_marks_the_best_and_the_ranking_note_compares_with_3e_3():
    rows = _lr_rows()
    choices = sweep_report.select_rates(rows)
    table = sweep_report.learning_rate_table(choices, rows, 3e-3)
    md = report.render_markdown(table)
    assert "| encoding | lr 1e-3 | lr 3e-3 | lr 1e-2 | best |" in md
    assert "| rope | 2.300 | 2.100 | **2.000** | 1e-2 |" in md
    assert "| alibi | **2.050** | 2.050 | 2.200 | 1e-3 |" in md
    assert "| none | 2.500 | **2.150** | nan | 3e-3 |" in md
    assert "Selection bias" in md and "test split" in md
    # at 1x: best rates rope 2.00 < alibi 2.05 < none 2.15; at 3e-3: alibi 2.05 < rope 2.10
    # < none 2.15. At 4x: best rates alibi 2.05 < none 2.3 < rope 2.4; at 3e-3 the same.
    assert table.note == (
        "Ranking of the encodings (mean bits per byte over seeds) at each encoding's best "
        "rate vs all at the common rate 3e-3: the same at nonoverlapping 4×; differs at "
        "nonoverlapping 1× (best rates: rope < alibi < none; 3e-3: alibi < rope < none)."
    )
    records = list(csv.DictReader(io.StringIO(report.render_csv(table))))
    best = [(r["encoding"], r["learning_rate"]) for r in records if r["best"] == "True"]
    assert best == [("rope", "0.01"), ("alibi", "0.001"), ("none", "0.003")]
    assert "\\textbf{2.000}" in report.render_latex(table)
    # without a common rate, the grid's middle rate (3e-3 here) is the one compared with
    assert sweep_report.ranking_note(rows, choices, None) == table.note


def test_report_of_a_rate_sweep_tabulates_each_encoding_at_its_best_rate(tmp_path):
    text = report.write_report(_lr_rows(), tmp_path, common_rate=3e-3).read_text()
    main = (tmp_path / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    assert "| rope | 2.000 | 2.400 |" in main and "| alibi | 2.050 | 2.050 |" in main
    assert "rope 1e-2, alibi 1e-3, none 3e-3" in main  # the caption says which rate
    assert main.index("| rope |") < main.index("| alibi |") < main.index("| none |")
    assert "### Bits per byte at 1× by learning rate" in text
    assert "| Peak learning rates | 1e-3, 3e-3, 1e-2 |" in text
    for suffix in (".md", ".tex", ".csv"):
        assert (tmp_path / "tables" / f"learning_rate{suffix}").exists()
    assert "Cost per encoding" not in text  # no run times in these rows


def _size_rows():
    """2 sizes x 2 seeds; rope at 1x / 4x / 16x: seed 0 (2.0, 2.5, 3.0), seed 1 (2.2, 2.9,
    3.6) at size s -> gaps 4x: 0.5, 0.7; 16x: 1.0, 1.4. Learned: n/a past 1x."""
    rows = []
    for size, params, scale in (("s", 30_000, 1.0), ("m", 300_000, 0.5)):
        for seed, (v1, v4, v16) in enumerate(((2.0, 2.5, 3.0), (2.2, 2.9, 3.6))):
            for m, v in ((1, v1), (4, v1 + scale * (v4 - v1)), (16, v1 + scale * (v16 - v1))):
                for protocol in ("nonoverlapping", "context"):
                    value = v if protocol == "nonoverlapping" else v1 - 0.1 * (m > 1)
                    row = _row("rope", m, value, seed=seed, size=size, protocol=protocol)
                    rows.append(row | {"num_params": params})
                learned = _row("learned", m, v1, seed=seed, size=size) | {"num_params": params + 64}
                if m > 1:
                    learned |= {"value": None, "na": "no position embedding past 64"}
                rows.append(learned)
    return rows


def test_gap_table_is_the_per_run_difference_with_a_t_interval_over_seeds():
    rows = _size_rows()
    (table,) = sweep_report.gap_tables(rows)
    assert table.header == ("protocol", "gap", "encoding", "s (30.0k)", "m (300.0k)")
    body = {row[:3]: row[3:] for row in table.body}
    # s: mean(0.5, 0.7) = 0.6 ± 12.706 * 0.1 = 1.271; m: half of it
    assert body[("nonoverlapping", "4× − 1×", "rope")] == ("0.600 ± 1.271", "0.300 ± 0.635")
    assert body[("nonoverlapping", "16× − 1×", "rope")] == ("1.200 ± 2.541", "0.600 ± 1.271")
    assert body[("context", "4× − 1×", "rope")] == ("-0.100 ± 0.000", "-0.100 ± 0.000")
    assert body[("nonoverlapping", "4× − 1×", "learned")] == ("n/a", "n/a")
    records = list(csv.DictReader(io.StringIO(report.render_csv(table))))
    rope = next(r for r in records if r["encoding"] == "rope" and r["multiple"] == "16")
    assert float(rope["mean"]) == pytest.approx(1.2) and rope["n"] == "2"
    assert rope["num_params"] == "30000.0" and rope["model_size"] == "s"
    ((_, panels),) = sweep_report.gap_panels(rows)
    points = panels["nonoverlapping: 4× L − 1× L"]["rope"]
    assert [p[:2] for p in points] == [(30_000, pytest.approx(0.6)), (300_000, pytest.approx(0.3))]
    assert "learned" not in panels["nonoverlapping: 4× L − 1× L"]
    # one model size: no gap table (the study table says it all)
    assert sweep_report.gap_tables([r for r in rows if r["model_size"] == "s"]) == []


def test_report_of_a_size_sweep_has_a_table_per_size_and_the_gap_plot(tmp_path):
    text = report.write_report(_size_rows(), tmp_path).read_text()
    assert "### Bits per byte — nonoverlapping, model s" in text
    assert (tmp_path / "tables" / "bits_per_byte_nonoverlapping_m.md").exists()
    assert (tmp_path / "plots" / "extrapolation_gap_vs_params.png").exists()
    assert "### Extrapolation gap vs model size" in text
    assert "| Parameters | s: 30,000–30,064; m: 300,000–300,064 |" in text


def _cost_row(encoding, seed, *, protocol="nonoverlapping", metric="bits_per_byte", **extra):
    row = _row(encoding, 1, 2.0, seed=seed, protocol=protocol) | {"metric": metric}
    return row | {"tokens": 4096, "context_block": 32 if protocol == "context" else None} | extra


def test_cost_table_per_step_and_tokens_per_second():
    """fire: 2 runs, 1000 steps in 60 s and 80 s -> 60 and 80 ms/step, mean 70; it reads
    4096 (non-overlapping, 1x = 64) + 4096 / 32 windows x (64 + 32 - 1) = 12,160 (context,
    c = 64) = 16,256 tokens in 10 s -> 1,625.6 tokens/s (its loss rows count nothing more).
    rope: 1000 steps in 35 s, the same tokens in 4 s -> 4,064 tokens/s. alibi: 4096 tokens
    in 8 s, and no train_steps (rows of older studies): "—"."""
    times = {"train_steps": 1000, "eval_seconds": 10.0}
    rows = []
    for seed, seconds in ((0, 60.0), (1, 80.0)):
        for protocol in ("nonoverlapping", "context"):
            for metric in ("bits_per_byte", "loss"):
                rows.append(
                    _cost_row("fire", seed, protocol=protocol, metric=metric)
                    | times
                    | {"train_seconds": seconds}
                )
    for protocol in ("nonoverlapping", "context"):
        rows.append(
            _cost_row("rope", 0, protocol=protocol)
            | {"train_seconds": 35.0, "train_steps": 1000, "eval_seconds": 4.0}
        )
    rows.append(_cost_row("alibi", 0) | {"train_seconds": 50.0, "eval_seconds": 8.0})
    (table,) = cost.cost_tables(rows)
    body = {row[0]: row[1:] for row in table.body}
    assert table.header[:4] == ("encoding", "runs", "training ms/step", "× cheapest")
    assert body["fire"] == ("2", "70.0 (60.0–80.0)", "2.00", "1,626", "2.50")
    assert body["rope"] == ("1", "35.0", "1.00", "4,064", "1.00")
    assert body["alibi"] == ("1", "—", "—", "512", "7.94")
    assert "depend on the machine" in table.caption
    records = {r["encoding"]: r for r in csv.DictReader(io.StringIO(report.render_csv(table)))}
    assert float(records["fire"]["train_ms_per_step"]) == pytest.approx(70.0)
    assert float(records["fire"]["eval_tokens_per_second"]) == pytest.approx(1625.6)
    assert cost.forward_tokens(_cost_row("x", 0, protocol="sliding", stride=16)) == 4 * 4096
    # no run times at all: no cost table
    assert cost.cost_tables([_row("rope", 1, 2.0)]) == []


# ----------------------------------------------------------------------------- end to end


def test_a_tiny_sized_rate_cell_records_its_rate_size_parameters_and_steps(tmp_path):
    """One tiny run through the study runner: the rows carry the sweep's labels."""
    config = extrapolation_lm.get_config("tiny")
    size = {"name": "d16", "d_model": 16, "num_heads": 2, "d_ff": 32, "num_decoder_layers": 1}
    config.sweep.update(encodings=("rope",), learning_rates=(1e-2,), model_sizes=(size,))
    config.eval.update(length_multiples=(1, 4), max_bytes=256)
    out = run_study(config, tmp_path, progress=False, command="test")
    assert out["done"] == ["rope-d16-lr1e-2-seed0"] and not out["failed"]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    run = _run(config, sweeps.expand_sweep(config)[0])
    for r in rows:
        assert (r["learning_rate"], r["model_size"], r["train_steps"]) == (1e-2, "d16", 20)
        assert r["num_params"] == count_parameters(run.model) and r["train_seconds"] > 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "| Peak learning rate | 1e-2 |" in text and "### Cost per encoding" in text
    # the files in tables/ are results, equal for a rerun; wall-clock costs are not
    assert not list((tmp_path / "tables").glob("cost*"))
