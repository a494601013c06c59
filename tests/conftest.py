"""Test-wide JAX settings: implicit rank promotion is an error, as the design requires.

Tests marked ``notebook`` (executing notebooks/, about a minute) run only with
``--run-notebook`` or ``FLAXFORMER_LITE_RUN_NOTEBOOK=1`` (as .ci/run does). The ``shared``
fixture builds an expensive, read-only test input once per run, across pytest-xdist workers.
The ``tiny_config`` fixture is the one way tests build a tiny `ModelConfig`.
"""

import fcntl
import os
import shutil

import jax
import pytest
from tiny_models import tiny_model_config

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True, scope="session")
def _float32_products_in_float32():
    """On GPUs XLA computes float32 matrix products in TF32 by default (10-bit mantissas:
    relative errors near 5e-4); the tests compare float32 results with numpy at float32
    tolerances, so they ask for float32 products there (on CPU it changes nothing)."""
    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "float32")
    yield


def pytest_addoption(parser):
    parser.addoption("--run-notebook", action="store_true", help="also execute the notebooks")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-notebook") or os.environ.get("FLAXFORMER_LITE_RUN_NOTEBOOK") == "1":
        return
    skip = pytest.mark.skip(reason="notebook: use --run-notebook or FLAXFORMER_LITE_RUN_NOTEBOOK=1")
    for item in items:
        if "notebook" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """``shared(name, produce)``: a directory that ``produce(directory)`` filled, once per test
    run even with pytest-xdist (a file lock in the temporary root all workers share), so tests
    of one module on different workers reuse it. Treat it as read-only."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # <run>/popen-gwN -> <run>

    def get(name, produce):
        directory = root / f"shared-{name}"
        with open(root / f"shared-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (directory / ".done").exists():
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir()
                produce(directory)
                (directory / ".done").write_text("")
        return directory

    return get


@pytest.fixture
def tiny_config():
    """`tiny_model_config`: ``tiny_config("rope", options={"base": 500.0}, d_model=32)``."""
    return tiny_model_config
