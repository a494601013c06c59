"""Checkpoints (`train.checkpoint`): a corrupt newest step falls back to the previous one with a
warning, never crashes or mixes steps; a checkpoint restores without pickle.

(End to end through a study, with a corrupted results line too:
tests/integration/test_integration_kill_resume.py.)"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.train.checkpoint import Checkpointer

# orbax leaves un-awaited read coroutines behind when it fails to read a corrupted step
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def make_state(offset: float) -> dict:
    rng = np.random.default_rng(0)
    return {
        "params": {
            "w": jnp.asarray(rng.normal(size=(64, 48)) + offset, jnp.float32),
            "b": jnp.asarray(rng.normal(size=(48,)) + offset, jnp.bfloat16),
        },
        "step": jnp.asarray(int(offset), jnp.int32),
        "key": jax.random.key(int(offset)),
    }


def leaves(state) -> list[np.ndarray]:
    out = []
    for x in jax.tree.leaves(state):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out.append(np.asarray(x))
    return out


def equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(b), strict=True))


def restore(directory: Path, abstract):
    ckpt = Checkpointer(directory, keep=3)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = ckpt.restore_latest(abstract)
    finally:
        ckpt.close()
    return restored, [str(w.message) for w in caught if w.category is RuntimeWarning]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Checkpoints of steps 1 and 2 (different values)."""
    directory = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    ckpt = Checkpointer(directory, keep=3)
    ckpt.save(1, make_state(1.0))
    ckpt.save(2, make_state(2.0))
    ckpt.close()
    return directory


def _corrupt(path: Path, mode: str) -> None:
    data = path.read_bytes()
    if mode == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif mode == "flip":  # a few bytes in the middle
        b = bytearray(data)
        for i in range(len(b) // 2, min(len(b), len(b) // 2 + 3)):
            b[i] ^= 0x5A
        path.write_bytes(bytes(b))
    elif mode == "zero":
        path.write_bytes(bytes(len(data)))
    else:
        path.unlink()


def test_every_corruption_of_the_newest_step_restores_it_exactly_or_falls_back(saved, tmp_path):
    """Each file of step 2, truncated / bit-flipped / zeroed / deleted: restore_latest never
    raises, and returns either step 2 with exactly its values or step 1 with exactly its
    values and a warning naming step 2 — never a mix or wrong numbers."""
    files = sorted(p.relative_to(saved) for p in (saved / "2").rglob("*") if p.is_file())
    assert len(files) > 5
    fallbacks = 0
    abstract = make_state(0.0)
    for rel in files:
        for mode in ("truncate", "flip", "zero", "delete"):
            work = tmp_path / "c"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(saved, work)
            _corrupt(work / rel, mode)
            restored, messages = restore(work, abstract)
            assert restored is not None, (rel, mode)
            state, step = restored
            if step == 2:
                assert equal(state, make_state(2.0)), (rel, mode, "wrong values at step 2")
            else:
                assert step == 1 and equal(state, make_state(1.0)), (rel, mode)
                assert any("checkpoint step 2" in m and "falling back" in m for m in messages)
                fallbacks += 1
    assert fallbacks >= len(files)  # the array data and metadata files did matter


def test_arrays_that_decode_but_differ_from_the_digest_are_rejected(saved, tmp_path):
    """A step whose bytes decode to other numbers (a flipped bit in uncompressed data, or a
    step directory copied from elsewhere) fails its digest: fall back."""
    work = tmp_path / "c"
    shutil.copytree(saved, work)
    (digest_file,) = [p for p in (work / "2" / "digest").rglob("*") if p.name == "metadata"]
    digest = json.loads(digest_file.read_text())
    key = sorted(digest["leaves"])[0]
    digest["leaves"][key] = digest["leaves"][key][:-8] + "00000000"
    digest_file.write_text(json.dumps(digest))
    (state, step), messages = restore(work, make_state(0.0))
    assert step == 1 and equal(state, make_state(1.0))
    assert any("differ from their saved digest" in m and key in m for m in messages), messages


def test_a_step_directory_from_another_step_is_rejected(saved, tmp_path):
    work = tmp_path / "c"
    shutil.copytree(saved, work)
    shutil.rmtree(work / "2")
    shutil.copytree(work / "1", work / "2")  # "step 2" now holds step 1's state
    (_, step), messages = restore(work, make_state(0.0))
    assert step == 1
    assert any("digest names step" in m for m in messages), messages


def test_no_readable_checkpoint_starts_fresh_with_a_warning(saved, tmp_path):
    work = tmp_path / "c"
    shutil.copytree(saved, work)
    for step in ("1", "2"):
        for p in (work / step / "state").rglob("*"):
            if p.is_file():
                _corrupt(p, "zero")
    abstract = make_state(0.0)
    before = leaves(abstract)
    restored, messages = restore(work, abstract)
    assert restored is None
    assert any("starting from scratch" in m for m in messages), messages
    assert all(np.array_equal(a, b) for a, b in zip(before, leaves(abstract), strict=True))


def test_a_step_found_unreadable_is_replaced_when_recomputed(saved, tmp_path):
    work = tmp_path / "c"
    shutil.copytree(saved, work)
    for p in (work / "2" / "state").rglob("*"):
        if p.is_file():
            _corrupt(p, "truncate")
    ckpt = Checkpointer(work, keep=3)
    with pytest.warns(RuntimeWarning, match="checkpoint step 2"):
        _, step = ckpt.restore_latest(make_state(0.0))
    assert step == 1
    ckpt.save(2, make_state(2.0))  # training from step 1 reached step 2 again
    ckpt.save(1, make_state(5.0))  # a readable step is never overwritten
    ckpt.close()
    (state, step), messages = restore(work, make_state(0.0))
    assert step == 2 and equal(state, make_state(2.0)) and messages == []
    ckpt = Checkpointer(work, keep=3)
    assert equal(ckpt.restore(1, make_state(0.0)), make_state(1.0))
    ckpt.close()


@pytest.fixture
def no_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used to load data")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


def test_checkpoints_load_without_pickle(tmp_path, no_pickle):
    """A checkpoint restores (arrays, a bfloat16 leaf, a PRNG key) with pickle refused."""
    state = {
        "params": {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4, jnp.bfloat16)},
        "step": jnp.asarray(7, jnp.int32),
        "key": jax.random.key(3),
    }
    ckpt = Checkpointer(tmp_path / "ckpt", keep=2)
    ckpt.save(7, state)
    restored, step = ckpt.restore_latest(state)
    ckpt.close()
    assert step == 7
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
