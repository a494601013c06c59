"""Cached decoding and `generate`: equal to the full forward pass for every encoding, greedy
and sampling semantics, stop bytes, the learned-table limit, the task "generate" scoring mode
on a trained model, and scripts/generate.py end to end."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from configs import extrapolation_lm
from flaxformer_lite import data
from flaxformer_lite.evaluation.protocols import TaskLength
from flaxformer_lite.evaluation.score import arange_positions, generate_predictions, score
from flaxformer_lite.nn.encodings import get_positional_encoding, positional_encoding_names
from flaxformer_lite.nn.generate import generate, sample_logits
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM, EncoderDecoder

ROOT = Path(__file__).resolve().parents[2]
V, P, N = 32, 5, 11  # vocab, prompt length, new tokens
T = P + N  # the sequence compared with the full forward pass
TRAIN_LENGTH = 8  # "training length" of the scaled RoPE variants: T goes past it


# Encoding options chosen so that T = 16 exercises them: xPos decays visibly, T5 reaches its
# log-spaced buckets, FIRE's threshold is passed, dynamic NTK and YaRN extend past
# TRAIN_LENGTH, the learned table just covers the positions.
OPTIONS = {
    "learned": {"max_length": T + 3},
    "xpos": {"scale_base": 4.0},
    "t5": {"num_buckets": 8, "max_distance": 10},
    "fire": {"threshold_init": 4.0},
    "rope": {"original_length": TRAIN_LENGTH},
}


def small_cfg(name: str, options=None, **kw) -> ModelConfig:
    """`tiny_model_config` with vocabulary V and `OPTIONS`; ``options`` update ``name``'s."""
    per_encoding = OPTIONS | {name: OPTIONS.get(name, {}) | (options or {})}
    return tiny_model_config(name, options=per_encoding, vocab_size=V, **kw)


ROPE_SCALINGS = {
    "pi": dict(scaling="pi", scale=2.0),
    "ntk": dict(scaling="ntk", scale=2.0),
    "dynamic_ntk": dict(scaling="dynamic_ntk"),
    "yarn": dict(scaling="yarn", scale=2.0),
    "yarn_paper": dict(scaling="yarn", scale=2.0, yarn_variant="paper"),
}
CASES = [(name, "") for name in positional_encoding_names()] + [
    ("rope", scaling) for scaling in ROPE_SCALINGS
]


def _tokens(seed: int, shape: tuple[int, int]) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape), jnp.int32)


# Positions with an offset on the second row: positions are explicit, not slot indices.
POSITIONS = jnp.asarray(np.arange(T)[None, :] + np.array([0, 3])[:, None], jnp.int32)


SRC = _tokens(1, (2, 7))
SRC_POSITIONS = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (2, 7))
SRC_VALID = jnp.asarray([[True] * 7, [True] * 6 + [False]])  # a padded source token


def _recomputed(model, tokens, positions, per_prefix):
    """Reference logits ``[b, T, V]``: the full forward pass over the tokens so far at every
    step (the prompt's ``P`` rows from one pass over the prompt, then each later row from a
    pass over its prefix); one pass over all ``T`` tokens when ``per_prefix`` is False (equal
    by causality, except for an encoding that reads the current length: dynamic NTK)."""
    if isinstance(model, EncoderDecoder):
        src_kw = dict(src_positions=SRC_POSITIONS, src_valid=SRC_VALID)
        run = lambda n: model(SRC, tokens[:, :n], tgt_positions=positions[:, :n], **src_kw)
    else:
        run = lambda n: model(tokens[:, :n], positions[:, :n])
    if not per_prefix:
        return run(T)
    return jnp.concatenate([run(P)] + [run(n)[:, -1:] for n in range(P + 1, T + 1)], axis=1)


def _full_and_cached(model, tokens, positions, per_prefix=False):
    """`_recomputed` logits, and those of prefilling ``P`` tokens and then decoding the rest
    one token at a time through the cache (a ``lax.scan``)."""
    full = _recomputed(model, tokens, positions, per_prefix)
    if isinstance(model, EncoderDecoder):
        src_kw = dict(src_positions=SRC_POSITIONS, src_valid=SRC_VALID)
        cache = model.init_cache(SRC, capacity=T, positions=positions, **src_kw)
    else:
        cache = model.init_cache(tokens.shape[0], T, positions=positions)
    first, cache = model.decode_step(tokens[:, :P], positions[:, :P], cache)

    def step(cache, xs):
        token, position = xs  # [b] each
        logits, cache = model.decode_step(token[:, None], position[:, None], cache)
        return cache, logits[:, 0]

    _, rest = jax.lax.scan(step, cache, (tokens[:, P:].T, positions[:, P:].T))
    return full, jnp.concatenate([first, jnp.swapaxes(rest, 0, 1)], axis=1)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _compare_all(graphdefs, states, tokens, positions, per_prefix=False):
    """`_full_and_cached` for several models in one compile (fewer compiles, faster tests)."""
    return [
        _full_and_cached(nnx.merge(g, s), tokens, positions, per_prefix)
        for g, s in zip(graphdefs, states, strict=True)
    ]


@pytest.mark.parametrize(
    ("name", "scaling"), CASES, ids=[f"{n}{'+' + s if s else ''}" for n, s in CASES]
)
def test_cached_decoding_equals_full_forward(name, scaling):
    """Prompt of 5 tokens prefilled at once, 11 more one at a time, total 16 > the training
    length 8 of the scaled RoPE variants; offset positions on row 1. The DecoderOnlyLM, and
    the EncoderDecoder (unless the encoding is causal-only; with a padded source token, so
    cached cross-attention is compared with recomputing it). Dynamic NTK takes its scale
    from the current length and its cached keys keep the rotation of the step that wrote
    them (Hugging Face's convention; tests/pretrained pins it against transformers): its
    reference recomputes the forward pass at every step, equal while the length is at most
    the original length and different after."""
    cfg = small_cfg(name, ROPE_SCALINGS.get(scaling))
    models = [DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))]
    if not get_positional_encoding(name).causal_only and not scaling:
        models.append(EncoderDecoder(cfg, rngs=nnx.Rngs(0)))
    graphdefs, states = zip(*(nnx.split(m) for m in models), strict=True)
    per_prefix = scaling == "dynamic_ntk"
    results = _compare_all(
        tuple(graphdefs), list(states), _tokens(0, (2, T)), POSITIONS, per_prefix
    )
    for model, (full, cached) in zip(models, results, strict=True):
        assert np.isfinite(np.asarray(full)).all(), type(model).__name__
        if per_prefix:  # equal while every position so far is below the original length
            full, cached = np.asarray(full), np.asarray(cached)
            within = np.asarray(POSITIONS) < TRAIN_LENGTH  # [b, T]
            assert within.any() and not within.all()
            assert not np.allclose(cached[~within], full[~within], atol=1e-4)
            full, cached = full[within], cached[within]
        np.testing.assert_allclose(
            np.asarray(cached),
            np.asarray(full),
            atol=1e-5,
            rtol=1e-5,
            err_msg=f"{type(model).__name__} with {name} {scaling}",
        )


# ----------------------------------------------------------------------------- generate


@pytest.fixture(scope="module")
def lm() -> DecoderOnlyLM:
    return DecoderOnlyLM(small_cfg("rope", num_decoder_layers=2), rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def prompt() -> jax.Array:
    return _tokens(5, (2, P))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
    model = nnx.merge(graphdef, state)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return model(tokens, positions)


def _fed_logits(model, prompt, new_tokens) -> np.ndarray:
    """Full-forward logits ``[b, N, V]`` at the positions that predict each new token."""
    fed = jnp.concatenate([prompt, new_tokens[:, :-1]], axis=1)
    logits = _forward(*nnx.split(model), fed)
    return np.asarray(logits[:, prompt.shape[1] - 1 :])


def test_greedy_is_deterministic_and_the_argmax_of_the_full_forward(lm, prompt):
    out = generate(lm, prompt, max_new_tokens=N)
    assert out.shape == (2, N) and out.dtype == jnp.int32
    np.testing.assert_array_equal(generate(lm, prompt, max_new_tokens=N), out)
    np.testing.assert_array_equal(np.argmax(_fed_logits(lm, prompt, out), -1), out)


def test_sampling_is_reproducible_and_top_k_stays_in_the_top_k(lm, prompt):
    k = 4
    kw = dict(max_new_tokens=N, temperature=2.0, top_k=k)
    a = np.asarray(generate(lm, prompt, rng=jax.random.key(1), **kw))
    np.testing.assert_array_equal(generate(lm, prompt, rng=jax.random.key(1), **kw), a)
    b = np.asarray(generate(lm, prompt, rng=jax.random.key(2), **kw))
    assert (a != b).any()
    for out in (a, b):
        logits = _fed_logits(lm, prompt, jnp.asarray(out))
        top = np.argsort(-logits, axis=-1)[..., :k]  # [b, N, k]
        assert (top == out[..., None]).any(-1).all()
    greedy = np.asarray(generate(lm, prompt, max_new_tokens=N))
    assert (a != greedy).any()  # temperature 2 over 4 candidates is not the argmax


def test_sample_logits_follows_the_tempered_softmax():
    logits = jnp.asarray([0.0, 1.0, 2.0, -1.0, 0.5], jnp.float32)
    rows = jnp.broadcast_to(logits, (20000, 5))
    for temperature, top_k in ((0.5, None), (2.0, 3)):
        draws = sample_logits(
            rows, jax.random.key(0), temperature=temperature, top_k=top_k, greedy=False
        )
        freq = np.bincount(np.asarray(draws), minlength=5) / draws.shape[0]
        expected = np.exp(np.asarray(logits) / temperature)
        if top_k is not None:
            expected[np.argsort(-np.asarray(logits))[top_k:]] = 0.0
        np.testing.assert_allclose(freq, expected / expected.sum(), atol=0.015)


def test_stop_byte(lm, prompt):
    kw = dict(max_new_tokens=N, temperature=2.0, top_k=4, rng=jax.random.key(1))
    free = np.asarray(generate(lm, prompt, **kw))  # the same draws until a row stops
    # A stop byte both rows emit (so the loop ends early), whose first occurrence in row 0
    # is followed by other tokens (so the padding after it is visible).
    candidates = [
        int(v)
        for i, v in enumerate(free[0, :-1])
        if (free[0, i + 1 :] != v).any() and v in free[1] and v not in free[0, :i]
    ]
    assert candidates, f"no usable stop byte in {free}; pick another seed"
    stop = candidates[0]
    out, lengths = generate(lm, prompt, stop_byte=stop, return_lengths=True, **kw)
    for row, got, length in zip(free, np.asarray(out), np.asarray(lengths), strict=True):
        n = int(np.flatnonzero(row == stop)[0]) + 1  # tokens up to and including the stop
        assert length == n
        np.testing.assert_array_equal(got[:n], row[:n])
        np.testing.assert_array_equal(got[n:], np.full(N - n, stop))
    assert lengths[0] < N and (np.asarray(out)[0] != free[0]).any()


def test_learned_table_limit_is_a_clear_error():
    model = DecoderOnlyLM(small_cfg("learned", {"max_length": 12}), rngs=nnx.Rngs(0))
    prompt = _tokens(0, (1, P))
    with pytest.raises(ValueError, match="max_length=12"):
        generate(model, prompt, max_new_tokens=9)  # feeds 5 + 9 - 1 = 13 tokens
    assert generate(model, prompt, max_new_tokens=8).shape == (1, 8)  # feeds 12


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2, temperature=-1.0), "temperature"),
        (dict(max_new_tokens=2, temperature=1.0), "rng"),
        (dict(max_new_tokens=2, top_k=V + 1), "top_k"),
        (dict(max_new_tokens=2, stop_byte=V), "stop_byte"),
        (dict(max_new_tokens=2, positions=jnp.arange(3)), "positions"),
        (dict(max_new_tokens=2, src=jnp.zeros((2, 3), jnp.int32)), "EncoderDecoder"),
    ],
)
def test_bad_arguments_name_the_argument(lm, prompt, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(lm, prompt, **kwargs)


def test_encoder_decoder_generate_is_the_argmax_of_the_full_forward():
    model = EncoderDecoder(small_cfg("t5"), rngs=nnx.Rngs(0))
    src, start = _tokens(1, (2, 7)), jnp.ones((2, 1), jnp.int32)
    out = generate(model, start, src=src, max_new_tokens=6)
    fed = jnp.concatenate([start, out[:, :-1]], axis=1)
    graphdef, state = nnx.split(model)
    forward = jax.jit(
        lambda state, src, tgt: nnx.merge(graphdef, state)(
            src, tgt, src_positions=jnp.arange(7), tgt_positions=jnp.arange(6)
        )
    )
    np.testing.assert_array_equal(np.argmax(np.asarray(forward(state, src, fed)), -1), out)
    with pytest.raises(ValueError, match="src"):
        generate(model, start, max_new_tokens=2)


# ------------------------------------------------------- task scoring on a trained model


@pytest.fixture(scope="module")
def copy_model():
    """A 2-layer ALiBi LM trained 300 steps on copying strings of 1..6 letters: it solves
    short strings and fails on longer ones, so both outcomes are scored."""
    from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
    from flaxformer_lite.train.run_config import OptimConfig
    from flaxformer_lite.train.step import init_train_state, make_train_step

    task = data.get_task("copy", alphabet=b"abcdefgh")
    cfg = tiny_model_config(
        "alibi",
        vocab_size=128,
        d_model=32,
        d_ff=64,
        num_encoder_layers=0,
        num_decoder_layers=2,
        norm="pre",
    )
    steps, optim = 300, OptimConfig(learning_rate=1e-2, warmup_steps=20)
    tx = make_optimizer(optim, steps)
    graphdef, state = init_train_state(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)), tx)
    train_step = jax.jit(
        make_train_step(graphdef, tx, learning_rate_schedule(optim, steps)), donate_argnums=0
    )
    rng = np.random.default_rng(0)
    positions = np.broadcast_to(np.arange(12, dtype=np.int32), (32, 12))
    for _ in range(steps):
        batch = task.sample(rng, 32, int(rng.integers(1, 7)), pad_to=12)
        state, _ = train_step(state, batch | {"positions": positions})
    return nnx.merge(graphdef, state["params"], state["rest"]), task


def test_generate_scoring_agrees_with_teacher_forced_exact_match(copy_model):
    model, task = copy_model
    lengths, num = (3, 5), 32
    outcomes = []
    for length in lengths:
        batch = task.sample(np.random.default_rng([0, length]), num, length)
        t = batch["inputs"].shape[1]
        batch["positions"] = arange_positions(0, num, t)
        teacher = np.asarray(jnp.argmax(model(batch["inputs"], batch["positions"]), -1))
        generated = generate_predictions(model, task, batch, length)
        tf_exact = task.exact_match(teacher, batch)
        np.testing.assert_array_equal(task.exact_match(generated, batch), tf_exact)
        # Stronger: greedy decoding follows the teacher-forced argmax up to its first error.
        answer = slice(t - task.answer_length(length), t)
        for tf_row, gen_row, target in zip(
            teacher[:, answer], generated[:, answer], batch["targets"][:, answer], strict=True
        ):
            wrong = np.flatnonzero(tf_row != target)
            upto = len(target) if wrong.size == 0 else wrong[0] + 1
            np.testing.assert_array_equal(gen_row[:upto], tf_row[:upto])
        outcomes.append(tf_exact)
    outcomes = np.concatenate(outcomes)
    assert 0 < outcomes.sum() < outcomes.size, "need both solved and failed examples"
    rows = {
        mode: [score(model, TaskLength(n, num, mode=mode), task, batch_size=num) for n in lengths]
        for mode in ("teacher_forced", "generate")
    }
    for tf_row, gen_row, length in zip(
        rows["teacher_forced"], rows["generate"], lengths, strict=True
    ):
        assert "mode" not in tf_row and gen_row["mode"] == "generate"
        assert gen_row["exact_match"] == tf_row["exact_match"]
        assert tf_row["eval_length"] == gen_row["eval_length"] == length
    with pytest.raises(ValueError, match="mode="):
        TaskLength(lengths[0], mode="beam")


# ------------------------------------------------------------------ scripts/generate.py


def test_generate_script_end_to_end(tmp_path):
    from flaxformer_lite.train.checkpoint import Checkpointer
    from flaxformer_lite.train.loop import build_model, train_and_evaluate
    from flaxformer_lite.train.optim import make_optimizer
    from flaxformer_lite.train.run_config import RunConfig
    from flaxformer_lite.train.step import init_train_state

    c = extrapolation_lm.get_config("tiny")
    c.train.update(num_steps=4, checkpoint_every=2)
    c.eval.update(length_multiples=(1,), max_bytes=64)
    c.model.positional_options.learned.max_length = c.data.train_length
    workdir = tmp_path / "run"
    train_and_evaluate(c, workdir)
    prompt, n = "def ", 12
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "generate.py"),
            f"--workdir={workdir}",
            f"--prompt={prompt}",
            f"--max_new_tokens={n}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    # The expected continuation from the newest checkpoint (step 4), computed here.
    run = RunConfig.from_config(json.loads((workdir / "config.json").read_text()))
    graphdef, state = init_train_state(
        build_model(run), make_optimizer(run.optim, run.train.num_steps)
    )
    ckpt = Checkpointer(workdir / "checkpoints", keep=2)
    state, step = ckpt.restore_latest(state)
    ckpt.close()
    assert step == 4
    model = nnx.merge(graphdef, state["params"], state["rest"])
    ids = jnp.asarray([list(prompt.encode())], jnp.int32)
    tokens = np.asarray(generate(model, ids, max_new_tokens=n))[0]
    text = (prompt.encode() + bytes(tokens.tolist())).decode("utf-8", errors="replace")
    assert proc.stdout == text + "\n"
    assert proc.stdout.startswith(prompt)


def test_dynamic_ntk_prompt_does_not_depend_on_how_much_follows():
    """A 2-layer RoPE model with dynamic NTK and original length 4; a
    4-token prompt prefilled into caches of capacity 4, 8 and 20 gives the logits of the full
    forward pass over the prompt (the cache's capacity is not the current length), and
    generating past the original length picks, at every step, the argmax of the cached
    decoding logits of the tokens fed so far (Hugging Face's cached convention)."""
    cfg = small_cfg("rope", {"scaling": "dynamic_ntk", "original_length": 4}, num_decoder_layers=2)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(1))
    prompt = _tokens(7, (2, 4))
    full = np.asarray(model(prompt, jnp.arange(4)[None]))
    for capacity in (4, 8, 20):
        cache = model.init_cache(2, capacity)
        logits, _ = model.decode_step(prompt, jnp.broadcast_to(jnp.arange(4), (2, 4)), cache)
        np.testing.assert_allclose(np.asarray(logits), full, atol=1e-5, rtol=1e-5)
    for max_new in (3, 9):
        out = generate(model, prompt, max_new_tokens=max_new)
        fed = jnp.concatenate([prompt, out[:, :-1]], axis=1)
        cache = model.init_cache(2, 4 + max_new)
        logits, cache = model.decode_step(prompt, jnp.broadcast_to(jnp.arange(4), (2, 4)), cache)
        for t in range(max_new):  # the cached logits that chose token t
            np.testing.assert_array_equal(np.argmax(logits[:, -1], -1), np.asarray(out[:, t]))
            if t + 1 < max_new:
                pos = jnp.full((2, 1), 4 + t)
                logits, cache = model.decode_step(fed[:, 4 + t : 5 + t], pos, cache)


@pytest.mark.parametrize("name", ["xpos", "alibi", "rope", "learned"])
def test_windowed_cached_decoding_equals_full_forward(name):
    """With a sliding window (each query sees its last 4 keys) the cache's position-based
    window equals the full pass's index-based one for positions 0..n-1."""
    model = DecoderOnlyLM(small_cfg(name, attention_window=4), rngs=nnx.Rngs(0))
    plain = DecoderOnlyLM(small_cfg(name), rngs=nnx.Rngs(0))
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (2, T))
    (full, cached), (plain_full, _) = _compare_all(
        (nnx.split(model)[0], nnx.split(plain)[0]),
        [nnx.split(model)[1], nnx.split(plain)[1]],
        _tokens(0, (2, T)),
        positions,
    )
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(full)[:, :4], np.asarray(plain_full)[:, :4], atol=1e-5)
    assert not np.allclose(np.asarray(full)[:, 4:], np.asarray(plain_full)[:, 4:], atol=1e-4)


def test_a_window_is_refused_by_a_bidirectional_encoder():
    with pytest.raises(ValueError, match=r"attention_window=4: a window applies to causal"):
        EncoderDecoder(small_cfg("alibi", attention_window=4), rngs=nnx.Rngs(0))
