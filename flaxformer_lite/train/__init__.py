"""Training: run configuration, optimizer, jit-compiled steps, checkpoints, metrics, the loop.

`train_and_evaluate` lives in `flaxformer_lite.train.loop` (imported lazily here, because the
loop imports the evaluator, which imports the steps of this package).
"""

from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from flaxformer_lite.train.step import init_train_state, make_eval_step, make_train_step

__all__ = [
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "init_train_state",
    "learning_rate_schedule",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "train_and_evaluate",
]


def __getattr__(name):
    if name == "train_and_evaluate":
        from flaxformer_lite.train.loop import train_and_evaluate

        return train_and_evaluate
    raise AttributeError(f"module 'flaxformer_lite.train' has no attribute {name!r}")
