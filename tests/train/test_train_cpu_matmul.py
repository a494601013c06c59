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
import jaxlib
import numpy as np
import pytest

from configs import extrapolation_lm
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
        ("auto", jnp.float16, "cpu", "xla"),  # not measured
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


@pytest.mark.parametrize(("takes", "want"), [(True, "xla"), (False, "onednn")])
def test_auto_gives_a_bf16_model_onednn_only_where_its_mixed_products_stay_with_xla(
    monkeypatch, takes, want
):
    """jaxlib 0.11.2 / 0.12.0.1 turn a bf16 model's ``bf16 x bf16 -> f32`` products into
    float32 oneDNN products (the step took 1.5x as long); jaxlib 0.10.2 leaves them to XLA
    and gives oneDNN the float32 ones only (~1.06x faster): docs/performance.md."""
    monkeypatch.setattr(cpu_matmul, "onednn_takes_bf16_products", lambda: takes)
    assert cpu_matmul.resolve("auto", compute_dtype=jnp.bfloat16, platform="cpu") == want
    assert cpu_matmul.resolve("auto", compute_dtype=jnp.float16, platform="cpu") == "xla"
    assert cpu_matmul.resolve("onednn", compute_dtype=jnp.bfloat16, platform="cpu") == "onednn"
    assert cpu_matmul.resolve("auto", compute_dtype=jnp.bfloat16, platform="gpu") == "xla"


@pytest.mark.parametrize("takes", [True, False])
@pytest.mark.parametrize("listed", [True, False])
def test_evaluation_takes_onednn_for_float32_models_on_the_measured_jaxlibs(
    monkeypatch, takes, listed
):
    """A forward pass alone: "auto" gives a float32 model oneDNN's products on a jaxlib of
    `EVALUATION_ONEDNN_JAXLIBS` (XLA's on others), a bfloat16 one XLA's whatever the jaxlib;
    an explicit choice holds for evaluation too."""
    import jaxlib

    monkeypatch.setattr(cpu_matmul, "onednn_takes_bf16_products", lambda: takes)
    prefixes = (jaxlib.__version__[:3],) if listed else ("no-such-jaxlib",)
    monkeypatch.setattr(cpu_matmul, "EVALUATION_ONEDNN_JAXLIBS", prefixes)

    def resolve(choice, dtype, platform="cpu"):
        return cpu_matmul.resolve(choice, compute_dtype=dtype, platform=platform, evaluation=True)

    assert resolve("auto", jnp.float32) == ("onednn" if listed else "xla")
    assert resolve("auto", jnp.bfloat16) == "xla"
    assert resolve("onednn", jnp.bfloat16) == "onednn"
    assert resolve("xla", jnp.float32) == "xla"
    assert resolve("auto", jnp.float32, "gpu") == "xla"


# what `onednn_takes_bf16_products` measured on each jaxlib (docs/performance.md)
TAKES_BF16_PRODUCTS = {"0.10.2": False, "0.11.2": True, "0.12.0.1": True}


@pytest.fixture
def fresh_probe():
    cpu_matmul.onednn_takes_bf16_products.cache_clear()
    yield
    cpu_matmul.onednn_takes_bf16_products.cache_clear()


@pytest.mark.skipif(not CPU, reason="the probe compiles on the CPU backend")
def test_the_bf16_probe_reads_the_compiled_product(fresh_probe, monkeypatch):
    """No oneDNN options: no oneDNN fusion to find; options XLA rejects: counted as taking
    (XLA's products); the real options: what was measured on this jaxlib."""
    version = jaxlib.__version__
    with monkeypatch.context() as m:
        m.setattr(cpu_matmul, "ONEDNN_PRODUCTS", {})
        assert cpu_matmul.onednn_takes_bf16_products() is False
    cpu_matmul.onednn_takes_bf16_products.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(cpu_matmul, "ONEDNN_PRODUCTS", {"xla_cpu_no_such_option": True})
        assert cpu_matmul.onednn_takes_bf16_products() is True
    cpu_matmul.onednn_takes_bf16_products.cache_clear()
    if version not in TAKES_BF16_PRODUCTS:
        pytest.skip(f"jaxlib {version} not measured; add it to TAKES_BF16_PRODUCTS")
    assert cpu_matmul.onednn_takes_bf16_products() is TAKES_BF16_PRODUCTS[version]


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
@pytest.mark.parametrize(("dtype", "rtol"), [("float32", 1e-4), ("bfloat16", 1e-3)])
def test_onednn_and_xla_products_train_the_same_run(corpus_file, tmp_path, dtype, rtol):
    """Eight steps and the evaluation with the products "auto" picks (oneDNN's for a float32
    model; for a bf16 model where this jaxlib leaves its mixed products to XLA) against
    XLA's: the same losses and bits per byte to float32 tolerance (bf16: the float32
    attention products' rounding differences pass through bf16 activations), the same run
    identity, and each run's provenance names the products it trained with."""
    runs = {}
    for matmul in ("auto", "xla"):
        workdir = tmp_path / matmul
        config = _tiny(corpus_file, matmul)
        config.model.dtype = dtype
        summary = loop.train_and_evaluate(config, workdir)
        rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in rows if r["split"] == "train"]
        provenance = json.loads((workdir / "provenance.json").read_text())
        runs[matmul] = (summary, losses, provenance["train_matmul"])
    (a, a_losses, a_used), (b, b_losses, b_used) = runs["auto"], runs["xla"]
    onednn = dtype == "float32" or not cpu_matmul.onednn_takes_bf16_products()
    assert (a_used, b_used) == ("onednn" if onednn else "xla", "xla")
    assert len(a_losses) == 8
    np.testing.assert_allclose(a_losses, b_losses, rtol=rtol)
    np.testing.assert_allclose(
        [r["bits_per_byte"] for r in a["eval"]], [r["bits_per_byte"] for r in b["eval"]], rtol=rtol
    )
    assert a["config_hash"] == b["config_hash"]
