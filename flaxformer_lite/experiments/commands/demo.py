"""Build every model with every positional encoding, run it once, print shapes and sizes.

    python scripts/demo.py

A quick check that an installation works; the numbers are the parameter counts of small
demo models (d_model 64, 2+2 layers, 4 heads) plus the base Transformer of the paper.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import flaxformer_lite as ffl


def param_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def main() -> None:
    batch, src_len, tgt_len = 2, 12, 10
    src = jnp.arange(batch * src_len, dtype=jnp.int32).reshape(batch, src_len) % 256
    tgt = jnp.arange(batch * tgt_len, dtype=jnp.int32).reshape(batch, tgt_len) % 256
    src_pos, tgt_pos = jnp.arange(src_len), jnp.arange(tgt_len)
    print(
        f"| {'model':<14} | {'encoding':<12} | {'hook':<6} | {'output shape':<14} | {'params':>8} |"
    )
    print(f"|{'-' * 16}|{'-' * 14}|{'-' * 8}|{'-' * 16}|{'-' * 10}|")
    for name in ffl.positional_encoding_names():
        spec = ffl.get_positional_encoding(name)
        cfg = ffl.ModelConfig(
            d_model=64,
            num_heads=4,
            d_ff=128,
            num_encoder_layers=2,
            num_decoder_layers=2,
            positional=name,
            positional_options={"learned": {"max_length": 64}},  # used by "learned" only
        )
        rngs = nnx.Rngs(0)
        models = {"DecoderOnlyLM": ffl.DecoderOnlyLM(cfg, rngs=rngs)}
        if not spec.causal_only:
            models["EncoderDecoder"] = ffl.EncoderDecoder(cfg, rngs=rngs)
            models["Encoder"] = ffl.Encoder(cfg, rngs=rngs)
        for kind, model in models.items():
            if kind == "DecoderOnlyLM":
                out = nnx.jit(lambda m: m(tgt, tgt_pos))(model)
            elif kind == "EncoderDecoder":
                out = nnx.jit(lambda m: m(src, tgt, src_positions=src_pos, tgt_positions=tgt_pos))(
                    model
                )
            else:
                out = nnx.jit(lambda m: m(src, src_pos))(model)
            assert bool(jnp.isfinite(out).all()), (kind, name)
            shape = str(tuple(out.shape))
            print(
                f"| {kind:<14} | {name:<12} | {spec.hook:<6} | {shape:<14} | "
                f"{param_count(model):>8,} |"
            )
    base = nnx.eval_shape(lambda: ffl.EncoderDecoder(ffl.ModelConfig(), rngs=nnx.Rngs(0)))
    print(
        f"\nbase Transformer (6+6 layers, d_model 512, 8 heads, d_ff 2048, byte vocabulary): "
        f"{param_count(base):,} parameters"
    )


if __name__ == "__main__":
    main()
