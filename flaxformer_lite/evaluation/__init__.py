"""Evaluation: one trained model scored at many lengths, protocols and variants.

May import: `base`, `core`, `nn`, `data` (never `train`). `plan.EvalPlan` lists every
evaluation of a run, decided once from its config; `run.evaluate_plan` executes it;
`corpus` (windows of a byte split: non-overlapping and sliding protocols, per-position loss),
`tasks` (exact match on synthetic tasks) and `step` (the jit-compiled eval step and the
per-token loss that training shares) do the work; `metrics` turns sums into reported numbers.
"""
