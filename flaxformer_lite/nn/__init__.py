"""Flax NNX modules over the pure core: positional encodings, layers, models, generation.

May import: `flaxformer_lite.base`, `flaxformer_lite.core`, jax, numpy, flax (no optax,
orbax or I/O). `encodings` holds the registry -- the one place that knows encodings by name
-- and one module per hook point; `model_config.ModelConfig` is the frozen model
configuration (the chosen encoding's options live in ``positional_options``); `schedules` the
per-layer attention schedules (`schedules.LayerKind`, named patterns such as Gemma 3's);
`layers` and `models` are the Transformer; `generate` decodes autoregressively through the KV
cache.
"""
