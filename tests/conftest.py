"""Test-wide JAX settings: implicit rank promotion is an error, as the design requires.

Tests marked ``notebook`` (executing notebooks/, about a minute) run only with
``--run-notebook`` or ``FLAXFORMER_LITE_RUN_NOTEBOOK=1`` (as .ci/run does).
"""

import os

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_addoption(parser):
    parser.addoption("--run-notebook", action="store_true", help="also execute the notebooks")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-notebook") or os.environ.get("FLAXFORMER_LITE_RUN_NOTEBOOK") == "1":
        return
    skip = pytest.mark.skip(reason="notebook: use --run-notebook or FLAXFORMER_LITE_RUN_NOTEBOOK=1")
    for item in items:
        if "notebook" in item.keywords:
            item.add_marker(skip)
