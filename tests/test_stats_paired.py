"""Uncertainty from seeds and data, paired tests, Holm (issue 13): hand-computed cases and
known results for `experiments.stats`, and the marks and paired table they produce."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaxformer_lite.experiments import paired, significance, stats, tables


def test_holm_against_a_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5]) == [0.5]
    assert stats.holm([0.4, 0.4]) == [0.8, 0.8]
    assert stats.holm([0.9, 0.9, 0.9]) == [1.0, 1.0, 1.0]  # capped at 1


def test_bootstrap_interval_hand_computed():
    """One seed, two blocks with values 2 and 4 (weight 1 each): a replicate draws both
    blocks twice (mean 2 or 4, probability 1/4 each) or one of each (3, probability 1/2), so
    the 2.5 % and 97.5 % quantiles are 2 and 4 and the mean is 3."""
    mean, low, high = stats.bootstrap_interval(np.array([[2.0, 4.0]]), np.ones((1, 2)))
    assert (mean, low, high) == (3.0, 2.0, 4.0)


def test_bootstrap_counts_weight_and_seeds_widen():
    # ratio of sums, not mean of ratios: blocks (10 / 10) and (1 / 1) -> 11 / 11 = 1
    assert stats.bootstrap_interval(np.array([[10.0, 1.0]]), np.array([[10.0, 1.0]]))[0] == 1.0
    rng = np.random.default_rng(0)
    data = rng.normal(0, 1, (1, 200))
    one = stats.bootstrap_interval(np.vstack([data]), np.ones((1, 200)))
    two = stats.bootstrap_interval(np.vstack([data, data + 1.0]), np.ones((2, 200)))
    assert two[0] == pytest.approx(one[0] + 0.5)
    assert (two[2] - two[1]) > 3 * (one[2] - one[1])  # the seed difference dominates


def test_paired_difference_known_results():
    rng = np.random.default_rng(1)
    values = rng.normal(2.0, 0.5, (3, 60)) * 100
    counts = np.full((3, 60), 100.0)
    same = stats.paired_difference(values, counts, values, counts)
    assert same == {"delta": 0.0, "low": 0.0, "high": 0.0, "p": 1.0}
    shifted = stats.paired_difference(values + 3.0, counts, values, counts)  # +0.03 per target
    assert shifted["delta"] == pytest.approx(0.03)
    assert shifted["low"] == pytest.approx(0.03) and shifted["high"] == pytest.approx(0.03)
    assert shifted["p"] == pytest.approx(2 / (stats.BOOTSTRAP_REPLICATES + 1))
    # a difference that is noise around zero is not significant, and pairing removes what the
    # two share: unpaired noise of the same size as the shared signal does not matter
    noise = rng.normal(0, 0.5, (3, 60))
    tiny = stats.paired_difference(values + noise, counts, values, counts)
    assert tiny["p"] > 0.05 and tiny["low"] < 0 < tiny["high"]
    with pytest.raises(ValueError, match=r"same \[seeds, blocks\]"):
        stats.paired_difference(values, counts, values[:2], counts[:2])


def _rows_and_blocks(shift: dict[str, float], seeds=(0, 1), blocks=40, length=64):
    """Rows and block records of a tiny study: every encoding's per-block loss is a common
    per-seed, per-block pattern plus its shift (in nats per target)."""
    rng = np.random.default_rng(3)
    base = rng.normal(1.5, 0.2, (len(seeds), blocks))
    rows, records = [], []
    for e, d in shift.items():
        for i, s in enumerate(seeds):
            loss = (base[i] + d) * 100.0
            common = {
                "study": "s",
                "run": f"{e}-seed{s}",
                "seed": s,
                "encoding": e,
                "protocol": "nonoverlapping",
                "eval_length": length,
                "task": None,
                "train_length": 64,
            }
            bpb = loss.sum() / (100.0 * blocks) / math.log(2)
            rows.append(common | {"metric": "bits_per_byte", "value": bpb, "positional": e})
            records.append(
                common
                | {
                    "blocks": {
                        "size": 100,
                        "unit": "b",
                        "loss": list(loss),
                        "count": [100.0] * blocks,
                    }
                }
            )
    return rows, records


def test_bold_only_when_significantly_best_and_ties_marked():
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.1, "c": 0.2})
    (table,) = tables.build_tables(rows, blocks)
    assert table.method == "bootstrap" and table.blocks == (40, 100, "b")
    (column,) = table.columns
    assert table.mark("a", column) == "best" and table.mark("b", column) is None
    md = tables.render_markdown(table)
    assert "| a | **" in md and "Bold: best and significantly better" in md
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.0, "c": 0.2})  # a and b identical
    (table,) = tables.build_tables(rows, blocks)
    assert {table.mark(e, column) for e in ("a", "b")} == {"tie"}
    assert table.mark("c", column) is None
    assert "| a | *" in tables.render_markdown(table)
    # without block data: Student t over seeds, nothing marked
    (plain,) = tables.build_tables(rows)
    assert plain.method == "t" and plain.marks == {} and "no per-block data" in plain.caption()


def test_paired_table_against_the_reference():
    rows, blocks = _rows_and_blocks({"alibi": 0.0, "rope": 0.05, "none": 0.0})
    (table,) = paired.build_paired_tables(tables.build_tables(rows, blocks))
    assert [(p.encoding, p.reference) for p in table.pairs] == [
        ("rope", "alibi"),
        ("none", "alibi"),
    ]
    rope, none = table.pairs
    assert rope.delta == pytest.approx(0.05 / math.log(2)) and rope.p_holm < 0.05
    assert none.delta == 0.0 and none.p == 1.0
    md = paired.render_markdown([table])
    assert "| rope − alibi | +0.072 [+0.072, +0.072] p=0.002* |" in md
    csv = paired.render_csv([table]).splitlines()
    assert csv[0].startswith("study,protocol,task") and len(csv) == 3
    assert "Holm-corrected over the 2 comparisons" in md
    every = paired.build_paired_tables(tables.build_tables(rows, blocks), all_pairs=True)
    assert len(every[0].pairs) == 3
    assert paired.build_paired_tables(tables.build_tables(rows, blocks), reference="xpos") == []


def test_too_few_blocks_fall_back_to_seeds():
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.1}, blocks=significance.MIN_BLOCKS - 1)
    (table,) = tables.build_tables(rows, blocks)
    assert table.method == "t" and table.marks == {}


def test_not_applicable_cells_take_no_part_in_the_marks():
    """A learned table's n/a cell (no embedding past L) is neither best nor a tie, and a
    column with one measured row has nothing to compare: no mark."""
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.1})
    na_rows = [
        r | {"eval_length": 128, "value": None, "na": "no row"} if r["encoding"] == "a" else r
        for r in rows
    ]
    wide, wide_blocks = _rows_and_blocks({"b": 0.1}, length=128)
    (table,) = tables.build_tables(
        rows + [r for r in na_rows if r.get("na")] + wide, blocks + wide_blocks
    )
    first, second = table.columns
    assert table.mark("a", first) == "best"
    assert table.mark("a", second) is None and table.mark("b", second) is None
    assert "| a | **" in tables.render_markdown(table) and "n/a" in tables.render_markdown(table)


def test_context_gain_table_compares_each_encoding_with_itself_at_l():
    """Context protocol: each encoding at c minus itself at c = L on the same targets. An
    encoding whose loss does not move with c has Δ = 0 (p = 1); one that gains is detected."""
    rows, blocks = [], []
    for length, gain in ((32, 0.1), (64, 0.0), (128, -0.05)):
        r, b = _rows_and_blocks({"alibi": 0.0, "rope": gain}, length=length)
        for x in r + b:
            x["protocol"] = "context"
        rows += r
        blocks += b
    built = paired.build_paired_tables(tables.build_tables(rows, blocks))
    versus, gain = built
    assert versus.reference_length is None and gain.reference_length == 64
    assert [c.eval_length for c in gain.columns] == [32, 128]
    rope_short = gain.get("rope", "rope", gain.columns[0])
    rope_long = gain.get("rope", "rope", gain.columns[1])
    assert rope_short.delta == pytest.approx(0.1 / math.log(2)) and rope_short.p_holm < 0.05
    assert rope_long.delta == pytest.approx(-0.05 / math.log(2)) and rope_long.p_holm < 0.05
    flat = gain.get("alibi", "alibi", gain.columns[1])
    assert flat.delta == 0.0 and flat.p == 1.0
    md = paired.render_markdown(built)
    assert "| rope (c) − rope (64) | +0.144 [+0.144, +0.144] p=" in md
    assert "**Context gain in bits per byte (c − L) — context.**" in md
    tex = paired.render_latex(built)
    assert "rope (c) $-$ rope (64) &" in tex
    csv = paired.render_csv(built).splitlines()
    assert len(csv) == 1 + 3 + 2 * 2  # rope - alibi at 3 columns; 2 encodings x 2 columns vs L


def test_change_with_length_for_the_window_protocols():
    """Non-overlapping windows score the same bytes at every length, so each encoding is also
    compared with itself at L: L' minus L."""
    rows, blocks = [], []
    for length, change in ((64, 0.0), (128, 0.3)):
        r, b = _rows_and_blocks({"alibi": 0.0, "rope": change}, length=length)
        rows += r
        blocks += b
    _versus, change = paired.build_paired_tables(tables.build_tables(rows, blocks))
    assert change.symbol == "L'" and change.reference_length == 64
    rope = change.get("rope", "rope", change.columns[0])
    assert rope.delta == pytest.approx(0.3 / math.log(2)) and rope.p_holm < 0.05
    md = paired.render_markdown([change])
    assert "**Change with length in bits per byte (L' − L) — nonoverlapping.**" in md
    assert "| rope (L') − rope (64) | +0.433 [" in md and "early token curse" in md


def test_an_all_zero_exact_match_keeps_its_blocks_and_its_bootstrap_interval():
    """A task nobody solved at a length is a measurement of 0 in every block: its block record
    keeps ``exact`` (zeros), and records written before (``exact`` dropped) read as zeros, so the
    table keeps the bootstrap over seeds and blocks instead of falling back to Student t."""
    from flaxformer_lite.evaluation.blocks import BlockSums
    from flaxformer_lite.experiments import significance

    sums = BlockSums(8, "examples")
    ids = np.arange(96) // 8
    sums.add("exact", ids, np.zeros(96))
    sums.add("examples", ids, np.ones(96))
    record = sums.to_dict()
    assert record["exact"] == [0.0] * 12 and record["examples"] == [8.0] * 12
    assert "loss" not in record  # never measured: still left out

    key = dict(study="s", seed=0, positional="rope", protocol="task", train_length=4, task="copy")
    key |= dict(eval_length=4, encoding="rope")
    rows, blocks = [], []
    for seed in (0, 1):
        rows.append(key | {"run": f"copy-rope-seed{seed}", "seed": seed, "value": 0.0})
        old = {k: v for k, v in record.items() if k != "exact"} if seed else record
        blocks.append(key | {"run": f"copy-rope-seed{seed}", "seed": seed, "blocks": old})
    grid = significance.BlockIndex(blocks).grid(rows, "exact_match")
    assert grid is not None and grid.values.shape == (2, 12) and not grid.values.any()
