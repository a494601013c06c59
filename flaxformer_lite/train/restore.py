"""Loading a trained run: its model with the weights of its newest readable checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from flax import nnx

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train.checkpoint import Checkpointer
from flaxformer_lite.train.loop import build_model
from flaxformer_lite.train.optim import make_optimizer
from flaxformer_lite.train.run_config import RunConfig
from flaxformer_lite.train.step import init_train_state


def load_trained_model(workdir: str | Path) -> tuple[DecoderOnlyLM, int, RunConfig]:
    """``(model, step, run)`` of the run in ``workdir`` (a `train_and_evaluate` workdir, e.g.
    a study cell ``STUDY/runs/<cell>/``): ``config.json`` rebuilds the model, the newest
    checkpoint that passes its digest gives the weights. `ConfigError` if ``workdir`` is not a
    training run (a pretrained model's run evaluated a loaded model: no checkpoint) or has no
    readable checkpoint."""
    workdir = Path(workdir)
    config_path = workdir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"workdir={str(workdir)!r} has no config.json (not a training run)")
    try:
        recorded = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"workdir={str(workdir)!r}: config.json is not JSON ({e})") from None
    source = (
        (recorded.get("pretrained") or {}).get("source") if isinstance(recorded, dict) else None
    )
    if source:
        raise ConfigError(
            f"workdir={str(workdir)!r}: this run has no checkpoint: it evaluated a loaded model "
            f"({source}); load that model with flaxformer_lite.load_pretrained"
        )
    run = RunConfig.from_recorded(recorded)
    model = build_model(run)
    graphdef, state = init_train_state(model, make_optimizer(run.optim, run.train.num_steps))
    abstract_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    ckpt = Checkpointer(workdir / "checkpoints", keep=run.train.keep_checkpoints)
    try:
        restored = ckpt.restore_latest(abstract_state)
    finally:
        ckpt.close()
    if restored is None:
        raise ConfigError(f"workdir={str(workdir)!r} has no readable checkpoint")
    state, step = restored
    return nnx.merge(graphdef, state["params"], state["rest"]), step, run
