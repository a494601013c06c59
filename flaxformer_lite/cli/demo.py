"""Build every model with every positional encoding, run it once, print shapes and sizes.

    flaxformer-lite demo

(``python scripts/demo.py`` and ``python -m flaxformer_lite demo`` are the same command; it
takes no flags.) A quick check that an installation works; the numbers are the parameter
counts of small demo models (d_model 64, 2+2 layers, 4 heads) plus the base Transformer of
the paper.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import app
from flax import nnx

from flaxformer_lite.cli import common
from flaxformer_lite.nn.encodings import get_positional_encoding, positional_encoding_names
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM, Encoder, EncoderDecoder


def param_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    batch, src_len, tgt_len = 2, 12, 10
    src = jnp.arange(batch * src_len, dtype=jnp.int32).reshape(batch, src_len) % 256
    tgt = jnp.arange(batch * tgt_len, dtype=jnp.int32).reshape(batch, tgt_len) % 256
    src_pos, tgt_pos = jnp.arange(src_len), jnp.arange(tgt_len)
    calls = {
        "DecoderOnlyLM": lambda m: m(tgt, tgt_pos),
        "EncoderDecoder": lambda m: m(src, tgt, src_positions=src_pos, tgt_positions=tgt_pos),
        "Encoder": lambda m: m(src, src_pos),
    }
    print(
        f"| {'model':<14} | {'encoding':<12} | {'hook':<6} | {'output shape':<14} | {'params':>8} |"
    )
    print(f"|{'-' * 16}|{'-' * 14}|{'-' * 8}|{'-' * 16}|{'-' * 10}|")
    for name in positional_encoding_names():
        spec = get_positional_encoding(name)
        cfg = ModelConfig(
            d_model=64,
            num_heads=4,
            d_ff=128,
            num_encoder_layers=2,
            num_decoder_layers=2,
            positional=name,
            positional_options={"learned": {"max_length": 64}},  # used by "learned" only
        )
        rngs = nnx.Rngs(0)
        models = {"DecoderOnlyLM": DecoderOnlyLM(cfg, rngs=rngs)}
        if not spec.causal_only:
            models["EncoderDecoder"] = EncoderDecoder(cfg, rngs=rngs)
            models["Encoder"] = Encoder(cfg, rngs=rngs)
        for kind, model in models.items():
            out = nnx.jit(calls[kind])(model)
            assert bool(jnp.isfinite(out).all()), (kind, name)
            shape = str(tuple(out.shape))
            print(
                f"| {kind:<14} | {name:<12} | {spec.hook:<6} | {shape:<14} | "
                f"{param_count(model):>8,} |"
            )
    base = nnx.eval_shape(lambda: EncoderDecoder(ModelConfig(), rngs=nnx.Rngs(0)))
    print(
        f"\nbase Transformer (6+6 layers, d_model 512, 8 heads, d_ff 2048, byte vocabulary): "
        f"{param_count(base):,} parameters"
    )


def run(argv: list[str] | None = None, prog: str = "flaxformer-lite demo") -> None:
    """Parse ``argv`` (default ``sys.argv``; only absl's --help flags) and run the demo."""
    common.run_command(main, doc=__doc__, module=__name__, argv=argv, prog=prog)


if __name__ == "__main__":
    run()
