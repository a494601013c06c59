"""Uncertainty from seeds and data, paired tests, Holm: hand-computed cases and
known results for `results.stats`, and the marks and paired table they produce."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaxformer_lite import report
from flaxformer_lite.report import paired
from flaxformer_lite.report import study_tables as tables
from flaxformer_lite.results import significance, stats


def test_holm_against_a_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5]) == [0.5]
    assert stats.holm([0.4, 0.4]) == [0.8, 0.8]
    assert stats.holm([0.9, 0.9, 0.9]) == [1.0, 1.0, 1.0]  # capped at 1


def test_interval_is_student_t_over_seeds_when_the_blocks_add_nothing():
    """Each seed's loss the same in every block: a bootstrap of the blocks cannot move any
    seed's ratio, so the interval is exactly Student t over the seeds (`mean_ci`)."""
    per_seed = np.array([1.0, 3.0, 2.5, 1.7])
    for n in (2, 4):
        values, counts = np.repeat(per_seed[:n, None], 30, axis=1) * 7.0, np.full((n, 30), 7.0)
        mean, low, high = stats.bootstrap_interval(values, counts)
        m, half, _ = stats.mean_ci(per_seed[:n])
        assert mean == pytest.approx(m) and (low, high) == pytest.approx((m - half, m + half))
    # two seeds: t_{0.975, 1} = 12.706 times the standard error |3 - 1| / 2
    assert stats.bootstrap_interval(np.array([[1.0] * 12, [3.0] * 12]), np.ones((2, 12)))[
        2
    ] == pytest.approx(2.0 + 12.7062047 * 1.0)


def test_one_seed_interval_against_the_closed_form_bootstrap_variance():
    """One seed, equal counts: the statistic is the mean of the blocks, whose bootstrap
    variance is the blocks' population variance over B (exactly, as replicates grow); the
    interval is the mean ± t_{B-1} times its root."""
    rng = np.random.default_rng(5)
    blocks = rng.normal(2.0, 0.3, 40)
    mean, low, high = stats.bootstrap_interval(blocks[None], np.ones((1, 40)), replicates=40_000)
    se = np.sqrt(np.var(blocks) / 40)
    assert mean == pytest.approx(blocks.mean())
    assert (high - low) / 2 == pytest.approx(stats.t_quantile(0.975, 39) * se, rel=0.02)
    # the ratio of sums, not the mean of ratios: blocks (10 / 10) and (1 / 1) -> 11 / 11 = 1
    assert stats.bootstrap_interval(np.array([[10.0, 1.0]]), np.array([[10.0, 1.0]]))[0] == 1.0


def _simulated(rng, seeds, blocks, sd_seed, sd_block, sd_noise):
    """A grid whose expected value is 0: seed effects, block effects shared by every seed
    (the same bytes), and noise per seed and block."""
    shared = rng.normal(0, sd_block, blocks)
    return rng.normal(0, sd_seed, (seeds, 1)) + shared + rng.normal(0, sd_noise, (seeds, blocks))


@pytest.mark.parametrize(
    "seeds, sd_seed, sd_block",
    [
        (5, 0.0, 1.0),  # the data dominate (blocks drawn per seed gave 62 % coverage here)
        (3, 1.0, 0.0),  # the seeds dominate (a percentile bootstrap over 3 seeds: 75 %)
        (3, 0.3, 1.0),
    ],
)
def test_intervals_cover_the_true_mean_at_about_their_level(seeds, sd_seed, sd_block):
    """Coverage of the 95 % interval over 200 simulated studies with a known mean of 0: the
    nested percentile bootstrap (seeds, then blocks drawn afresh for every seed)
    covered it in 62 % (data-dominated, 5 seeds) and 75 % (seed-dominated, 3 seeds) of cases."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(200):
        grid = _simulated(rng, seeds, 40, sd_seed, sd_block, 0.3)
        _, low, high = stats.bootstrap_interval(grid, np.ones_like(grid), replicates=300)
        hits += low <= 0.0 <= high
    assert 0.89 <= hits / 200 <= 1.0


def test_paired_test_keeps_its_level_with_few_seeds():
    """Two encodings with the same expected loss, each trained on 3 seeds (seed noise) and
    scored on the same blocks (shared difficulty plus an encoding x block interaction): p < 0.05
    in about 5 % of 200 simulated studies (the nested bootstrap's p: 26 %)."""
    rng = np.random.default_rng(12)
    rejections = 0
    for _ in range(200):
        shared = rng.normal(0, 1.0, 40)
        a = shared + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.2, 40)
        b = shared + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.2, 40)
        ones = np.ones_like(a)
        rejections += stats.paired_difference(a, ones, b, ones, replicates=300)["p"] < 0.05
    assert rejections / 200 <= 0.10


def test_paired_difference_known_results():
    rng = np.random.default_rng(1)
    values = rng.normal(2.0, 0.5, (3, 60)) * 100
    counts = np.full((3, 60), 100.0)
    same = stats.paired_difference(values, counts, values, counts)
    assert same == {"delta": 0.0, "low": 0.0, "high": 0.0, "p": 1.0}
    shifted = stats.paired_difference(values + 3.0, counts, values, counts)  # +0.03 per target
    assert shifted["delta"] == pytest.approx(0.03)
    assert shifted["low"] == pytest.approx(0.03) and shifted["high"] == pytest.approx(0.03)
    assert shifted["p"] < 1e-12  # the same shift in every block and seed: no spread
    # a difference that is noise around zero is not significant, and pairing removes what the
    # two share: unpaired noise of the same size as the shared signal does not matter
    noise = rng.normal(0, 0.5, (3, 60))
    tiny = stats.paired_difference(values + noise, counts, values, counts)
    assert tiny["p"] > 0.05 and tiny["low"] < 0 < tiny["high"]
    # the p-value is Welch's t on the interval's degrees of freedom: shifted so that the
    # difference equals the interval's half width (a constant shift keeps the spread), p = 0.05
    half = (tiny["high"] - tiny["low"]) / 2
    shift = 100 * (half - tiny["delta"])  # per block of 100 targets
    edge = stats.paired_difference(values + noise + shift, counts, values, counts)
    assert edge["delta"] == pytest.approx(half)
    assert edge["p"] == pytest.approx(0.05, rel=1e-6)
    with pytest.raises(ValueError, match=r"same \[seeds, blocks\]"):
        stats.paired_difference(values, counts, values[:2], counts[:2])
    with pytest.raises(ValueError, match=r"replicates=1 must be an int >= 2"):
        stats.paired_difference(values, counts, values, counts, replicates=1)
    with pytest.raises(ValueError, match=r"confidence=1.5 must be in \(0, 1\)"):
        stats.bootstrap_interval(values, counts, confidence=1.5)


def test_a_diverged_run_gives_no_interval_and_no_test():
    """A NaN loss in one block of one seed (a diverged run): NaN ends and p, never a finite
    interval from the replicates that missed it; Holm leaves it out of the family."""
    values = np.random.default_rng(2).normal(2.0, 0.2, (3, 20))
    broken = values.copy()
    broken[1, 4] = np.nan
    ones = np.ones_like(values)
    mean, low, high = stats.bootstrap_interval(broken, ones)
    assert math.isnan(mean) and math.isnan(low) and math.isnan(high)
    r = stats.paired_difference(broken, ones, values, ones)
    assert all(math.isnan(r[k]) for k in ("delta", "low", "high", "p"))
    assert stats.holm([math.nan, 0.01, 0.02]) == pytest.approx([math.nan, 0.02, 0.02], nan_ok=True)
    assert stats.holm([0.01, 0.02, math.nan]) == pytest.approx([0.02, 0.02, math.nan], nan_ok=True)


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
    md = report.render_markdown(table)
    assert "| a | **" in md and "Bold: significantly best" in md
    assert len(table.caption().split()) <= 50, table.caption()  # the protocol is defined once
    assert "t_seeds_bootstrap_blocks" in table.caption()  # the CSV's name for the intervals
    assert "t_seeds_bootstrap_blocks" in report.render_csv(table.table())
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.0, "c": 0.2})  # a and b identical
    (table,) = tables.build_tables(rows, blocks)
    assert {table.mark(e, column) for e in ("a", "b")} == {"tie"}
    assert table.mark("c", column) is None
    assert "| a | *" in report.render_markdown(table)
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
    assert "| rope − alibi | +0.072 [+0.072, +0.072] p<1e-04* |" in md
    csv = paired.render_csv([table]).splitlines()
    assert csv[0].startswith("study,protocol,task") and len(csv) == 3
    assert "Holm-corrected over 2 comparisons" in md
    every = paired.build_paired_tables(tables.build_tables(rows, blocks), all_pairs=True)
    assert len(every[0].pairs) == 3
    assert paired.build_paired_tables(tables.build_tables(rows, blocks), reference="xpos") == []


def test_each_table_takes_the_first_reference_it_holds():
    plain = _rows_and_blocks({"fox": 0.0, "rope": 0.05})
    windowed = _rows_and_blocks({"fox+w": 0.0, "rope+w": 0.1, "alibi+w": 0.02})
    windowed = [[r | {"model_size": "w"} for r in part] for part in windowed]  # its own table
    built = tables.build_tables(plain[0] + windowed[0], plain[1] + windowed[1])
    for reference in ("fox+w,fox", ["fox", "fox+w"], " fox , fox+w,"):
        got = paired.build_paired_tables(built, reference=reference)
        assert [[(p.encoding, p.reference) for p in t.pairs] for t in got] == [
            [("rope", "fox")],
            [("rope+w", "fox+w"), ("alibi+w", "fox+w")],
        ]
        assert got[1].pairs[0].delta == pytest.approx(0.1 / math.log(2))
    # the first name a table holds wins; a name no table holds changes nothing
    (only,) = paired.build_paired_tables(built, reference="xpos,alibi+w")
    assert [(p.encoding, p.reference) for p in only.pairs] == [
        ("fox+w", "alibi+w"),
        ("rope+w", "alibi+w"),
    ]
    assert paired.reference_names("a,b,a, ,c") == ["a", "b", "c"]


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
    assert "| a | **" in report.render_markdown(table) and "n/a" in report.render_markdown(table)


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
    assert "| rope (c) − rope (64) | +0.144 [+0.144, +0.144] p<1e-04* |" in md
    assert "**Context gain in bits per byte (c − L) — context.**" in md
    tex = paired.render_latex(built)
    assert "rope (c) $-$ rope (64) &" in tex
    csv = paired.render_csv(built).splitlines()
    assert len(csv) == 1 + 3 + 2 * 2  # rope - alibi at 3 columns; 2 encodings x 2 columns vs L


def test_context_captions_count_regions_and_the_files_they_are_grouped_by():
    """A context-protocol block is a region of target windows spread over several files; the
    bootstrap groups regions by their first target's file. Captions say both numbers, not
    "evaluation files" alone (which would claim the targets come from that many files)."""
    rows, blocks = [], []
    for length, gain in ((64, 0.0), (128, -0.05)):
        r, b = _rows_and_blocks({"alibi": 0.0, "rope": gain}, length=length)
        for x in r + b:
            x["protocol"] = "context"
        for record in b:
            record["blocks"]["file"] = [i // 4 for i in range(40)]  # 40 regions, 10 files
        rows += r
        blocks += b
    built = tables.build_tables(rows, blocks)
    assert (
        "40 target regions, grouped by their first target's file: 10 files, "
        "Kish effective number 10.0)" in built[0].caption()
    )
    gain = paired.build_paired_tables(built)[1]
    caption = paired.caption(gain)
    assert "40 target regions (10 files by each region's first target)" in caption
    assert len(caption.split()) <= 60, caption
    # the window protocols' blocks lie within a file: their captions count files
    window_rows, window_blocks = _rows_and_blocks({"alibi": 0.0, "rope": 0.1})
    for record in window_blocks:
        record["blocks"]["file"] = [i // 4 for i in range(40)]
    (versus,) = paired.build_paired_tables(tables.build_tables(window_rows, window_blocks))
    assert "and 10 evaluation files:" in paired.caption(versus)


def test_kish_effective_number_of_files():
    # (sum n)^2 / sum n^2 of the files' block counts
    assert stats.effective_units(np.array([0, 0, 1])) == pytest.approx(9 / 5)
    assert stats.effective_units(np.array([3, 3, 7, 7, 9, 9])) == pytest.approx(3.0)
    assert stats.effective_units(np.array([5])) == 1.0
    # the stdlib validation split: 258 blocks in 32 files weigh like 16 equal files
    sizes = _coverage_script().STDLIB_VALIDATION_BLOCKS
    units = np.repeat(np.arange(len(sizes)), sizes)
    assert (len(sizes), units.shape[0]) == (32, 258)
    assert stats.effective_units(units) == pytest.approx(258**2 / sum(n * n for n in sizes))
    assert round(stats.effective_units(units), 1) == 16.1
    # a window table's caption names it beside the number of files
    rows, blocks = _rows_and_blocks({"alibi": 0.0, "rope": 0.1})
    for record in blocks:
        record["blocks"]["file"] = [0] * 25 + [1] * 5 + list(range(2, 12))  # 12 files
    (table,) = tables.build_tables(rows, blocks)
    assert "seeds: 2; 12 files, Kish effective number 2.4)" in table.caption()


def test_key_targets_get_their_own_context_gain_over_the_key_bytes_only():
    """The key metric's grid divides the blocks' key loss by their key bytes, not by every
    target: an encoding whose key loss falls with c while its overall loss does not is seen
    gaining on the key targets alone."""
    rows, blocks = [], []
    for length, gain in ((64, 0.0), (256, -0.5)):
        r, b = _rows_and_blocks({"alibi": 0.0, "rope": 0.0}, length=length)
        for row, record in zip(r, b, strict=True):
            row["protocol"] = record["protocol"] = "context"
            key = np.full(40, 10.0)  # 10 key bytes per block, 1.5 + gain nats each for rope
            loss = key * (1.5 + (gain if row["encoding"] == "rope" else 0.0))
            record["blocks"] |= {"key_loss": list(loss), "key_bytes": list(key)}
            rows.append(row)
            value = loss.sum() / key.sum() / math.log(2)
            rows.append(row | {"metric": "key_bits_per_byte", "value": value})
        blocks += b
    built = tables.build_tables(rows, blocks)
    key_table = next(t for t in built if t.metric == "key_bits_per_byte")
    assert key_table.method == "bootstrap" and "Key targets:" in key_table.caption()
    gains = [t for t in paired.build_paired_tables(built) if t.reference_length == 64]
    by_metric = {t.metric: t for t in gains}
    column = by_metric["key_bits_per_byte"].columns[0]
    rope = by_metric["key_bits_per_byte"].get("rope", "rope", column)
    assert rope.delta == pytest.approx(-0.5 / math.log(2)) and rope.p_holm < 0.05
    assert by_metric["bits_per_byte"].get("rope", "rope", column).delta == 0.0
    assert "in bits/byte of the key targets" in paired.caption(by_metric["key_bits_per_byte"])


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
    assert "| rope (L') − rope (64) | +0.433 [" in md and "positive means longer windows hurt" in md
    assert len(paired.caption(change).split()) <= 50 and len(paired.caption(_versus).split()) <= 50


def test_an_all_zero_exact_match_keeps_its_blocks_and_its_bootstrap_interval():
    """A task nobody solved at a length is a measurement of 0 in every block: its block record
    keeps ``exact`` (zeros), so the table keeps the bootstrap over seeds and blocks instead of
    falling back to Student t; a record without the field has no grid (it was not measured)."""
    from flaxformer_lite.evaluation.blocks import BlockSums
    from flaxformer_lite.results import significance

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
        blocks.append(key | {"run": f"copy-rope-seed{seed}", "seed": seed, "blocks": record})
    grid = significance.BlockIndex(blocks).grid(rows, "exact_match")
    assert grid is not None and grid.values.shape == (2, 12) and not grid.values.any()
    unmeasured = [b | {"blocks": {k: v for k, v in record.items() if k != "exact"}} for b in blocks]
    assert significance.BlockIndex(unmeasured).grid(rows, "exact_match") is None


def test_a_table_with_some_cells_lacking_blocks_is_student_t_throughout():
    """One caption per table: when any measured cell has no block data, every cell keeps its
    Student-t interval over seeds (not a bootstrap half width under a Student-t caption)."""
    rows, blocks = _rows_and_blocks({"a": 0.0, "b": 0.1}, seeds=(0, 1, 2))
    a_only = [r for r in blocks if r["encoding"] == "a"]
    (table,) = tables.build_tables(rows, a_only)
    assert table.method == "t" and table.marks == {}
    (column,) = table.columns
    cell = table.cell("a", column)
    values = [r["value"] for r in rows if r["encoding"] == "a"]
    assert cell.half_width == pytest.approx(stats.mean_ci(values)[1])
    assert cell.low is None and "Student t, n=3" in table.caption()


def test_no_bold_for_a_best_mean_that_its_paired_test_finds_worse():
    """The best mean is taken over each row's own seeds, the test over the seeds two rows
    share. Row a: seeds 0 and 1 at +0.05 nats, seed 2 far lower (best mean); row b: seeds 0
    and 1 at 0. On the shared seeds a is significantly worse, so nothing is marked."""
    rows, blocks = _rows_and_blocks({"a": 0.05, "b": 0.0}, seeds=(0, 1))
    low_rows, low_blocks = _rows_and_blocks({"a": -0.5}, seeds=(2,))
    (table,) = tables.build_tables(rows + low_rows, blocks + low_blocks)
    (column,) = table.columns
    assert table.cell("a", column).mean < table.cell("b", column).mean
    assert significance.compare(
        table.cell("a", column).grid, table.cell("b", column).grid
    ) == pytest.approx(
        {"delta": 0.05 / math.log(2), "low": 0.072, "high": 0.072, "p": 0.0}, abs=1e-3
    )
    md = report.render_markdown(table)
    assert table.marks == {} and "| a | **" not in md and "support no column's best" in md


def _coverage_script():
    """scripts/interval_coverage.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "interval_coverage.py"
    spec = importlib.util.spec_from_file_location("interval_coverage", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_coverage_script_prints_both_methods_for_every_case(capsys):
    """scripts/interval_coverage.py (the figures in docs/design.md §7): one row per case with a
    share for the library's method and the nested bootstrap; bad sizes are refused by name."""
    script = _coverage_script()
    assert script.main(["--studies", "4", "--replicates", "20"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "--" not in r]
    data = [r for r in rows if not r.startswith("| case") and not r.startswith("| paired case")]
    assert len(data) == len(script.INTERVAL_CASES) + len(script.PAIRED_CASES)
    for r in data:
        shares = [float(x) for x in r.strip("| ").split(" | ")[-2:]]
        assert all(0.0 <= x <= 1.0 and x * 4 == round(x * 4) for x in shares)
    with pytest.raises(SystemExit):
        script.main(["--studies", "0"])
    assert "--studies must be >= 1" in capsys.readouterr().err
