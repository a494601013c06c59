"""``config.train.cpu_matmul``: which library runs a CPU training step's products.

The choice, the check of the running jaxlib (which must catch the fused oneDNN mode's wrong
products), that the options reach the loop's compiled steps, and that a run trained with
oneDNN's products matches one trained with XLA's to float32 tolerance.
"""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import extrapolation_lm
from flaxformer_lite.train import cpu_matmul, loop
from flaxformer_lite.train.run_config import ConfigError, RunConfig

CPU = jax.default_backend() == "cpu"


@pytest.fixture
def fresh_check(monkeypatch):
    """`onednn_problem` re-run with whatever the test patches, and its cache restored after."""
    cpu_matmul.onednn_problem.cache_clear()
    cpu_matmul._warn_once.cache_clear()
    yield
    monkeypatch.undo()
    cpu_matmul.onednn_problem.cache_clear()
    cpu_matmul._warn_once.cache_clear()


@pytest.mark.parametrize(
    ("choice", "dtype", "platform", "want"),
    [
        ("auto", jnp.float32, "cpu", "onednn"),
        ("auto", jnp.bfloat16, "cpu", "xla"),  # bf16 steps measured slower with oneDNN
        ("auto", jnp.float16, "cpu", "xla"),
        ("auto", jnp.float32, "gpu", "xla"),
        ("auto", jnp.float32, "tpu", "xla"),
        ("onednn", jnp.bfloat16, "cpu", "onednn"),
        ("onednn", jnp.float32, "gpu", "xla"),  # the options are CPU options
        ("xla", jnp.float32, "cpu", "xla"),
    ],
)
def test_resolve(choice, dtype, platform, want):
    assert cpu_matmul.resolve(choice, compute_dtype=dtype, platform=platform) == want
    options = cpu_matmul.compiler_options(want)
    assert options == (cpu_matmul.ONEDNN_PRODUCTS if want == "onednn" else None)


def test_a_bad_choice_names_the_field():
    with pytest.raises(ConfigError, match=r"config\.train\.cpu_matmul='fast': must be one of"):
        cpu_matmul.resolve("fast", compute_dtype=jnp.float32, platform="cpu")
    c = extrapolation_lm.get_config("tiny")
    c.train.cpu_matmul = "mkl"
    with pytest.raises(ConfigError, match=r"config\.train\.cpu_matmul='mkl'.*'auto', 'onednn'"):
        RunConfig.from_config(c)


@pytest.mark.skipif(not CPU, reason="the check compiles on the CPU backend")
def test_this_jaxlib_passes_the_check_and_compiles_onednn_products():
    assert cpu_matmul.onednn_problem() is None
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 32)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((32, 48)), jnp.float32)

    def f(a, b):
        return (a @ b) * 0.3 + 1.0

    hlo = jax.jit(f, compiler_options=cpu_matmul.ONEDNN_PRODUCTS).lower(x, w).compile().as_text()
    plain = jax.jit(f).lower(x, w).compile().as_text()
    assert "__onednn_fusion" in hlo and "__onednn_fusion" not in plain
    got = jax.jit(f, compiler_options=cpu_matmul.ONEDNN_PRODUCTS)(x, w)
    want = (np.asarray(x, np.float64) @ np.asarray(w, np.float64)) * 0.3 + 1.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not CPU, reason="the check compiles on the CPU backend")
def test_the_check_catches_the_fused_mode_and_auto_falls_back_loudly(
    fresh_check, monkeypatch, caplog
):
    """The fused oneDNN mode computes ``(x @ w) * 0.3 + 1.0`` as ``x @ w + 1.0`` on the
    jaxlibs measured (docs/performance.md): the check must say so, "auto" must then use XLA's
    products with a warning, and "onednn" must refuse."""
    fused = {
        "xla_cpu_use_onednn": True,
        "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
    }
    monkeypatch.setattr(cpu_matmul, "ONEDNN_PRODUCTS", fused)
    problem = cpu_matmul.onednn_problem()
    assert problem is not None and "is wrong" in problem, problem
    with caplog.at_level(logging.WARNING, logger=cpu_matmul.__name__):
        assert cpu_matmul.resolve("auto", compute_dtype=jnp.float32, platform="cpu") == "xla"
    assert "not oneDNN's" in caplog.text and problem in caplog.text
    with pytest.raises(RuntimeError, match=r"config\.train\.cpu_matmul='onednn'.*'xla'"):
        cpu_matmul.resolve("onednn", compute_dtype=jnp.float32, platform="cpu")


@pytest.mark.skipif(not CPU, reason="the check compiles on the CPU backend")
def test_an_unknown_option_is_a_problem_not_a_crash(fresh_check, monkeypatch):
    monkeypatch.setattr(cpu_matmul, "ONEDNN_PRODUCTS", {"xla_cpu_no_such_option": True})
    problem = cpu_matmul.onednn_problem()
    assert problem is not None and "failed" in problem, problem


def _tiny(corpus_file, matmul):
    c = extrapolation_lm.get_config("tiny")
    c.data.corpus = "path"
    c.data.path = str(corpus_file)
    c.train.update(num_steps=8, log_every=1, checkpoint_every=8, progress=False)
    c.train.cpu_matmul = matmul
    return c


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta"]
    lines = [b" ".join(words[i] for i in rng.integers(0, 6, size=6)) + b".\n" for _ in range(800)]
    path = tmp_path_factory.mktemp("corpus") / "toy.txt"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.skipif(not CPU, reason="the check compiles on the CPU backend")
def test_onednn_on_a_failing_jaxlib_is_refused_before_any_write(
    corpus_file, tmp_path, fresh_check, monkeypatch
):
    monkeypatch.setattr(cpu_matmul, "ONEDNN_PRODUCTS", {"xla_cpu_no_such_option": True})
    workdir = tmp_path / "run"
    with pytest.raises(RuntimeError, match=r"config\.train\.cpu_matmul='onednn'"):
        loop.train_and_evaluate(_tiny(corpus_file, "onednn"), workdir)
    assert not workdir.exists()


def test_the_loop_compiles_its_steps_with_the_options(corpus_file, tmp_path, monkeypatch):
    """An option XLA does not know, put where the loop takes its options from, fails the
    first step: the options reach the compiled step."""
    monkeypatch.setattr(
        cpu_matmul, "compiler_options", lambda resolved: {"xla_no_such_compile_option": 1}
    )
    with pytest.raises(Exception, match="xla_no_such_compile_option"):
        loop.train_and_evaluate(_tiny(corpus_file, "auto"), tmp_path / "run")


@pytest.mark.skipif(not CPU, reason="oneDNN products are a CPU setting")
def test_onednn_and_xla_products_train_the_same_run(corpus_file, tmp_path):
    """Eight steps and the evaluation with oneDNN's products ("auto" on a float32 model)
    against XLA's: the same losses and bits per byte to float32 tolerance, the same run
    identity, and each run's provenance names the products it trained with."""
    runs = {}
    for matmul in ("auto", "xla"):
        workdir = tmp_path / matmul
        summary = loop.train_and_evaluate(_tiny(corpus_file, matmul), workdir)
        rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in rows if r["split"] == "train"]
        provenance = json.loads((workdir / "provenance.json").read_text())
        runs[matmul] = (summary, losses, provenance["train_matmul"])
    (a, a_losses, a_used), (b, b_losses, b_used) = runs["auto"], runs["xla"]
    assert (a_used, b_used) == ("onednn", "xla")
    assert len(a_losses) == 8
    np.testing.assert_allclose(a_losses, b_losses, rtol=1e-4)
    np.testing.assert_allclose(
        [r["bits_per_byte"] for r in a["eval"]], [r["bits_per_byte"] for r in b["eval"]], rtol=1e-4
    )
    assert a["config_hash"] == b["config_hash"]
