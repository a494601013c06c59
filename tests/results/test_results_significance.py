"""Files as the sampling unit: stats.unit_weights, the F/(F-1) correction, the file-clustered
standard error against its textbook formula, and significance.Grid reading each block's file."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from flaxformer_lite.results import significance, stats


def test_unit_weights_give_every_block_of_a_file_its_files_multiplicity():
    units = np.array([0, 0, 0, 1, 2, 2, 5, 5])  # labels need not be contiguous
    w = stats.unit_weights(units, 200, seed=3)
    assert w.shape == (200, 8)
    for a, b in ((0, 1), (1, 2), (4, 5), (6, 7)):  # same file: same weight in every replicate
        np.testing.assert_array_equal(w[:, a], w[:, b])
    # each replicate draws F = 4 files: the file multiplicities sum to 4
    per_file = w[:, [0, 3, 4, 6]]
    np.testing.assert_array_equal(per_file.sum(axis=1), np.full(200, 4.0))


def test_unit_weights_with_a_label_per_block_are_the_bootstrap_of_blocks():
    rng = np.random.default_rng(7)
    want = rng.multinomial(6, np.full(6, 1 / 6), size=50).astype(np.float64)
    np.testing.assert_array_equal(stats.unit_weights(np.arange(6), 50, seed=7), want)


def _textbook_cluster_se(values: np.ndarray, counts: np.ndarray, units: np.ndarray) -> float:
    """One seed: the linearized (delta-method) standard error of a ratio of sums over F
    clusters with the F/(F-1) small-sample factor (Cochran 1977, Sampling Techniques, 6.9)."""
    files = np.unique(units)
    v = np.array([values[units == f].sum() for f in files])
    n = np.array([counts[units == f].sum() for f in files])
    ratio = v.sum() / n.sum()
    f = files.shape[0]
    resid = v - ratio * n
    return math.sqrt(f / (f - 1) * np.sum(resid**2)) / n.sum()


def test_one_seed_interval_is_the_textbook_cluster_standard_error():
    rng = np.random.default_rng(0)
    units = np.sort(np.concatenate([np.arange(30), rng.integers(0, 30, 170)]))
    file_effect = rng.normal(0, 0.6, 30)[units]
    counts = rng.integers(800, 1025, units.shape[0]).astype(np.float64)
    values = (3.0 + file_effect + rng.normal(0, 0.4, units.shape[0])) * counts
    mean, low, high = stats.bootstrap_interval(
        values[None], counts[None], units=units, replicates=20000, seed=1
    )
    se = (high - low) / 2 / stats.t_quantile(0.975, 29)  # one part: F - 1 = 29 df
    want = _textbook_cluster_se(values, counts, units)
    assert mean == pytest.approx(values.sum() / counts.sum(), rel=1e-12)
    assert se == pytest.approx(want, rel=0.04)  # 20,000 replicates: ~1 % Monte Carlo error
    # blocks as independent units understate it here (files are correlated inside)
    _, low_b, high_b = stats.bootstrap_interval(
        values[None], counts[None], replicates=20000, seed=1
    )
    assert (high_b - low_b) < 0.7 * (high - low)


def test_the_data_variance_is_corrected_by_f_over_f_minus_1():
    """Independent blocks (a file each), one seed: se^2 = F/(F-1) x the bootstrap variance
    of the mean, i.e. the unbiased s^2 / F of the block means (equal counts)."""
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 16)
    mean, low, high = stats.bootstrap_interval(x[None], np.ones((1, 16)), replicates=40000, seed=2)
    se = (high - low) / 2 / stats.t_quantile(0.975, 15)
    assert mean == pytest.approx(x.mean())
    assert se == pytest.approx(np.std(x, ddof=1) / 4, rel=0.02)


def test_paired_difference_resamples_files_for_both_rows():
    rng = np.random.default_rng(2)
    units = np.repeat(np.arange(12), 5)
    shared = rng.normal(0, 1, 60)
    a = shared + rng.normal(0, 0.3, 12)[units] + rng.normal(0, 0.05, (3, 60))
    b = shared + rng.normal(0, 0.05, (3, 60))
    ones = np.ones_like(a)
    by_file = stats.paired_difference(a, ones, b, ones, units=units, replicates=4000)
    by_block = stats.paired_difference(a, ones, b, ones, replicates=4000)
    assert by_file["delta"] == pytest.approx(by_block["delta"])
    assert by_file["high"] - by_file["low"] > 1.5 * (by_block["high"] - by_block["low"])
    with pytest.raises(ValueError, match=r"units must give one label per block: shape \(60,\)"):
        stats.paired_difference(a, ones, b, ones, units=units[:-1])


def _records(files, seeds=(0, 1), blocks=12):
    key = dict(study="s", positional="rope", protocol="nonoverlapping", train_length=8)
    key |= dict(eval_length=8, encoding="rope", task=None)
    rows, records = [], []
    for seed in seeds:
        run = dict(run=f"rope-seed{seed}", seed=seed)
        rows.append(key | run | {"value": 1.0})
        record = {"size": 4, "unit": "t", "loss": [1.0 + seed] * blocks, "count": [4.0] * blocks}
        if files is not None:
            record["file"] = files[seed] if isinstance(files, dict) else files
        records.append(key | run | {"blocks": record})
    return rows, records


def test_grid_reads_the_file_of_each_block():
    files = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4]
    rows, records = _records(files)
    grid = significance.BlockIndex(records).grid(rows, "bits_per_byte")
    np.testing.assert_array_equal(grid.units, files)
    assert (grid.unit_name, grid.num_units) == ("files", 5)


@pytest.mark.parametrize(
    "files",
    [None, [0] * 12, {0: list(range(12)), 1: [0] * 6 + [1] * 6}],
    ids=["no file recorded", "one file", "seeds disagree"],
)
def test_grid_falls_back_to_blocks_as_units(files):
    rows, records = _records(files)
    grid = significance.BlockIndex(records).grid(rows, "bits_per_byte")
    assert grid.units is None and grid.unit_name == "blocks" and grid.num_units == 12


def test_cells_with_different_files_are_refused_saying_why():
    rows_a, rec_a = _records([0] * 6 + [1] * 6)
    rows_b, rec_b = _records([0] * 4 + [1] * 8)
    a = significance.BlockIndex(rec_a).grid(rows_a, "bits_per_byte")
    b = significance.BlockIndex(rec_b).grid(rows_b, "bits_per_byte")
    assert significance.compare(a, a) is not None
    with pytest.raises(significance.PairingError, match="blocks lie in different files"):
        significance.compare(a, b)


def test_cells_with_different_blocks_are_refused_and_without_a_common_seed_not_paired():
    a = significance.Grid((0,), np.ones((1, 12)), np.ones((1, 12)), 1024, "bytes")
    with pytest.raises(significance.PairingError, match="12 vs 11 scored blocks of 1024"):
        significance.compare(a, dataclasses.replace(a, values=a.values[:, :11]))
    with pytest.raises(significance.PairingError, match="blocks of 1024 vs 512 bytes"):
        significance.compare(a, dataclasses.replace(a, block_size=512))
    assert significance.compare(a, dataclasses.replace(a, seeds=(1,))) is None
