"""Studies: a study config's sweep expanded into cells (`sweeps`), and the resumable runner that
trains and evaluates every cell and writes its results rows (`runner`).

Layer: may import every layer below it and `results`; never the report (the ``study`` command,
`flaxformer_lite.cli.pipeline`, calls the runner, then the report).
"""
