"""The one tiny `ModelConfig` the tests build (`tiny_model_config`; the ``tiny_config``
fixture in conftest.py returns it). A plain module, so test modules can also call it at
import time: ``from tiny_models import tiny_model_config``."""

from __future__ import annotations

from flaxformer_lite.nn.model_config import ModelConfig

TINY = dict(
    vocab_size=32,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
)


def tiny_model_config(positional: str = "none", *, options=None, **fields) -> ModelConfig:
    """A tiny `ModelConfig` (`TINY` shapes, no dropout, a 64-row learned table).

    ``options``: ``{encoding: {option: value}}`` for any encodings, as a study config holds
    them (only ``positional``'s is used, so one dict can serve every encoding), or the chosen
    encoding's options directly. ``fields`` override any other field.
    """
    per_encoding = {"learned": {"max_length": 64}}
    if options and all(isinstance(v, dict) for v in options.values()):
        per_encoding = per_encoding | options
    elif options:
        per_encoding = per_encoding | {positional: options}
    values = TINY | {"positional": positional, "positional_options": per_encoding} | fields
    return ModelConfig.from_mapping(values)
