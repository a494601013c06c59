"""Training: the run configuration, jit-compiled steps, the loop, checkpoints, metrics, sharding.

May import: `base`, `core`, `nn`, `data`, `evaluation`, `pretrained` (never the layers
above: `results`, `study`, `report`, `cli`).
`run_config.RunConfig` composes the sections every layer owns; `loop.train_and_evaluate` is
one complete, resumable run; `restore.load_trained_model` rebuilds a finished run's model.
"""
