"""The pure core: attention and positional formulas as functions of arrays.

May import: `flaxformer_lite.base`, jax, numpy. No Flax, optax or orbax; no state, no I/O.

Layout of q, k, v: ``[batch, length, heads, head_dim]``; positions: explicit int32
``[batch, length]``; angles, logits and softmax in float32 whatever the compute dtype.

* `attention`: ``softmax(q k^T / sqrt(d) + bias) v`` with masks; `attend` picks the
  implementation (plain XLA, `chunked_attention`, or the fused kernel);
* `positions`: explicit positions, relative distances, randomized positions;
* the positional formulas, one module per hook point (DESIGN.md §3): `absolute` (added to the
  embeddings), `rotary` (rotating queries and keys) and `attention_bias` (added to
  the logits);
* `forgetting`: forgetting attention's gates and prefix sums (FoX), a data-dependent bias;
* `temperature`: length-dependent query factors (Qwen's logn, SSMax, Llama 4);
* `kv_cache`: key-value caches as plain pytrees for autoregressive decoding;
* `mixed_precision`: dense products in bfloat16 with float32 accumulation.
"""
