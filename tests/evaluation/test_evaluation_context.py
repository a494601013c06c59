"""The context-controlled protocol and the per-block sums.

* the same target bytes are scored at every context length c, target k of a block with
  exactly c + k bytes before it -- checked against a naive loop that runs the model once per
  target on exactly that many preceding bytes;
* the per-block sums of an evaluation add up to its totals, block by block, and the whole
  split is scored when no cap is given.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.data.corpus import Split
from flaxformer_lite.data.windows import (
    context_block_starts,
    context_window_arrays,
    copy_key_targets,
)
from flaxformer_lite.evaluation.protocols import Context, Windows
from flaxformer_lite.evaluation.score import score
from flaxformer_lite.nn.models import DecoderOnlyLM

VOCAB = 32  # the tiny model's vocabulary: random "bytes" below it


@pytest.fixture(scope="module")
def split() -> Split:
    data = np.random.default_rng(0).integers(0, VOCAB, 700).astype(np.uint8)
    return Split(data, name="validation", corpus="random", num_files=1)


@pytest.fixture(scope="module", params=["rope", "alibi"])
def model(request) -> DecoderOnlyLM:
    cfg = tiny_model_config(request.param, num_encoder_layers=0)
    return DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))


def test_block_starts_are_fixed_spaced_and_leave_room_for_the_context():
    starts = context_block_starts(1000, max_context=64, block=8, blocks=20)
    assert starts[0] == 64 and starts[-1] + 8 <= 1000
    assert np.all(np.diff(starts) >= 8)  # blocks never overlap
    np.testing.assert_array_equal(starts, 64 + np.arange(20) * (1000 - 8 - 64) // 20)
    with pytest.raises(ValueError, match="holds at most 116 non-overlapping blocks of 8"):
        context_block_starts(1000, max_context=64, block=8, blocks=117)
    with pytest.raises(ValueError, match="blocks"):
        context_block_starts(1000, max_context=64, block=8, blocks=0)


@pytest.mark.parametrize("context", [1, 5, 40])
def test_windows_score_the_same_targets_with_c_plus_k_bytes_before(context):
    data = np.arange(300) % 251
    starts = np.array([40, 97, 200])
    block = 6
    w = context_window_arrays(data, starts, context, block)
    assert w["inputs"].shape == (3, context + block - 1)
    mask = w["loss_mask"] > 0
    assert mask.sum(axis=1).tolist() == [block] * 3
    # the scored targets are bytes starts[i] + k, whatever the context length
    np.testing.assert_array_equal(
        w["targets"][mask].reshape(3, block), data[starts[:, None] + np.arange(block)]
    )
    # target k sits at column context - 1 + k: its inputs 0..column are the c + k bytes before it
    for i, p0 in enumerate(starts):
        for k in range(block):
            col = context - 1 + k
            np.testing.assert_array_equal(w["inputs"][i, : col + 1], data[p0 - context : p0 + k])
    with pytest.raises(ValueError, match="outside the split"):
        context_window_arrays(data, np.array([3]), 10, block)


def _naive_losses(model, data, starts, context, block) -> np.ndarray:
    """``[blocks, block]`` nats: each target scored by its own model call on exactly its c + k
    preceding bytes (the calls of one offset k as independent rows of one batch)."""
    forward = nnx.jit(lambda m, x, p: m(x, p))  # one compile per length, not one per op
    out = np.zeros((len(starts), block))
    for k in range(block):
        inputs = np.stack([data[p0 - context : p0 + k] for p0 in starts]).astype(np.int32)
        positions = np.broadcast_to(np.arange(inputs.shape[1]), inputs.shape)
        logits = np.asarray(forward(model, inputs, positions), np.float64)[:, -1]
        last = logits - logits.max(axis=-1, keepdims=True)
        target = data[np.asarray(starts) + k]
        out[:, k] = np.log(np.exp(last).sum(-1)) - last[np.arange(len(starts)), target]
    return out


def test_context_protocol_matches_a_naive_loop(model, split):
    block, max_context = 4, 48
    starts = split.context_starts(max_context=max_context, block=block, blocks=8)
    for context in (6, max_context):
        protocol = Context(context, block, max_context=max_context, targets=8 * block)
        np.testing.assert_array_equal(protocol.starts(split), starts)
        r = score(model, protocol, split, batch_size=4)
        naive = _naive_losses(model, split.data, starts, context, block)
        assert r["num_scored_tokens"] == r["tokens"] == 8 * block
        assert r["protocol"] == "context" and r["eval_length"] == context
        np.testing.assert_allclose(r["loss"], naive.mean(), rtol=2e-5)
        # loss_by_position[k]: the targets with exactly context + k bytes of context
        np.testing.assert_allclose(r["loss_by_position"], naive.mean(axis=0), rtol=2e-5)
        # per-block sums: statistics block j holds target blocks j * per .. (j + 1) * per - 1
        per = r["blocks"]["size"] // block
        sums = naive.sum(axis=1)
        expected = [sums[j : j + per].sum() for j in range(0, len(starts), per)]
        np.testing.assert_allclose(r["blocks"]["loss"], expected, rtol=2e-5)


def test_block_sums_add_up_and_the_whole_split_is_scored(split):
    model = DecoderOnlyLM(tiny_model_config("alibi", num_encoder_layers=0), rngs=nnx.Rngs(1))
    n = split.num_tokens
    for stride in (None, 5):
        r = score(model, Windows(32, stride=stride, block_tokens=100), split)
        b = r["blocks"]
        assert r["num_scored_tokens"] == r["tokens"] == n - 1  # targets 1 .. n-1, each once
        # block j holds target bytes 100 j .. 100 j + 99; byte 0 is never a target
        assert b["count"] == [99.0] + [100.0] * 5 + [float(n - 600)]
        np.testing.assert_allclose(sum(b["loss"]), r["loss"] * r["tokens"], rtol=1e-6)
        np.testing.assert_allclose(sum(b["correct"]), r["accuracy"] * r["tokens"], rtol=1e-6)
    capped = score(model, Windows(32, max_bytes=250, block_tokens=100), split)
    assert capped["num_scored_tokens"] == 250 and capped["blocks"]["count"] == [99, 100, 51]
    # the same bytes in the same blocks at another length: the first targets' losses differ
    # (less context) but the blocks and their counts are the same, so comparisons can pair them
    longer = score(model, Windows(64, block_tokens=100), split)
    assert longer["blocks"]["count"] == r["blocks"]["count"]


def test_key_targets_score_the_naive_losses_of_the_targets_a_far_copy_predicts(model):
    # a period of 30 with some tokens replaced: most 8-grams last occurred 30 tokens earlier,
    # beyond near = 12 and within max_context = 48; the replaced ones nowhere
    rng = np.random.default_rng(2)
    data = np.tile(rng.integers(0, VOCAB, 30), 24).astype(np.uint8)
    data[rng.choice(data.shape[0], 40, replace=False)] = rng.integers(0, VOCAB, 40)
    split = Split(data, name="validation", corpus="periodic", num_files=1)
    block, max_context, near = 4, 48, 12
    starts = split.context_starts(max_context=max_context, block=block, blocks=16)
    key = copy_key_targets(data, starts, block=block, near=near, far=max_context)
    assert 0 < key.sum() < key.size
    for context in (near, max_context):
        protocol = Context(context, block, max_context, 16 * block, 8, key_near=near)
        r = score(model, protocol, split, batch_size=5)  # a padded last batch
        naive = _naive_losses(model, data, starts, context, block)
        assert r["key_targets"] == key.sum()
        np.testing.assert_allclose(
            r["key_bits_per_byte"], naive[key].sum() / np.log(2) / key.sum(), rtol=2e-5
        )
        per = r["blocks"]["size"] // block  # statistics block j: target blocks j*per ...
        losses = (naive * key).sum(axis=1)
        expected = [losses[j : j + per].sum() for j in range(0, len(starts), per)]
        np.testing.assert_allclose(r["blocks"]["key_loss"], expected, rtol=2e-5)
        assert sum(r["blocks"]["key_count"]) == sum(r["blocks"]["key_bytes"]) == key.sum()
    no_key = score(model, Context(near, block, max_context, 16 * block), split)
    assert "key_bits_per_byte" not in no_key and "key_loss" not in no_key["blocks"]
