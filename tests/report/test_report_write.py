"""Report side of the study: Student-t CIs, table rendering, merging rows, bad lines, REPORT.md.

Pure Python + matplotlib; no model is built. Expected numbers are worked by hand: e.g. two
seeds with values 2.0 and 2.2 have mean 2.1, s = 0.1414 and half width
t_{0.975,1} * s / sqrt(2) = 12.706 * 0.1 = 1.271.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flaxformer_lite import report
from flaxformer_lite.report import figures, paired, plots
from flaxformer_lite.results import significance, stats, store

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- stats


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042), (100, 1.984)],
)
def test_t_quantile_matches_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("df", [1e6, 1e12, math.inf])
def test_t_quantile_large_df_is_normal(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(1.959964, abs=1e-5)


def test_t_quantile_other_levels_and_symmetry():
    assert stats.t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)  # one-sided 95%
    assert stats.t_quantile(0.995, 1) == pytest.approx(63.657, abs=5e-3)
    assert stats.t_quantile(0.025, 4) == pytest.approx(-stats.t_quantile(0.975, 4))
    assert stats.t_quantile(0.5, 7) == 0.0
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="p="):
            stats.t_quantile(bad, 3)
    with pytest.raises(ValueError, match="df="):
        stats.t_quantile(0.9, 0)


@pytest.mark.parametrize("t", [-3.0, -0.5, 0.0, 0.7, 4.0])
def test_t_cdf_closed_forms(t):
    # df = 1 is the Cauchy distribution; df = 2 has CDF 1/2 + t / (2 sqrt(2 + t^2)).
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize("x", [0.05, 0.3, 0.5, 0.8, 0.99])
def test_betainc_closed_forms(x):
    assert stats.betainc(1.0, 1.0, x) == pytest.approx(x, abs=1e-13)
    assert stats.betainc(3.0, 1.0, x) == pytest.approx(x**3, abs=1e-13)
    assert stats.betainc(1.0, 4.0, x) == pytest.approx(1 - (1 - x) ** 4, abs=1e-13)
    assert stats.betainc(2.5, 0.5, x) + stats.betainc(0.5, 2.5, 1 - x) == pytest.approx(1.0)


def test_mean_ci_hand_worked():
    # [1, 2, 3, 4]: mean 2.5, s = sqrt(5/3) = 1.291, half width t_{0.975,3} s / 2 = 2.054.
    mean, half, n = stats.mean_ci([1, 2, 3, 4])
    assert (mean, n) == (2.5, 4)
    assert half == pytest.approx(3.182446 * math.sqrt(5 / 3) / 2, rel=1e-6)
    assert half == pytest.approx(2.054, abs=5e-4)
    _, half90, _ = stats.mean_ci([1, 2, 3, 4], confidence=0.90)
    assert half90 == pytest.approx(2.353363 * math.sqrt(5 / 3) / 2, rel=1e-6)
    assert stats.mean_ci([3.5]) == (3.5, None, 1)
    with pytest.raises(ValueError, match="at least one"):
        stats.mean_ci([])


# ----------------------------------------------------------------------------- tables


def _row(encoding, seed, eval_length, value, metric="bits_per_byte", **extra):
    return {
        "study": "s",
        "preset": "tiny",
        "run": f"{encoding.split('+')[0]}-seed{seed}",
        "encoding": encoding,
        "seed": seed,
        "train_length": 64,
        "eval_length": eval_length,
        "protocol": "nonoverlapping",
        "stride": eval_length,
        "task": None,
        "metric": metric,
        "value": value,
        **extra,
    }


# 2 encodings x 2 seeds x 2 lengths. rope: 64 -> [2.0, 2.2], 128 -> [3.0, 3.4];
# alibi: 64 -> [2.5, 2.5], 128 -> [2.6, 2.8]. Half widths: 12.706 * |a - b| / 2.
TWO_SEEDS = [
    _row("rope", 0, 64, 2.0),
    _row("rope", 0, 128, 3.0),
    _row("alibi", 0, 64, 2.5),
    _row("alibi", 0, 128, 2.6),
    _row("rope", 1, 64, 2.2),
    _row("rope", 1, 128, 3.4),
    _row("alibi", 1, 64, 2.5),
    _row("alibi", 1, 128, 2.8),
]
CAPTION = (
    "Bits per byte (bits/byte), lower is better. Study s; protocol nonoverlapping; train length "
    "L = 64; columns: evaluation length in multiples of L (tokens)."
)


def test_markdown_table_two_seeds():
    (table,) = report.build_tables(TWO_SEEDS)
    assert table.name == "bits_per_byte_nonoverlapping"
    assert report.render_markdown(table) == (
        f"**Bits per byte — nonoverlapping.** {CAPTION} Mean ± 95% interval over seeds "
        "(t\\_seeds: Student t, n=2). Nothing is marked: no per-block data to test differences "
        "with.\n"
        "\n"
        "| encoding | 1× (64) | 2× (128) |\n"
        "|:--|--:|--:|\n"
        "| rope | 2.100 ± 1.271 | 3.200 ± 2.541 |\n"
        "| alibi | 2.500 ± 0.000 | 2.700 ± 1.271 |\n"
    )


def test_latex_table_two_seeds():
    (table,) = report.build_tables(TWO_SEEDS)
    tex_caption = CAPTION.replace("_", r"\_")
    assert report.render_latex(table) == (
        "% bits_per_byte_nonoverlapping: generated by flaxformer_lite.report from "
        "results rows.\n"
        "% Requires \\usepackage{booktabs}.\n"
        "\\begin{table}[htbp]\n"
        "\\centering\n"
        f"\\caption{{{tex_caption} Mean $\\pm$ 95\\% interval over seeds (t\\_seeds: Student t, "
        "n=2). "
        "Nothing is marked: no per-block data to test differences with.}\n"
        "\\label{tab:bits_per_byte_nonoverlapping}\n"
        "\\begin{tabular}{lrr}\n"
        "\\toprule\n"
        "Encoding & $1\\times$ (64) & $2\\times$ (128) \\\\\n"
        "\\midrule\n"
        "rope & 2.100 $\\pm$ 1.271 & 3.200 $\\pm$ 2.541 \\\\\n"
        "alibi & 2.500 $\\pm$ 0.000 & 2.700 $\\pm$ 1.271 \\\\\n"
        "\\bottomrule\n"
        "\\end{tabular}\n"
        "\\end{table}\n"
    )


def _parse_csv(text):
    return list(csv.reader(io.StringIO(text)))


def test_csv_table_two_seeds():
    (table,) = report.build_tables(TWO_SEEDS)
    lines = _parse_csv(report.render_csv(table))
    assert lines[0] == list(report.CSV_FIELDS)
    t = 12.706204736
    expected = [  # encoding, eval_length, eval_multiple, mean, ci_half_width, n
        ("rope", "64", "1", 2.1, t * 0.1, "2"),
        ("rope", "128", "2", 3.2, t * 0.2, "2"),
        ("alibi", "64", "1", 2.5, 0.0, "2"),
        ("alibi", "128", "2", 2.7, t * 0.1, "2"),
    ]
    assert len(lines) == 1 + len(expected)
    for line, (enc, length, multiple, mean, half, n) in zip(lines[1:], expected, strict=True):
        fields = dict(zip(lines[0], line, strict=True))
        assert fields["table"] == "bits_per_byte_nonoverlapping"
        assert (fields["study"], fields["metric"], fields["protocol"]) == (
            "s",
            "bits_per_byte",
            "nonoverlapping",
        )
        assert (fields["task"], fields["train_length"], fields["bucket"]) == ("", "64", "")
        assert (fields["encoding"], fields["eval_length"], fields["eval_multiple"]) == (
            enc,
            length,
            multiple,
        )
        assert float(fields["mean"]) == pytest.approx(mean, rel=1e-12)
        assert float(fields["ci_half_width"]) == pytest.approx(half, rel=1e-8, abs=1e-12)
        assert fields["n"] == n
        assert "±" not in ",".join(line)


ONE_SEED = [_row("rope", 0, 64, 2.0), _row("rope", 0, 128, 3.0), _row("alibi", 0, 64, 2.5)]


def test_tables_one_seed_and_a_missing_cell():
    (table,) = report.build_tables(ONE_SEED)
    note = (
        "One seed per cell (n=1: no interval). "
        "Nothing is marked: no per-block data to test differences with."
    )
    assert report.render_markdown(table) == (
        f"**Bits per byte — nonoverlapping.** {CAPTION} {note} —: not measured.\n"
        "\n"
        "| encoding | 1× (64) | 2× (128) |\n"
        "|:--|--:|--:|\n"
        "| rope | 2.000 | 3.000 |\n"
        "| alibi | 2.500 | — |\n"
    )
    tex = report.render_latex(table)
    assert f"{note} ---: not measured.}}\n" in tex
    assert "rope & 2.000 & 3.000 \\\\\nalibi & 2.500 & --- \\\\\n" in tex
    head = ["bits_per_byte_nonoverlapping", "s", "bits_per_byte", "nonoverlapping", "", "64"]
    assert _parse_csv(report.render_csv(table))[1:] == [
        [*head, "rope", "64", "1", "", "2.0", "", "", "", "", "", "1", ""],
        [*head, "rope", "128", "2", "", "3.0", "", "", "", "", "", "1", ""],
        [*head, "alibi", "64", "1", "", "2.5", "", "", "", "", "", "1", ""],
        [
            *head,
            "alibi",
            "128",
            "2",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            "0",
            "",
        ],  # not measured: n = 0, no numbers
    ]


def test_mixed_n_marks_single_seed_cells():
    (table,) = report.build_tables([*ONE_SEED, _row("rope", 1, 64, 2.2)])
    md = report.render_markdown(table)
    assert "n=1–2 per cell; see CSV). Cells marked (n=1) have no interval." in md
    assert "| rope | 2.100 ± 1.271 | 3.000 (n=1) |\n| alibi | 2.500 (n=1) | — |\n" in md


def test_higher_is_better_for_exact_match_and_tasks_get_own_tables():
    rows = [
        _row(e, s, n, v, metric="exact_match", protocol="task", task=task, stride=None)
        for task in ("copy", "reverse")
        for s in (0, 1)
        for e, n, v in (("rope", 64, 0.9), ("alibi", 64, 0.8), ("rope", 128, 0.1))
    ]
    tables = report.build_tables(rows)
    assert [t.name for t in tables] == ["exact_match_copy", "exact_match_reverse"]
    md = report.render_markdown(tables[0])
    assert "| rope | 0.900 ± 0.000 | 0.100 ± 0.000 |" in md  # no blocks: nothing marked
    assert "| alibi | 0.800 ± 0.000 | — |" in md


def test_bucket_table_uses_longest_length_and_sorts_buckets():
    rows = [
        _row(e, 0, n, v, metric="bucket_loss", bucket=b)
        for e in ("rope", "alibi")
        for n, b, v in (
            (128, "[0,64)", 9.0),
            (256, "[128,256)", 3.0 if e == "rope" else 2.0),
            (256, "[0,64)", 1.0),
            (256, "[64,128)", 1.5),
        )
    ]
    (table,) = report.build_tables(rows)
    assert table.eval_length == 256
    assert [c.label() for c in table.columns] == ["[0,64)", "[64,128)", "[128,256)"]
    md = report.render_markdown(table)
    assert "| rope | 1.000 | 1.500 | 3.000 |" in md  # buckets have no blocks: no marks
    assert "| alibi | 1.000 | 1.500 | 2.000 |" in md
    assert "Encoding & {[}0,64) & {[}64,128) & {[}128,256) \\\\" in report.render_latex(table)


def _labelled(label, positional, variant="base", randomized=False):
    return {
        "encoding": label,
        "positional": positional,
        "variant": variant,
        "randomized_positions": randomized,
    }


def test_encoding_order_puts_variants_after_their_base():
    rows = [
        _labelled("sinusoidal", "sinusoidal"),
        _labelled("rope+pi", "rope", "pi"),  # a variant seen before its base ...
        _labelled("alibi", "alibi"),
        _labelled("rope", "rope"),  # ... sits after the base, where the base first appears
        _labelled("alibi+randomized", "alibi", randomized=True),
        _labelled("x+y", "x+y"),  # a "+" in a name is not parsed: its own encoding
        _labelled("rope+yarn", "rope", "yarn"),
        _labelled("rope", "rope"),
    ]
    assert report.encoding_order(rows) == [
        "sinusoidal",
        "alibi",
        "alibi+randomized",
        "rope",
        "rope+pi",
        "rope+yarn",
        "x+y",
    ]
    # a variant whose base is absent keeps the group's first place
    only_variants = [_labelled("alibi", "alibi"), _labelled("rope+pi", "rope", "pi")]
    assert report.encoding_order(only_variants) == ["alibi", "rope+pi"]


def test_encoding_order_of_rows_without_label_fields_is_first_appearance():
    rows = [{"encoding": e} for e in ("rope+pi", "alibi", "rope", "rope+pi")]
    assert report.encoding_order(rows) == ["rope+pi", "alibi", "rope"]


def test_latex_escape():
    assert report.latex_escape("a_b 50% ± & #1 ~") == (r"a\_b 50\% $\pm$ \& \#1 \textasciitilde{}")


# A run name / label with a newline, emphasis, code, HTML, a cell separator, a link, math:
# unescaped, each would break a Markdown table or render as markup.
EVIL = "a*b*\n`x` <b>bold</b> | _y_ [l](http://e) $m$ &amp;"
EVIL_MD = "a\\*b\\* \\`x\\` &lt;b&gt;bold&lt;/b&gt; \\| \\_y\\_ \\[l\\](http://e) \\$m\\$ &amp;amp;"


def _cells(line: str) -> int:
    """Cells of a Markdown table line: its unescaped pipes minus one."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def _tables_ok(text: str) -> None:
    """Every Markdown table in ``text`` keeps its shape: each line has its header's cells."""
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        header = _cells(line) if header is None else header
        assert _cells(line) == header, line


def test_markdown_escapes_markup_and_newlines_in_labels_and_names(tmp_path):
    assert report.md_escape(EVIL) == EVIL_MD
    rows = [
        _row(enc, seed, n, 2.0 + seed + n / 64, run=f"{enc}-seed{seed}", study="s\n*t*")
        for enc in (EVIL, "rope")
        for seed in (0, 1)
        for n in (64, 128)
    ]
    (table,) = report.build_tables(rows)
    md = report.render_markdown(table)
    assert f"| {EVIL_MD} | 3.500 ± 6.353 | 4.500 ± 6.353 |\n" in md
    assert "<b>" not in md and "*t*" not in md and "s \\*t\\*" in md
    assert len(md.splitlines()) == 6  # caption, blank, header, rule, two rows
    _tables_ok(md)
    text = report.write_report(rows, tmp_path).read_text()
    assert "<b>" not in text and EVIL not in text
    assert f"| Encodings (2) | {EVIL_MD}, rope |" in text  # the setup table
    assert f"| {EVIL_MD}-seed0 | 0 | {EVIL_MD} |" in text  # the runs table
    _tables_ok(text)
    assert report.latex_escape(EVIL) in report.render_latex(table)  # as LaTeX already was


def test_paired_markdown_escapes_labels():
    column = report.build_tables(TWO_SEEDS)[0].columns[0]
    pair = significance.Pair(EVIL, "rope", column.key, -0.1, -0.2, 0.0, 0.01, 0.02, 2, 16)
    table = paired.Comparisons(
        "T", "bits_per_byte", "s", "nonoverlapping", None, 64, (column,), (pair,)
    )
    md = paired.render_markdown([table])
    assert f"| {EVIL_MD} − rope | -0.100 [-0.200, +0.000] p=0.02* |" in md
    assert "<b>" not in md
    _tables_ok(md)


# ----------------------------------------------------------------------------- loading rows


def _write_jsonl(path: Path, rows, *, extra_lines=()) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (path / "results.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_merge_two_run_dirs_drops_duplicates_keeps_distinct(tmp_path):
    a = _write_jsonl(tmp_path / "a", TWO_SEEDS[:3])
    b = _write_jsonl(tmp_path / "b", [TWO_SEEDS[1], *TWO_SEEDS[3:]])
    rows = store.load_rows([a, b])
    assert rows == [*TWO_SEEDS[:3], *TWO_SEEDS[3:]]
    assert store.load_rows([b, a]) == [TWO_SEEDS[1], *TWO_SEEDS[3:], *TWO_SEEDS[0:3:2]]
    # the same file twice is harmless; a single results.jsonl path works too
    assert store.load_rows([a, a / "results.jsonl"]) == TWO_SEEDS[:3]
    (table,) = report.build_tables(rows)
    assert table.cell("rope", table.columns[0]).n == 2


def test_two_rows_of_one_seed_are_an_error_naming_the_key_and_files(tmp_path):
    """A duplicate row of one seed (same run, seed, length, protocol, metric, label) is an
    error naming the key and both places, never averaged as two seeds ("5.914 ± 6.353"),
    whether the rows are in one file or come from two run dirs."""
    a = _write_jsonl(tmp_path / "a", TWO_SEEDS[:3])
    rerun = dict(TWO_SEEDS[0], value=9.9, backend="gpu")  # same measurement, other contents
    b = _write_jsonl(tmp_path / "b", [TWO_SEEDS[1], rerun])
    with pytest.raises(store.DuplicateRowsError) as error:
        store.load_rows([a, b])
    message = str(error.value)
    assert "run='rope-seed0' seed=0 encoding='rope' eval_length=64" in message
    assert "protocol='nonoverlapping' metric='bits_per_byte'" in message
    assert f"{a / 'results.jsonl'}:1 and {b / 'results.jsonl'}:2" in message
    assert "not averaged" in message and "\n" not in message
    one = _write_jsonl(tmp_path / "one", [*TWO_SEEDS, dict(TWO_SEEDS[4], value=7.0)])
    with pytest.raises(store.DuplicateRowsError, match=r"results\.jsonl:5 and .*:9"):
        store.load_rows(one)
    # other buckets, lengths, metrics, seeds or runs are different measurements
    distinct = [
        dict(TWO_SEEDS[0], metric="bucket_loss", bucket="[0,64)"),
        dict(TWO_SEEDS[0], metric="bucket_loss", bucket="[64,128)"),
        dict(TWO_SEEDS[0], run="rope-other"),
    ]
    assert len(store.load_rows(_write_jsonl(tmp_path / "ok", [*TWO_SEEDS, *distinct]))) == 11
    # make_report: one line, non-zero exit, nothing written
    proc = subprocess.run(
        [sys.executable, "scripts/make_report.py", str(a), str(b)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: duplicate results rows for") and "rope-seed0" in lines[0]
    assert not (a / "REPORT.md").exists()


def test_corrupted_line_is_reported_with_line_number_and_skipped(tmp_path):
    torn = json.dumps(TWO_SEEDS[2])[:25]
    run = _write_jsonl(tmp_path / "run", TWO_SEEDS[:2], extra_lines=[torn, "", "[1, 2]"])
    with (run / "results.jsonl").open("a") as f:
        f.write(json.dumps(TWO_SEEDS[3]) + "\n" + json.dumps(TWO_SEEDS[3]) + "\n")
    with pytest.warns(store.ResultsWarning) as record:
        rows, problems = store.load_rows(run, return_problems=True)
    assert [str(w.message) for w in record] == [str(p) for p in problems]
    assert "results.jsonl:3: skipped: not valid JSON" in str(record[0].message)
    assert rows == [TWO_SEEDS[0], TWO_SEEDS[1], TWO_SEEDS[3]]
    assert [(p.line, p.path) for p in problems] == [
        (3, str(run / "results.jsonl")),
        (5, str(run / "results.jsonl")),
        (7, str(run / "results.jsonl")),
    ]
    assert "expected a JSON object" in problems[1].message
    assert "exact duplicate of line 6" in problems[2].message
    out = report.write_report(rows, tmp_path / "report", problems=problems)
    text = out.read_text()
    assert "3 results line(s) were skipped" in text
    # outside the report's directory: named by its last part (the warning gives the path)
    assert ".../results.jsonl:3: skipped: not valid JSON" in text
    assert str(tmp_path) not in text


def test_invalid_rows_are_problems_not_crashes(tmp_path):
    bad = [
        {"encoding": "rope", "metric": "bits_per_byte", "eval_length": 64},
        _row("rope", 0, 64, "2.0"),
        _row("rope", 0, 0, 2.0),
        _row("rope", 0, 64, [1.0, None, "x"], metric="loss_by_position"),
        _row("rope", 0, 64, 2.0, metric="bucket_loss"),
    ]
    run = _write_jsonl(tmp_path / "run", [*bad, TWO_SEEDS[0]])
    rows, problems = store.load_rows(run, return_problems=True, warn=False)
    assert rows == [TWO_SEEDS[0]]
    assert [p.line for p in problems] == [1, 2, 3, 4, 5]
    assert "missing field(s) ['value']" in problems[0].message
    assert "'eval_length' must be a positive integer" in problems[2].message


def test_missing_results_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results file"):
        store.load_rows(tmp_path)


# ----------------------------------------------------------------------------- REPORT.md


def _study_rows():
    """Two commits, 3 seeds, a RoPE scaling row, buckets, per-position curves and a task."""
    rows = []
    for seed in range(3):
        for enc in ("sinusoidal", "rope", "alibi", "rope+pi"):
            commit = "aaaa111" if seed < 2 else "bbbb222"
            positional, _, variant = enc.partition("+")
            common = {
                "positional": positional,
                "variant": variant or "base",
                "randomized_positions": False,
                "config_hash": f"h-{positional}-{seed}",
                "git_commit": commit,
                "packages": {"jax": "0.10.2", "flax": "0.12.8"},
                "python": "3.11.2",
                "backend": "cpu",
                "device_kind": "cpu",
                "device_count": 1,
                "data": {"name": "stdlib", "sha256": "feedface", "bytes": 4096},
                "train_seconds": 10.0 + seed,
                "eval_seconds": 2.0,
                "command": f"python scripts/run_study.py --workdir=runs/{commit}",
                "timestamp": f"2025-01-0{seed + 1}T00:00:00+00:00",
            }
            for n in (64, 128, 256):
                v = 2.5 + seed * 0.01 + (0.2 * math.log2(n // 64) if enc != "alibi" else 0.0)
                rows.append(_row(enc, seed, n, v, **common))
                rows.append(_row(enc, seed, n, v * math.log(2), metric="loss", **common))
                rows.append(_row(enc, seed, n, 0.4, metric="accuracy", **common))
                edges = [(0, 64), (64, 128), (128, 256)]
                for lo, hi in (e for e in edges if e[1] <= n):
                    bucket = f"[{lo},{hi})"
                    rows.append(
                        _row(enc, seed, n, v + lo / 256, metric="bucket_loss", bucket=bucket)
                        | common
                    )
                curve = [1.7 + 0.001 * t if t % 10 else None for t in range(n)]
                rows.append(_row(enc, seed, n, curve, metric="loss_by_position", **common))
            for n in (32, 64):
                rows.append(
                    _row(enc, seed, n, 1.0 - n / 128, metric="exact_match", **common)
                    | {"protocol": "task", "task": "copy", "train_length": 32, "stride": None}
                )
    return rows


def test_write_report_files_and_determinism(tmp_path):
    rows = _study_rows()
    first = report.write_report(rows, tmp_path / "one")
    report.write_report(list(rows), tmp_path / "two")
    assert first == tmp_path / "one" / "REPORT.md"
    names = sorted(p.name for p in (tmp_path / "one" / "tables").iterdir())
    stems = [
        "accuracy_nonoverlapping",
        "bits_per_byte_nonoverlapping",
        "bucket_loss_nonoverlapping",
        "exact_match_copy",
        "loss_nonoverlapping",
    ]
    assert names == sorted(f"{s}.{ext}" for s in stems for ext in ("csv", "md", "tex"))
    for sub in ("tables", ".", "plots"):  # plots too: no version or date in the metadata
        for path in sorted((tmp_path / "one" / sub).glob("*.*")):
            other = tmp_path / "two" / sub / path.name
            assert path.read_bytes() == other.read_bytes(), path.name
    plot_files = sorted(p.name for p in (tmp_path / "one" / "plots").iterdir())
    assert plot_files == sorted(
        f"{s}.{ext}"
        for s in (
            "bits_per_byte_nonoverlapping_vs_length",
            "loss_by_position_nonoverlapping",
            "exact_match_tasks",
        )
        for ext in ("png", "pdf")
    )
    for name in plot_files:
        data = (tmp_path / "one" / "plots" / name).read_bytes()
        assert len(data) > 5000
        assert data.startswith(b"\x89PNG" if name.endswith(".png") else b"%PDF")

    text = first.read_text()
    # the per-position plot in the tables' unit, the protocols and intervals defined once (so
    # captions stay short), the command that regenerates the report
    assert "Bits per byte at each position of the length-256 windows" in text
    assert "## Protocols and intervals" in text and "- **nonoverlapping**: windows" in text
    assert "- **t_seeds**:" in text and "- **t_seeds_bootstrap_blocks**:" in text
    assert "`flaxformer-lite report RUN_DIR [RUN_DIR ...]`" in text
    assert "make_report.py" not in text
    captions = [t.caption() for t in report.build_tables(rows)]
    captions += [f.caption for f in figures.make_plots(rows, report.build_tables(rows), tmp_path)]
    assert max(len(c.split()) for c in captions) <= 50, max(captions, key=len)
    csv_text = (tmp_path / "one" / "tables" / "bits_per_byte_nonoverlapping.csv").read_text()
    assert {
        line.split(",")[csv_text.splitlines()[0].split(",").index("interval")]
        for line in csv_text.splitlines()[1:]
    } == {"t_seeds"}
    for link in (
        "](plots/bits_per_byte_nonoverlapping_vs_length.png)",
        "](plots/loss_by_position_nonoverlapping.png)",
        "](plots/exact_match_tasks.png)",
        "(plots/exact_match_tasks.pdf)",
        "](tables/bits_per_byte_nonoverlapping.tex)",
        "[Loss — nonoverlapping](tables/loss_nonoverlapping.md)",
    ):
        assert link in text
    # the embedded table is the table file; rope+pi comes right after rope
    md = (tmp_path / "one" / "tables" / "bits_per_byte_nonoverlapping.md").read_text()
    assert md in text
    assert md.index("| rope |") < md.index("| rope+pi |") < md.index("| alibi |")
    assert "python scripts/run_study.py --workdir=runs/aaaa111\n" in text
    assert "python scripts/run_study.py --workdir=runs/bbbb222\n" in text
    assert "- Git commit(s): `aaaa111` (160 rows); `bbbb222` (80 rows)" in text
    assert "- Packages: jax 0.10.2, flax 0.12.8" in text
    assert "- Backend / device: cpu / cpu × 1" in text
    assert "- Corpus: stdlib, sha256 `feedface`, 4096 bytes" in text
    assert '"sha256": "feedface"' in text  # the full record, in a <details> block
    assert "| Seeds | 0, 1, 2 |" in text
    # per run (rope+pi rows belong to the rope runs): 3 x (10 + 11 + 12) train, 9 x 2 eval
    assert "| Wall time (sum over runs) | 117.0 s = 99.0 s training + 18.0 s evaluation |" in text
    assert "### Cost per encoding" in text  # in REPORT.md only: not results (test_sweep_report)
    assert "moving average over L/8 = 8 positions" in text
    assert "## Problems" not in text


def test_report_of_single_seed_says_no_interval(tmp_path):
    path = report.write_report(ONE_SEED, tmp_path, title="Tiny")
    text = path.read_text()
    assert text.startswith("# Tiny\n")
    assert "One seed per cell (n=1: no interval)." in text
    assert "One seed (n=1): no bands." in text
    assert "- Git commit(s): not recorded" in text
    with pytest.raises(ValueError, match="at least one results row"):
        report.write_report([], tmp_path)


def test_many_encodings_get_distinct_styles():
    names = [f"enc{i}" for i in range(15)]
    styles = plots.encoding_styles(names)
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == 15
    assert len({s["color"] for s in styles.values()}) == 15


def test_mean_curve_and_moving_average():
    curve = plots.mean_curve([[1.0, None, 3.0], [3.0, 2.0]])
    np.testing.assert_allclose(curve, [2.0, 2.0, 3.0])
    smooth = plots.moving_average(np.array([0.0, 3.0, np.nan, 6.0, 9.0]), 3)
    np.testing.assert_allclose(smooth, [1.5, 1.5, 4.5, 7.5, 7.5])
    np.testing.assert_array_equal(plots.moving_average(np.array([1.0, 2.0]), 1), [1.0, 2.0])


# ----------------------------------------------------------------------------- script


def test_make_report_script(tmp_path):
    run = _write_jsonl(tmp_path / "run", ONE_SEED, extra_lines=['{"torn'])
    out = tmp_path / "out"
    script = str(REPO / "scripts" / "make_report.py")
    done = subprocess.run(
        [sys.executable, script, str(run), f"--out={out}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"report: {out / 'REPORT.md'}" in done.stdout
    assert "| rope | 2.000 | 3.000 |" in done.stdout
    assert "results.jsonl:4: skipped: not valid JSON" in done.stderr
    assert (out / "tables" / "bits_per_byte_nonoverlapping.tex").exists()

    empty = _write_jsonl(tmp_path / "empty", [])
    done = subprocess.run(
        [sys.executable, script, str(empty)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "error: no results rows" in done.stderr
    assert not (empty / "REPORT.md").exists()


def test_not_applicable_cells_read_n_a_never_a_number(tmp_path):
    """A learned table has no row past L: its cells there are "n/a" with the reason, in
    Markdown, LaTeX and CSV (their part in the marks: test_stats_paired)."""
    na = "no position embedding past 64 (the table has 64 rows)"
    rows = (
        [_row("learned", s, 64, 2.0 + s / 10) for s in range(2)]
        + [_row("learned", s, 128, None, na=na) for s in range(2)]
        + [_row("alibi", s, n, 2.5 + s / 10) for s in range(2) for n in (64, 128)]
    )
    (path := tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded, problems = store.load_rows(path, return_problems=True)
    assert problems == [] and len(loaded) == len(rows)  # a None value with a reason is valid
    (table,) = report.build_tables(loaded)
    md = report.render_markdown(table)
    assert "| learned | 2.050 ± 0.635 | n/a |" in md
    assert "| alibi | 2.550 ± 0.635 | 2.550 ± 0.635 |" in md
    assert f"n/a: {na}." in md
    assert " & n/a \\\\" in report.render_latex(table)
    csv_rows = list(csv.DictReader(io.StringIO(report.render_csv(table))))
    cell = next(r for r in csv_rows if r["encoding"] == "learned" and r["eval_length"] == "128")
    assert (cell["mean"], cell["n"], cell["note"]) == ("", "0", f"n/a: {na}")
    bad = _row("learned", 0, 256, None)  # None without a reason is still refused
    (path2 := tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    assert store.load_rows(path2, return_problems=True, warn=False)[0] == []
