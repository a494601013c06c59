"""Experiments: study sweeps, the study runner, results rows, statistics, tables, plots, report.

May import every layer below it. `sweeps` expands a study config into cells, `runner` runs
them through `flaxformer_lite.train.loop.train_and_evaluate` and writes their results rows
(`rows`), `results` reads rows back, `tables`, `stats`, `plots` and `report` turn rows
alone into tables, figures and REPORT.md, and `cli` helps the thin scripts report bad flags.
"""
