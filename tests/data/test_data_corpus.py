"""ByteCorpus: splits, determinism, batches, provenance, errors."""

import hashlib

import numpy as np
import pytest

from flaxformer_lite.data import SEPARATOR, SPLITS, ByteCorpus, split_for_name, store


def _split_bytes(corpus, name):
    return bytes(np.asarray(corpus.split(name).data))


def _make_folder(root, count, seed=0, size=40):
    """`count` files with random bytes in nested folders; returns {relative name: bytes}."""
    rng = np.random.default_rng(seed)
    files = {}
    for i in range(count):
        name = f"d{i % 3}/sub{i % 2}/file_{i:03d}.txt" if i % 4 else f"top_{i:03d}.bin"
        data = rng.integers(0, 256, size=int(rng.integers(1, size)), dtype=np.uint8).tobytes()
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[name] = data
    return files


# ------------------------------------------------------------------------------ single file


def test_single_file_split_is_contiguous_90_5_5(tmp_path, random_bytes):
    data = random_bytes(10_000)
    path = tmp_path / "corpus.bin"
    path.write_bytes(data)
    corpus = ByteCorpus.from_path(path)
    assert _split_bytes(corpus, "train") == data[:9000]
    assert _split_bytes(corpus, "validation") == data[9000:9500]
    assert _split_bytes(corpus, "test") == data[9500:]
    prov = corpus.provenance()
    assert prov["splits"]["validation"]["byte_range"] == [9000, 9500]
    assert prov["num_bytes"] == 10_000 and prov["num_files"] == 1
    assert prov["separator"] is None


def test_single_file_custom_fractions_and_memmap(tmp_path, random_bytes):
    path = tmp_path / "c.txt"
    path.write_bytes(random_bytes(1000))
    corpus = ByteCorpus.from_path(str(path), split=(0.5, 0.25, 0.25))
    assert [corpus.split(s).num_tokens for s in SPLITS] == [500, 250, 250]
    assert isinstance(corpus.split("train").data, np.memmap)
    assert corpus.split("train").data.dtype == np.uint8


def test_provenance_hash_definition(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"hello world, hello bytes")
    name = b"x.txt"
    data = path.read_bytes()
    ref = hashlib.sha256(
        len(name).to_bytes(8, "little") + name + len(data).to_bytes(8, "little") + data
    ).hexdigest()
    assert ByteCorpus.from_path(path).provenance()["sha256"] == ref


# -------------------------------------------------------------------------- folder and list


def test_folder_split_by_file_is_disjoint_and_matches_rule(tmp_path, cache_env):
    files = _make_folder(tmp_path / "src", 150)
    corpus = ByteCorpus.from_path(tmp_path / "src")
    sep = bytes([SEPARATOR])
    for split in SPLITS:
        names = sorted(n for n in files if split_for_name(n) == split)
        assert names, split
        expected = b"".join(files[n] + sep for n in names)
        assert _split_bytes(corpus, split) == expected
        assert corpus.split(split).num_files == len(names)
    prov = corpus.provenance()
    assert prov["num_files"] == 150
    assert sum(prov["splits"][s]["num_files"] for s in SPLITS) == 150
    assert prov["num_bytes"] == sum(len(d) + 1 for d in files.values())
    assert prov["cache_dir"].startswith(str(cache_env))
    # content hash: ordered (sorted) file list, names and bytes
    ref = store.content_sha256([(n, tmp_path / "src" / n) for n in sorted(files)])
    assert prov["sha256"] == ref


def test_folder_split_is_deterministic_and_stable_when_files_are_added(tmp_path):
    files = _make_folder(tmp_path / "a", 120)
    first = ByteCorpus.from_path(tmp_path / "a", cache_dir=tmp_path / "c1")
    again = ByteCorpus.from_path(tmp_path / "a", cache_dir=tmp_path / "c2")
    for s in SPLITS:
        assert _split_bytes(first, s) == _split_bytes(again, s)
    assert first.provenance()["sha256"] == again.provenance()["sha256"]
    # A new file changes the corpus hash but moves no existing file to another split.
    (tmp_path / "a" / "new_file.txt").write_bytes(b"a new document")
    grown = ByteCorpus.from_path(tmp_path / "a", cache_dir=tmp_path / "c1")
    assert grown.provenance()["sha256"] != first.provenance()["sha256"]
    new_split = split_for_name("new_file.txt")
    for s in SPLITS:
        old = _split_bytes(first, s)
        new = _split_bytes(grown, s)
        if s == new_split:
            assert len(new) == len(old) + len(b"a new document") + 1
        else:
            assert new == old
    assert len(files) == 120


def test_hidden_files_are_skipped(tmp_path):
    _make_folder(tmp_path / "src", 100)
    plain = ByteCorpus.from_path(tmp_path / "src", cache_dir=tmp_path / "c1")
    (tmp_path / "src" / ".hidden").write_bytes(b"secret")
    (tmp_path / "src" / ".git").mkdir()
    (tmp_path / "src" / ".git" / "HEAD").write_bytes(b"ref")
    with_hidden = ByteCorpus.from_path(tmp_path / "src", cache_dir=tmp_path / "c2")
    assert plain.provenance()["sha256"] == with_hidden.provenance()["sha256"]


def test_list_of_files_keeps_order(tmp_path):
    rng = np.random.default_rng(1)
    paths, datas = [], []
    for i in range(80):
        p = tmp_path / f"doc{i:02d}.txt"
        d = rng.integers(0, 256, size=30, dtype=np.uint8).tobytes()
        p.write_bytes(d)
        paths.append(p)
        datas.append(d)
    order = list(rng.permutation(80))
    corpus = ByteCorpus.from_path([paths[i] for i in order])
    for s in SPLITS:
        expected = b"".join(
            datas[i] + b"\0" for i in order if split_for_name(f"doc{i:02d}.txt") == s
        )
        assert _split_bytes(corpus, s) == expected
    ref = store.content_sha256([(f"doc{i:02d}.txt", paths[i]) for i in order])
    assert corpus.provenance()["sha256"] == ref


def test_non_utf8_bytes_round_trip(tmp_path):
    data = bytes(range(256)) * 40 + b"\xff\xfe\x80 not utf-8 \xc3\x28"
    path = tmp_path / "binary.dat"
    path.write_bytes(data)
    corpus = ByteCorpus.from_path(path)
    joined = b"".join(_split_bytes(corpus, s) for s in SPLITS)
    assert joined == data
    batch = corpus.split("train").sample_batch(np.random.default_rng(0), 4, 64)
    assert batch["inputs"].max() <= 255 and batch["inputs"].min() >= 0


# ---------------------------------------------------------------------------- sample_batch


@pytest.fixture
def small_corpus(tmp_path, random_bytes):
    path = tmp_path / "small.bin"
    path.write_bytes(random_bytes(20_000, seed=3))
    return ByteCorpus.from_path(path)


def test_sample_batch_shapes_dtypes_and_shift(small_corpus):
    split = small_corpus.split("train")
    batch = split.sample_batch(np.random.default_rng(0), 8, 100)
    assert set(batch) == {"inputs", "targets", "loss_mask"}
    assert batch["inputs"].shape == batch["targets"].shape == batch["loss_mask"].shape == (8, 100)
    assert batch["inputs"].dtype == np.int32 and batch["targets"].dtype == np.int32
    assert batch["loss_mask"].dtype == np.float32
    np.testing.assert_array_equal(batch["loss_mask"], np.ones((8, 100), np.float32))
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    data = bytes(np.asarray(split.data))
    for row_in, row_t in zip(batch["inputs"], batch["targets"], strict=True):
        window = bytes(row_in.astype(np.uint8)) + bytes(row_t[-1:].astype(np.uint8))
        assert data.find(window) >= 0


def test_sample_batch_seeded(small_corpus):
    split = small_corpus.split("train")
    a = split.sample_batch(np.random.default_rng(7), 4, 64)
    b = split.sample_batch(np.random.default_rng(7), 4, 64)
    c = split.sample_batch(np.random.default_rng(8), 4, 64)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])
    assert not np.array_equal(a["inputs"], c["inputs"])
    rng = np.random.default_rng(7)
    first, second = split.sample_batch(rng, 4, 64), split.sample_batch(rng, 4, 64)
    np.testing.assert_array_equal(first["inputs"], a["inputs"])
    assert not np.array_equal(first["inputs"], second["inputs"])


def test_sample_batch_window_may_reach_last_byte(tmp_path):
    # A split of exactly length + 1 bytes has exactly one window.
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"0123456789" * 2)  # 20 bytes: train 18, validation 1, test 1
    split = ByteCorpus.from_path(path).split("train")
    batch = split.sample_batch(np.random.default_rng(0), 3, 17)
    expected = np.frombuffer(b"0123456789012345678"[:18], np.uint8).astype(np.int32)
    np.testing.assert_array_equal(batch["inputs"], np.tile(expected[:-1], (3, 1)))
    np.testing.assert_array_equal(batch["targets"], np.tile(expected[1:], (3, 1)))


# ------------------------------------------------------------------------------------- errors


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="path_or_paths: no such file or directory"):
        ByteCorpus.from_path(tmp_path / "nope.txt")
    (tmp_path / "real.txt").write_bytes(b"x" * 100)
    with pytest.raises(FileNotFoundError, match=r"nope2\.txt"):
        ByteCorpus.from_path([tmp_path / "real.txt", tmp_path / "nope2.txt"])


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty corpus file \(0 bytes\)"):
        ByteCorpus.from_path(tmp_path / "empty.txt")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ValueError, match="contains no files"):
        ByteCorpus.from_path(tmp_path / "emptydir")
    (tmp_path / "zeros").mkdir()
    for i in range(5):
        (tmp_path / "zeros" / f"{i}.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty corpus 'zeros': 5 files with 0 bytes"):
        ByteCorpus.from_path(tmp_path / "zeros")
    with pytest.raises(ValueError, match="empty list"):
        ByteCorpus.from_path([])


def test_too_few_files_for_a_split(tmp_path):
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.txt").write_bytes(b"a" * 100)
    (tmp_path / "two" / "b.txt").write_bytes(b"b" * 100)
    with pytest.raises(ValueError, match=r"would be empty.*assigned none of its 2 files"):
        ByteCorpus.from_path(tmp_path / "two")


def test_too_small_single_file(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"abc")
    with pytest.raises(ValueError, match="has 3 bytes, too few"):
        ByteCorpus.from_path(tmp_path / "t.txt")


@pytest.mark.parametrize("split", [(0.9, 0.1), (0.9, 0.1, 0.1), (1.0, 0.0, 0.0), "abc"])
def test_bad_fractions(tmp_path, split):
    (tmp_path / "t.txt").write_bytes(b"abc" * 100)
    with pytest.raises(ValueError, match="split must be three positive fractions"):
        ByteCorpus.from_path(tmp_path / "t.txt", split=split)


def test_split_shorter_than_window(small_corpus):
    split = small_corpus.split("validation")  # 1000 bytes
    with pytest.raises(ValueError, match=r"has 1000 bytes; .*length=1000 needs at least 1001"):
        split.sample_batch(np.random.default_rng(0), 2, 1000)
    with pytest.raises(ValueError, match=r"has 1000 bytes; an evaluation window of length=4096"):
        split.eval_batches(4096, 4)
    with pytest.raises(ValueError, match=r"has 100 bytes \(limited by max_bytes\); an eval"):
        split.eval_windows(200, max_bytes=99)
    split.sample_batch(np.random.default_rng(0), 2, 999)  # exactly enough


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0, "length": 8}, "batch_size=0: must be a positive int"),
        ({"batch_size": -2, "length": 8}, "batch_size=-2: must be a positive int"),
        ({"batch_size": 2.5, "length": 8}, "batch_size=2.5: must be a positive int"),
        ({"batch_size": 2, "length": 0}, "length=0: must be a positive int"),
        ({"batch_size": 2, "length": -1}, "length=-1: must be a positive int"),
    ],
)
def test_bad_batch_arguments(small_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_corpus.split("train").sample_batch(np.random.default_rng(0), **kwargs)


def test_bad_rng_and_split_name(small_corpus):
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        small_corpus.split("train").sample_batch(0, 2, 8)
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'validation', 'test'\]"):
        small_corpus.split("valid")
