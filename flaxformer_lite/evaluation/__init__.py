"""Evaluation: one trained model scored at many lengths, protocols and variants.

May import: `base`, `core`, `nn`, `data` (never `train`). `plan.EvalPlan` lists every
evaluation of a run, decided once from its config, each cell holding a protocol value
(`protocols`: windows with a stride, context, task); `run.evaluate_plan` executes it through
the one scoring loop (`score.score`); `step` is the jit-compiled eval step and the per-token
loss that training shares; `metrics` turns sums into reported numbers.
"""
