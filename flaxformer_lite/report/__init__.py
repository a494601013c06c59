"""The report: tables, plots and ``REPORT.md`` from results rows alone.

``write_report(rows, out_dir)`` is the entry point (``flaxformer-lite report`` and the study
runner call it). It writes ``tables/*.md|.tex|.csv``, ``plots/*.png|.pdf`` and ``REPORT.md``,
which embeds the tables and plots and states the commands, commits, versions, devices,
corpus and wall time found in the rows. Output is deterministic: the same rows give
byte-identical tables and ``REPORT.md``. Rows that must not share a table (another config,
corpus or release of a package: `comparable`) are refused before anything is written, unless
merged on purpose (``allow_mixed``); the captions and REPORT.md then say what was mixed.

Every section computes its numbers and builds the one table model, `table.Table`, which the
renderers of `table` write as Markdown, LaTeX (booktabs) or CSV:

* `study`: the study tables (a metric per protocol, task, train length and model size);
* `paired`: paired differences against a reference, and each encoding's change with length;
* `sweep_report`: the learning-rate table and the extrapolation gap against model size;
* `cost`: training and evaluation cost per encoding (REPORT.md only);
* `figures` and `plots`: the figures; `document`: the text of REPORT.md; `write`: the files.

Layer: may import base and results only (rows in, files out); the study runner, its peer over
results, never imports it: the ``study`` command calls the runner, then `study_reporter`.
"""

from flaxformer_lite.report.document import render_report
from flaxformer_lite.report.study_tables import (
    CSV_FIELDS,
    StudyResults,
    build_tables,
    encoding_order,
    table_names,
)
from flaxformer_lite.report.table import (
    Cell,
    Column,
    Table,
    latex_escape,
    md_escape,
    render_csv,
    render_latex,
    render_markdown,
)
from flaxformer_lite.report.write import (
    study_reporter,
    with_notes,
    write_report,
    write_study_report,
)

__all__ = [
    "CSV_FIELDS",
    "Cell",
    "Column",
    "StudyResults",
    "Table",
    "build_tables",
    "encoding_order",
    "latex_escape",
    "md_escape",
    "render_csv",
    "render_latex",
    "render_markdown",
    "render_report",
    "study_reporter",
    "table_names",
    "with_notes",
    "write_report",
    "write_study_report",
]
