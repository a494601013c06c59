"""Evaluation windows: both protocols score every target position exactly once."""

import numpy as np
import pytest

from flaxformer_lite.data import ByteCorpus, windows
from flaxformer_lite.data.corpus import Split


def _split(data: bytes) -> Split:
    return Split(np.frombuffer(data, np.uint8), name="validation", corpus="t", num_files=1)


def reference_windows(data: np.ndarray, length: int, stride: int):
    """Naive reference: slide by `stride`; each window scores the not-yet-scored targets it holds.

    Returns a list of (inputs, targets, mask) with padding (0, mask 0) past the end."""
    n = data.shape[0]
    out, next_unscored, start = [], 1, 0
    while next_unscored <= n - 1:
        inputs = np.zeros(length, np.int32)
        targets = np.zeros(length, np.int32)
        mask = np.zeros(length, np.float32)
        for j in range(length):
            if start + j < n:
                inputs[j] = data[start + j]
            p = start + j + 1  # target position
            if p < n:
                targets[j] = data[p]
                if p >= next_unscored:
                    mask[j] = 1.0
        next_unscored = min(start + length, n - 1) + 1
        out.append((inputs, targets, mask))
        start += stride
    return out


CASES = [  # (n, length, stride)
    (101, 10, None),
    (100, 10, None),
    (102, 10, None),
    (11, 10, None),
    (12, 10, None),
    (101, 10, 10),
    (101, 10, 1),
    (101, 10, 3),
    (250, 16, 7),
    (17, 16, 4),
    (1000, 64, 32),
    (333, 32, 31),
]


@pytest.mark.parametrize(("n", "length", "stride"), CASES)
def test_windows_match_reference_and_cover_once(n, length, stride, random_bytes):
    data = random_bytes(n, seed=n + length)
    split = _split(data)
    arr = np.frombuffer(data, np.uint8)
    got = list(split.eval_windows(length, stride=stride))
    ref = reference_windows(arr, length, stride or length)
    assert len(got) == len(ref) == split.num_eval_windows(length, stride=stride)
    for w, (inputs, targets, mask) in zip(got, ref, strict=True):
        assert w["inputs"].shape == w["targets"].shape == w["loss_mask"].shape == (length,)
        assert w["inputs"].dtype == np.int32 and w["loss_mask"].dtype == np.float32
        np.testing.assert_array_equal(w["inputs"], inputs)
        np.testing.assert_array_equal(w["targets"], targets)
        np.testing.assert_array_equal(w["loss_mask"], mask)
    # Implementation-independent: the scored targets, in order, are exactly bytes 1..n-1.
    scored = np.concatenate([w["targets"][w["loss_mask"] == 1] for w in got])
    np.testing.assert_array_equal(scored, arr[1:].astype(np.int32))


@pytest.mark.parametrize(("length", "stride"), [(32, 8), (32, 1), (16, 16)])
def test_sliding_window_context(length, stride, random_bytes):
    data = random_bytes(500, seed=1)
    arr = np.frombuffer(data, np.uint8)
    windows = list(_split(data).eval_windows(length, stride=stride))
    assert windows[0]["loss_mask"].sum() == length  # the first window scores all its targets
    for k, w in enumerate(windows):
        cols = np.flatnonzero(w["loss_mask"])
        if k > 0:
            assert cols.size <= stride
            assert cols.min() >= length - stride  # context >= length - stride + 1 bytes
        start = k * stride
        for j in cols:  # the inputs before each scored target are the true preceding bytes
            np.testing.assert_array_equal(w["inputs"][: j + 1], arr[start : start + j + 1])


def test_max_bytes_and_max_windows(random_bytes):
    data = random_bytes(1000, seed=5)
    arr = np.frombuffer(data, np.uint8)
    split = _split(data)
    windows = list(split.eval_windows(50, max_bytes=300))  # the bytes within the first 301
    assert len(windows) == 6
    scored = np.concatenate([w["targets"][w["loss_mask"] == 1] for w in windows])
    np.testing.assert_array_equal(scored, arr[1:301])
    np.testing.assert_array_equal(
        np.concatenate([w["target_position"][w["loss_mask"] == 1] for w in windows]),
        np.arange(1, 301),  # a byte corpus: each target is its own position and byte
    )
    first = list(split.eval_windows(50, stride=10, max_windows=4))
    assert len(first) == 4
    scored = np.concatenate([w["targets"][w["loss_mask"] == 1] for w in first])
    np.testing.assert_array_equal(scored, arr[1 : 50 + 3 * 10 + 1])
    # max_bytes larger than the split means the whole split
    assert split.num_eval_windows(50, max_bytes=10**9) == split.num_eval_windows(50)


def test_eval_batches_equal_windows(random_bytes):
    data = random_bytes(1234, seed=9)
    split = _split(data)
    batches = list(split.eval_batches(64, 5, stride=16))
    windows = list(split.eval_windows(64, stride=16))
    assert [b["inputs"].shape[0] for b in batches] == [5] * (len(windows) // 5) + (
        [len(windows) % 5] if len(windows) % 5 else []
    )
    for key in ("inputs", "targets", "loss_mask"):
        np.testing.assert_array_equal(
            np.concatenate([b[key] for b in batches]), np.stack([w[key] for w in windows])
        )
    padded = list(split.eval_batches(64, 5, stride=16, pad_batch=True))
    assert all(b["inputs"].shape == (5, 64) for b in padded)
    assert sum(b["loss_mask"].sum() for b in padded) == 1233


def test_window_count_formula():
    split = _split(bytes(1001))
    # 1000 targets, non-overlapping L=100: exactly 10 windows; sliding S=25: 1 + ceil(900/25).
    assert split.num_eval_windows(100) == 10
    assert split.num_eval_windows(100, stride=25) == 37
    assert split.num_eval_windows(1000) == 1


def test_window_errors(random_bytes):
    split = _split(random_bytes(100))
    with pytest.raises(ValueError, match="stride must be between 1 and length=10"):
        split.eval_windows(10, stride=11)
    with pytest.raises(ValueError, match="stride=0: must be a positive int"):
        split.eval_windows(10, stride=0)
    with pytest.raises(ValueError, match=r"max_windows=.*: must be a positive int"):
        split.eval_windows(10, max_windows=0)
    with pytest.raises(ValueError, match=r"batch_size=.*: must be a positive int"):
        split.eval_batches(10, 0)
    with pytest.raises(ValueError, match="length=-5: must be a positive int"):
        split.eval_batches(-5, 2)


def test_windows_over_real_file_split(tmp_path, random_bytes):
    data = random_bytes(20_000, seed=2)
    (tmp_path / "f.bin").write_bytes(data)
    validation = ByteCorpus.from_path(tmp_path / "f.bin").split("validation")
    arr = np.frombuffer(data[18_000:19_000], np.uint8)
    for stride in (None, 100, 7):
        scored = np.concatenate(
            [
                b["targets"][b["loss_mask"] == 1]
                for b in validation.eval_batches(128, 8, stride=stride)
            ]
        )
        np.testing.assert_array_equal(scored, arr[1:])


def _key_targets_by_search(data, starts, block, near, far, ngram):
    """`copy_key_targets` by searching every earlier start of each target's n-gram."""
    out = np.zeros((len(starts), block), bool)
    for b, p0 in enumerate(starts):
        for j in range(block):
            p = p0 + j
            gram = data[p - ngram + 1 : p + 1]
            earlier = [q for q in range(p - ngram + 1) if (data[q : q + ngram] == gram).all()]
            out[b, j] = any(q >= p0 - far for q in earlier) and not any(
                q >= p0 - near for q in earlier
            )
    return out


@pytest.mark.parametrize("dtype, alphabet", [(np.uint8, 3), (np.int32, 70000)])
def test_copy_key_targets_equal_a_search_of_every_earlier_copy(dtype, alphabet):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 3, size=2500).astype(dtype) * (alphabet // 3)  # repeats often
    starts = np.array([450, 800, 1333, 2400])
    got = windows.copy_key_targets(data, starts, block=24, near=30, far=420, ngram=5)
    expected = _key_targets_by_search(data, starts, 24, 30, 420, 5)
    np.testing.assert_array_equal(got, expected)
    assert 0 < got.sum() < got.size  # both kinds occur: the comparison means something


def test_copy_key_targets_find_a_copy_only_beyond_the_near_context():
    motif = np.arange(40, dtype=np.uint8)  # no n-gram repeats inside it
    data = np.tile(motif, 10)
    # every target's 8-gram last occurred 40 tokens earlier: beyond near = 20, within far = 100
    key = windows.copy_key_targets(data, np.array([200, 300]), block=10, near=20, far=100)
    assert key.all()
    # near = 60 sees the copy 40 + 7 tokens back from the block's first target: no key target
    assert not windows.copy_key_targets(data, np.array([200]), block=1, near=60, far=100).any()
    with pytest.raises(ValueError, match="ngram <= near < far"):
        windows.copy_key_targets(data, np.array([200]), block=4, near=100, far=100)
    with pytest.raises(ValueError, match="100 tokens before each block"):
        windows.copy_key_targets(data, np.array([50]), block=4, near=20, far=100)
