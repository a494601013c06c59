"""The text of ``REPORT.md``: setup, failures, the tables of every section, the figures and
the provenance, from the rows and the section tables alone (`render_report`)."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flaxformer_lite.report import paired
from flaxformer_lite.report.figures import PlotInfo
from flaxformer_lite.report.study_tables import (
    CONFIDENCE,
    INTERVAL_NAMES,
    MAIN_METRICS,
    StudyResults,
    encoding_order,
)
from flaxformer_lite.report.table import (
    MISSING_MD,
    Cell,
    Column,
    Table,
    markdown_rows,
    md_code,
    md_escape,
    md_fence,
    md_text,
    render_markdown,
)
from flaxformer_lite.results.significance import ALPHA
from flaxformer_lite.results.stats import BOOTSTRAP_REPLICATES
from flaxformer_lite.results.store import learning_rate_tag


def _distinct(rows: Iterable[Mapping[str, Any]], key: str) -> list[Any]:
    return list(dict.fromkeys(_freeze(r.get(key)) for r in rows))


def _freeze(x: Any) -> Any:
    if isinstance(x, dict | list):
        return json.dumps(x, sort_keys=True)
    return x


def _counted(rows: Sequence[Mapping[str, Any]], keys: str | Sequence[str]) -> list:
    """Distinct values of ``keys`` (a field or a tuple of fields) with their row counts, in
    order of first appearance (dicts compare by content); rows where all are missing are
    skipped."""
    fields = (keys,) if isinstance(keys, str) else tuple(keys)
    counts: dict[Any, list[Any]] = {}
    for r in rows:
        values = tuple(r.get(k) for k in fields)
        if all(v is None for v in values):
            continue
        entry = counts.setdefault(tuple(map(_freeze, values)), [values, 0])
        entry[1] += 1
    return [(v[0] if isinstance(keys, str) else v, n) for v, n in counts.values()]


def _run_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    fields = ("study", "preset", "run", "seed", "config_hash", "git_commit", "backend", "command")
    return tuple(_freeze(row.get(k)) for k in fields)


def _runs(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per run (train/eval seconds are per run, repeated in each of its rows)."""
    runs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        run = runs.setdefault(
            _run_key(r),
            {k: r.get(k) for k in ("run", "seed", "config_hash", "git_commit", "backend")}
            | {"encodings": [], "train_seconds": 0.0, "eval_seconds": 0.0, "study": r.get("study")},
        )
        if r["encoding"] not in run["encodings"]:
            run["encodings"].append(r["encoding"])
        for k in ("train_seconds", "eval_seconds"):
            v = r.get(k)
            if isinstance(v, int | float) and math.isfinite(v):
                run[k] = max(run[k], float(v))
    return list(runs.values())


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _number_first(x: Any) -> tuple[int, Any]:
    """Sort key: numbers in numeric order, then anything else by its text."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return (0, x)
    return (1, str(x))


def _fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s:.1f} s ({s / 60:.1f} min)"


def _join(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _listing(label: str, counted: Sequence[tuple[Any, int]], fmt) -> str:
    """``- label: a; b`` with row counts when the rows disagree (`_with_counts`)."""
    return f"- {label}: {_with_counts(counted, fmt)}"


def _with_counts(counted: Sequence[tuple[Any, int]], fmt) -> str:
    """``a; b``, each value with its row count when there are several (``fmt`` returns
    Markdown: `md_escape` d or `md_code`), or ``not recorded`` for none."""
    if not counted:
        return "not recorded"
    many = len(counted) > 1
    return "; ".join(fmt(v) + (f" ({n} rows)" if many else "") for v, n in counted)


def _describe_packages(packages: Any) -> str:
    if isinstance(packages, dict):
        return md_escape(_join(f"{k} {v}" for k, v in packages.items()))
    return md_escape(packages)


def _provenance_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    commands = [c for c, _ in _counted(rows, "command")]
    if commands:
        lines += ["Command(s) that produced the rows:", "", *md_fence(commands), ""]
    lines += [
        _listing("Git commit(s)", _counted(rows, "git_commit"), md_code),
        _listing("Packages", _counted(rows, "packages"), _describe_packages),
        _listing("Python", _counted(rows, "python"), md_escape),
        _listing(
            "Backend / device",
            _counted(rows, ("backend", "device_kind", "device_count")),
            lambda v: md_escape("{} / {} × {}".format(*("?" if x is None else x for x in v))),
        ),
        _listing("Corpus", _counted(rows, "data"), _describe_data),
    ]
    full = [data for data, _ in _counted(rows, "data") if isinstance(data, dict)]
    if full:
        lines += ["", "<details><summary>Corpus provenance (as recorded in the rows)</summary>", ""]
        fenced = md_fence(json.dumps(d, indent=1, sort_keys=True) for d in full)
        lines += [fenced[0] + "json", *fenced[1:]]
        lines += ["", "</details>"]
    return lines


def _describe_data(data: Any) -> str:
    """Name, content hash, size and file count of a corpus provenance dict."""
    if not isinstance(data, dict):
        return md_escape(data)
    parts = [md_escape(data["name"])] if "name" in data else []
    if "sha256" in data:
        parts.append(f"sha256 {md_code(data['sha256'])}")
    size = data.get("num_bytes", data.get("bytes"))
    if size is not None:
        parts.append(md_escape(f"{size} bytes"))
    if data.get("num_files") is not None:
        parts.append(md_escape(f"{data['num_files']} files"))
    return ", ".join(parts) or md_code(json.dumps(data, sort_keys=True))


def _setup_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    train = math.fsum(r["train_seconds"] for r in runs)
    evaluation = math.fsum(r["eval_seconds"] for r in runs)
    encodings = encoding_order(rows)
    seeds = sorted((s for s in _distinct(rows, "seed") if s is not None), key=_number_first)
    protocols = [p for p in _distinct(rows, "protocol") if p]
    tasks = [t for t in _distinct(rows, "task") if t]
    train_lengths = sorted(n for n in _distinct(rows, "train_length") if n)
    eval_lengths = sorted(n for n in _distinct(rows, "eval_length") if n)
    stamps = sorted(t for t in _distinct(rows, "timestamp") if isinstance(t, str))
    setup = [  # every value comes from the rows (text cells are escaped when rendered)
        ("Study (preset)", _studies(rows)),
        (f"Encodings ({len(encodings)})", _join(encodings)),
        ("Seeds", _join(seeds) or MISSING_MD),
        ("Train length L", _join(train_lengths) or MISSING_MD),
        ("Evaluation lengths", _join(eval_lengths)),
        ("Protocols", _join(protocols) or MISSING_MD),
    ]
    if tasks:
        setup.append(("Tasks", _join(tasks)))
    trained, steps = _trained_steps(rows)
    rates = sorted({r["learning_rate"] for r in trained if _is_number(r.get("learning_rate"))})
    if rates:
        tags = _join(learning_rate_tag(x) for x in rates)
        setup.append((f"Peak learning rate{'s' if len(rates) > 1 else ''}", tags))
    if counts := _parameter_counts(rows):
        setup.append(("Parameters", counts))
    if steps:
        setup.append(("Training steps", _join(steps)))
    setup.append(("Overrides of the preset", Cell(markdown=_overrides_cell(rows))))
    setup.append(("Runs / rows", f"{len(runs)} / {len(rows)}"))
    wall = f"{_fmt_seconds(evaluation)} evaluation"
    if trained:
        wall = f"{_fmt_seconds(train + evaluation)} = {_fmt_seconds(train)} training + " + wall
    setup.append(("Wall time (sum over runs)", wall))
    if stamps:
        setup.append(
            ("Runs finished", stamps[0] if len(stamps) == 1 else f"{stamps[0]} … {stamps[-1]}")
        )
    return _markdown_table([("", "l"), ("", "l")], setup) + _models_lines(rows)


def _markdown_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The Markdown lines of a table of ``columns`` (header, alignment) whose cells are
    `Cell` s or texts (escaped when rendered), through the one table model."""
    cells = tuple(tuple(c if isinstance(c, Cell) else Cell(str(c)) for c in row) for row in rows)
    table = Table("", "", "", tuple(Column(h, a) for h, a in columns), cells)
    return markdown_rows(table)


def _parameter_counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """``"size: smallest–largest; ..."``: each model size's parameter counts over its
    encodings, smallest size first ("" when no row counts them)."""
    params: dict[Any, list[float]] = {}
    for r in rows:
        if _is_number(r.get("num_params")):
            params.setdefault(r.get("model_size"), []).append(r["num_params"])
    sizes = sorted(params.items(), key=lambda kv: min(kv[1]))
    return "; ".join(
        ("" if size is None else f"{size}: ")
        + "–".join(dict.fromkeys(f"{n:,.0f}" for n in (min(ns), max(ns))))
        for size, ns in sizes
    )


def _trained_steps(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[int]]:
    """``(trained, steps)``: the rows of trained (not pretrained) models and, sorted, the
    training steps their runs were configured for (their ``setting``)."""
    trained = [r for r in rows if not isinstance(r.get("pretrained"), dict)]
    settings = [r.get("setting") for r in trained]
    steps = [s.get("train.num_steps") for s in settings if isinstance(s, dict)]
    return trained, sorted({n for n in steps if isinstance(n, int) and not isinstance(n, bool)})


def _studies(rows: Sequence[Mapping[str, Any]]) -> str:
    """``study (preset), ...``: the rows' studies with their presets."""
    studies = dict.fromkeys((r.get("study"), r.get("preset")) for r in rows)
    return _join(f"{s} ({p})" if p else str(s) for s, p in studies)


def command_overrides(command: Any) -> list[str]:
    """The ``--config.*`` overrides of a recorded command line, ``["train.num_steps=200",
    ...]`` in the order typed ([] for none, or a command that does not parse): every value
    the run took from the command line instead of its preset."""
    try:
        argv = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        return []
    out = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config."):
            name, eq, value = arg.removeprefix("--config.").partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
            out.append(f"{name}={value}")
    return out


def _overrides_cell(rows: Sequence[Mapping[str, Any]]) -> str:
    """Each distinct set of command-line overrides, with its row count when they differ."""
    sets = _counted(rows, "command")
    by_set: dict[tuple[str, ...], int] = {}
    for command, n in sets:
        key = tuple(command_overrides(command))
        by_set[key] = by_set.get(key, 0) + n

    def fmt(overrides: tuple[str, ...]) -> str:
        return ", ".join(md_code(o, cell=True) for o in overrides) or "none (the preset as it is)"

    return _with_counts(list(by_set.items()), fmt)


# what a report says of models whose weights are random (the tiny test models)
RANDOM_WEIGHTS = "random weights: the numbers only show that the pipeline runs"


def _short_hash(value: Any) -> str:
    """``sha256:0123456789ab`` of a recorded ``sha256:<64 hex>`` (— when absent)."""
    if not isinstance(value, str) or not value:
        return "—"
    algorithm, _, digest = value.rpartition(":")
    return f"{algorithm or 'sha256'}:{digest[:12]}"


def _models_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pretrained models the rows evaluated (none trained): id, family, revision, weights
    and tokenizer sha256 (shortened), the weights' stored format, the training context L the
    rows' lengths are multiples of and the RoPE scalings evaluated as extra rows; each
    model's row names whether its weights are random (`RANDOM_WEIGHTS`)."""
    models = [(m, n) for m, n in _counted(rows, "pretrained") if isinstance(m, dict)]
    if not models:
        return []
    table = []
    random_weights = False
    for m, _ in models:
        note = ""
        if m.get("random_weights"):
            random_weights, note = True, " (random weights)"
        own = [r for r in rows if r.get("pretrained") == m]
        contexts = sorted({r["train_length"] for r in own if r.get("train_length")})
        scalings = [v for v, _ in _counted(own, "variant") if v != "base"]
        table.append(
            (
                m.get("model_id", "?") + note,
                m.get("family", "?"),
                m.get("revision") or "—",
                _code_cell(_short_hash(m.get("weights_sha256"))),
                _code_cell(_short_hash(m.get("tokenizer_sha256"))),
                m.get("weights_format", "?"),
                _join(contexts) or "?",
                _join(scalings) or "—",
            )
        )
    head = ["model", "family", "revision", "weights", "tokenizer", "weights format"]
    columns = [(h, "l") for h in head] + [("context", "r"), ("scalings", "l")]
    lines = ["", "Models (evaluated as published; nothing trained):", ""]
    lines += _markdown_table(columns, table)
    if random_weights:
        lines += ["", f"**{md_escape(RANDOM_WEIGHTS[0].upper() + RANDOM_WEIGHTS[1:])}.**"]
    return lines


def _runs_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    runs = _runs(rows)
    many_studies = len({r["study"] for r in runs}) > 1
    head = ["study"] if many_studies else []
    head += ["run", "seed", "encodings", "config hash", "commit", "backend"]
    columns = [(h, "l") for h in head] + [("train s", "r"), ("eval s", "r")]
    table = []
    for r in runs:  # every value comes from the rows: escaped, code spans fenced
        cells = [r["study"]] if many_studies else []
        cells += [r["run"], r["seed"], _join(r["encodings"])]
        cells += [_code_cell(r["config_hash"]), _code_cell(r["git_commit"]), r["backend"]]
        table.append([*cells, f"{r['train_seconds']:.1f}", f"{r['eval_seconds']:.1f}"])
    return _markdown_table(columns, table)


def _code_cell(value: Any) -> Cell:
    """A cell shown as a code span in Markdown."""
    return Cell(str(value), markdown=md_code(value, cell=True))


def _default_title(rows: Sequence[Mapping[str, Any]]) -> str:
    """``Results: extrapolation_lm (quick), 1000 training steps``: the studies, their presets
    and what ran (the training steps, or pretrained models)."""
    trained, steps = _trained_steps(rows)
    what = []
    if steps:
        what.append(
            f"{'–'.join(str(n) for n in dict.fromkeys((steps[0], steps[-1])))} training steps"
        )
    if len(trained) < len(rows):
        what.append("pretrained models")
    return f"Results: {_studies(rows)}" + (f", {' and '.join(what)}" if what else "")


def render_report(
    rows: Sequence[Mapping[str, Any]],
    tables: Sequence[StudyResults],
    figures: Sequence[PlotInfo],
    *,
    problems: Sequence[Any] = (),
    title: str | None = None,
    pairs: Sequence[Any] = (),
    missing: Sequence[str] = (),
    derived: Sequence[Table] = (),
    mixed: Sequence[str] = (),
    failed: Mapping[str, str] | None = None,
) -> str:
    """The text of ``REPORT.md`` (links are relative to the report's directory);
    ``missing``: lines naming a study's cells without results (merged shards), stated;
    ``derived``: the learning-rate, extrapolation-gap and cost tables;
    ``mixed``: what rows sharing a table differ in (`comparable.Verdict.report_lines`);
    ``failed``: cell -> its error line (a study's failed cells), stated. Without rows (every
    cell failed) the report is just these statements."""
    failed = failed or {}
    lines = [f"# {md_text(title or _default_title(rows))}", ""]
    lines += _intro(rows)
    lines += _section(
        "Failed cells",
        f"{len(failed)} cell(s) failed; they are not in any table (the traceback is in "
        "`runs/<cell>/error.txt`; rerun the study to retry them):",
        [f"- {md_code(name)}: {md_code(e.replace('`', chr(39)))}" for name, e in failed.items()],
    )
    lines += _section(
        "Problems",
        f"{len(problems)} results line(s) were skipped; they are not in any table:",
        ["- " + md_code(str(p).replace("`", "'")) for p in problems],
    )
    lines += _section(
        "Missing cells",
        "Cells of the merged studies without results rows (a shard not run or not "
        "finished); they are not in any table:",
        ["- " + md_text(m) for m in missing],
    )
    lines += _section(
        "Mixed rows",
        "Rows that share a table differ in these fields (the tables' captions say so too):",
        ["- " + md_code(m.replace("`", "'")) for m in mixed],
    )
    if not rows:
        return "\n".join(lines)
    lines += ["## Results", ""]
    lines += _results(tables, pairs, derived)
    lines += _plots(figures)
    lines += ["## Provenance", "", *_provenance_lines(rows), "", "### Runs", "", *_runs_table(rows)]
    return "\n".join(lines) + "\n"


def _intro(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return ["No results rows: no cell has finished, so there are no tables or plots.", ""]
    return [
        f"Generated from {len(rows)} results rows alone by "
        "`flaxformer_lite.report` (regenerate with `flaxformer-lite report "
        "RUN_DIR [RUN_DIR ...]`). Tables are also in `tables/` as LaTeX (booktabs) and CSV; "
        "figures in `plots/` as PNG and PDF.",
        "",
        "## Setup",
        "",
        *_setup_lines(rows),
        "",
        *protocols_section(rows),
    ]


# What each evaluation protocol scores, said once here instead of in every caption.
PROTOCOLS = {
    "nonoverlapping": "windows of the evaluation length tile the split without overlap; each "
    "target is scored once, with as much context as its offset in its window (0 to length - 1 "
    "tokens), so a longer window gives its first targets more context too and can lower the "
    "loss of a model that uses no distant context (the early token curse, Press et al. 2022, "
    "Appendix B).",
    "sliding": "windows of the evaluation length move by a stride; each target is scored once, "
    "from the window that gives it the most context.",
    "context": "the same target bytes in every column: each scored block of S targets is read "
    "after c bytes of context (c to c + S - 1 bytes before a target), so a column changes the "
    "context only.",
    "task": "synthetic tasks: exact match of the whole answer and per-token accuracy.",
}


def protocols_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``## Protocols and intervals``: each protocol the rows use, and the intervals and marks
    the captions name (`study.INTERVAL_NAMES`)."""
    used = [p for p in _distinct(rows, "protocol") if p in PROTOCOLS]
    lines = ["## Protocols and intervals", ""]
    lines += [f"- **{p}**: {PROTOCOLS[p]}" for p in used]
    lines += [
        f"- **{INTERVAL_NAMES['t']}**: the {CONFIDENCE:.0%} Student-t interval of the mean over "
        "seeds.",
        f"- **{INTERVAL_NAMES['files']}**: the {CONFIDENCE:.0%} interval over seeds and "
        "evaluation files: the seeds' spread plus a bootstrap of the evaluation split's files, "
        f"each with all its blocks (one draw for every seed, {BOOTSTRAP_REPLICATES} replicates, "
        "times F/(F-1) for F files), Student t with Welch-Satterthwaite degrees of freedom. With "
        "one seed it covers the evaluation data, not training noise.",
        f"- **{INTERVAL_NAMES['bootstrap']}**: the same with the blocks as units, where no file "
        "is recorded (tasks, a split of one file).",
        "- **Marks**: paired tests over the shared seeds and evaluation data, Holm-corrected "
        f"within a column, alpha = {ALPHA}: bold is best and significantly better than every "
        "other row, italic tied for best.",
        "",
    ]
    return lines


def _section(heading: str, text: str, items: Sequence[str]) -> list[str]:
    """``## heading``, a sentence and a list; nothing when there are no items."""
    return [f"## {heading}", "", text, "", *items, ""] if items else []


def _links(name: str) -> str:
    return f"[LaTeX](tables/{name}.tex) · [CSV](tables/{name}.csv) · [Markdown](tables/{name}.md)"


def _results(
    tables: Sequence[StudyResults], pairs: Sequence[Any], derived: Sequence[Table]
) -> list[str]:
    """The study tables of the main metrics, the paired differences, the derived tables and
    links to the other tables."""
    lines = []
    for t in (t for t in tables if t.metric in MAIN_METRICS):
        lines += [f"### {md_text(t.title())}", "", render_markdown(t).rstrip("\n"), ""]
        lines += [_links(t.name), ""]
    if not pairs and any(t.metric in paired.PAIRED_METRICS for t in tables):
        lines += ["### Paired differences", "", paired.NONE_NOTE, ""]
    if pairs:
        lines += ["### Paired differences", "", paired.render_markdown(pairs).rstrip("\n"), ""]
        lines += [_links("paired_differences"), ""]
    for t in derived:
        lines += [f"### {md_text(t.title)}", "", render_markdown(t).rstrip("\n"), ""]
        lines += [_links(t.name), ""] if t.files else []
    other = [t for t in tables if t.metric not in MAIN_METRICS]
    if other:
        listed = _join(f"[{md_text(t.title())}](tables/{t.name}.md)" for t in other)
        lines += [f"Other tables: {listed} (each also as `.tex` and `.csv`).", ""]
    return lines


def _plots(figures: Sequence[PlotInfo]) -> list[str]:
    lines = ["## Plots", ""] if figures else []
    for f in figures:
        lines += [f"### {md_text(f.title)}", "", f"![{md_text(f.title)}]({f.stem}.png)", ""]
        lines += [f"{md_text(f.caption)} ([PDF]({f.stem}.pdf))", ""]
    return lines
