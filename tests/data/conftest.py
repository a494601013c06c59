"""Fixtures for the data tests: every test gets its own cache root, nothing touches ~/.cache."""

import numpy as np
import pytest

from flaxformer_lite.data import store


@pytest.fixture(autouse=True)
def cache_env(tmp_path_factory, monkeypatch):
    """Points $FLAXFORMER_LITE_CACHE at a fresh temporary directory and returns it."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv(store.CACHE_ENV, str(root))
    return root


@pytest.fixture
def random_bytes():
    """`random_bytes(n, seed)`: n random bytes covering all 256 values (not valid UTF-8)."""

    def make(n: int, seed: int = 0) -> bytes:
        return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()

    return make
