"""flaxformer_lite: Transformers as pure JAX functions and thin Flax NNX modules."""
