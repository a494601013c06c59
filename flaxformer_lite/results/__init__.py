"""Results rows as data (DESIGN.md §7): how a run's rows are made (`rows`), stored, read and
merged (`store`), when rows may share a table (`comparable`), and the statistics over seeds
and evaluation files (`stats`) and paired, multiplicity-corrected tests (`significance`).

Layer: may import every layer below it (base, core, nn, data, evaluation, train, pretrained);
the report and the study runner, two peers, import it.
"""
