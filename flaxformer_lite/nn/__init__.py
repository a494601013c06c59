"""Flax NNX modules over the pure core: positional encodings, layers, models, generation."""
