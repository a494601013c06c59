"""Synthetic tasks: generators and exact-match scorers agree; formats are what the docs say."""

import numpy as np
import pytest

from flaxformer_lite.data import get_task, task_names
from flaxformer_lite.data.tasks import add_digits

NAMES = task_names()


def _text(row) -> str:
    return bytes(np.asarray(row, np.uint8)).decode("latin-1")


def _sequence(batch, b=0) -> str:
    return _text(np.concatenate([batch["inputs"][b, :1], batch["targets"][b]]))


def _lengths(task):
    return sorted({min(task.train_lengths), max(task.train_lengths), max(task.eval_lengths)})


def test_registry_has_required_tasks():
    assert {"copy", "reverse", "associative_recall", "passkey"} <= set(NAMES)
    assert len(set(NAMES) & {"parity", "addition", "sort", "duplicate"}) >= 2
    with pytest.raises(ValueError, match=r"unknown task name 'cpy'; valid names: \['addition'"):
        get_task("cpy")


@pytest.mark.parametrize("name", NAMES)
def test_shapes_mask_and_shift(name):
    task = get_task(name)
    assert max(task.eval_lengths) > max(task.train_lengths)
    for length in _lengths(task):
        batch = task.sample(np.random.default_rng(0), 6, length)
        t = task.sequence_length(length)
        for key, dtype in (("inputs", np.int32), ("targets", np.int32), ("loss_mask", np.float32)):
            assert batch[key].shape == (6, t) and batch[key].dtype == dtype
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
        a = task.answer_length(length)
        expected = np.zeros((6, t), np.float32)
        expected[:, t - a :] = 1
        np.testing.assert_array_equal(batch["loss_mask"], expected)
        assert batch["inputs"].min() >= 0 and batch["inputs"].max() <= 255


@pytest.mark.parametrize("name", NAMES)
def test_scorer_agrees_with_generator(name):
    task = get_task(name)
    for length in _lengths(task):
        batch = task.sample(np.random.default_rng(1), 8, length)
        perfect = batch["targets"].copy()
        np.testing.assert_array_equal(task.exact_match(perfect, batch), np.ones(8, np.float32))
        wrong = perfect.copy()
        answer_cols = np.flatnonzero(batch["loss_mask"][0])
        wrong[0, answer_cols[-1]] = (wrong[0, answer_cols[-1]] + 1) % 256
        wrong[3, answer_cols[0]] = (wrong[3, answer_cols[0]] + 7) % 256
        score = task.exact_match(wrong, batch)
        np.testing.assert_array_equal(score, [0, 1, 1, 0, 1, 1, 1, 1])
        assert score.mean() < 1.0
        ignored = perfect.copy()
        ignored[:, 0] = (ignored[:, 0] + 1) % 256  # the first target is never part of an answer
        np.testing.assert_array_equal(task.exact_match(ignored, batch), np.ones(8))


@pytest.mark.parametrize("name", NAMES)
def test_seeded(name):
    task = get_task(name)
    length = max(task.train_lengths)
    a = task.sample(np.random.default_rng(5), 4, length)
    b = task.sample(np.random.default_rng(5), 4, length)
    c = task.sample(np.random.default_rng(6), 4, length)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert not np.array_equal(a["inputs"], c["inputs"])


def test_string_task_semantics():
    rng = np.random.default_rng(2)
    for name, answer in (
        ("copy", lambda s: s),
        ("reverse", lambda s: s[::-1]),
        ("sort", lambda s: "".join(sorted(s))),
        ("duplicate", lambda s: s + s),
    ):
        batch = get_task(name).sample(rng, 16, 9)
        for b in range(16):
            prompt, result = _sequence(batch, b).split("|")
            assert len(prompt) == 9 and set(prompt) <= set("abcdefghijklmnopqrstuvwxyz")
            assert result == answer(prompt)


def test_documented_examples_layout():
    assert get_task("copy").sequence_length(3) == 6
    assert get_task("duplicate").sequence_length(2) == 6
    assert get_task("parity").sequence_length(5) == 6
    assert get_task("addition").sequence_length(3) == 11
    assert get_task("associative_recall").sequence_length(3) == 8
    assert get_task("passkey").sequence_length(150) == 150
    assert get_task("passkey").min_length == 101


def test_parity_semantics():
    batch = get_task("parity").sample(np.random.default_rng(3), 32, 13)
    for b in range(32):
        bits, answer = _sequence(batch, b).split("=")
        assert len(bits) == 13 and set(bits) <= {"0", "1"}
        assert answer == str(bits.count("1") % 2)


@pytest.mark.parametrize("reverse_digits", [False, True])
def test_addition_semantics(reverse_digits):
    task = get_task("addition", reverse_digits=reverse_digits)
    batch = task.sample(np.random.default_rng(4), 64, 19)
    flip = (lambda s: s[::-1]) if reverse_digits else (lambda s: s)
    for b in range(64):
        lhs, c = _sequence(batch, b).split("=")
        a, bb = lhs.split("+")
        assert len(a) == len(bb) == 19 and len(c) == 20
        assert int(flip(a)) + int(flip(bb)) == int(flip(c))


def test_add_digits_carry_chains():
    a = np.array([[9, 9, 9, 9], [0, 0, 0, 1], [4, 9, 9, 5], [5, 0, 0, 0]])
    b = np.array([[0, 0, 0, 1], [9, 9, 9, 9], [5, 0, 0, 5], [5, 0, 0, 0]])
    got = ["".join(map(str, row)) for row in add_digits(a, b)]
    assert got == ["10000", "10000", "10000", "10000"]


def test_associative_recall_semantics():
    batch = get_task("associative_recall").sample(np.random.default_rng(5), 32, 40)
    for b in range(32):
        pairs, query = _sequence(batch, b).split("?")
        keys, values = pairs[0::2], pairs[1::2]
        assert len(keys) == 40 and len(set(keys)) == 40 and values.isdigit()
        assert dict(zip(keys, values, strict=True))[query[0]] == query[1]


def test_passkey_semantics_and_depth():
    task = get_task("passkey")
    batch = task.sample(np.random.default_rng(6), 16, 1024)
    for b in range(16):
        text = _sequence(batch, b)
        number = text[-5:]
        assert number.isdigit()
        assert text.count(f"The pass key is {number}. Remember it. {number} is the pass key. ") == 1
        assert text.endswith(f"What is the pass key? The pass key is {number}")
    depths = []
    for depth in (0.0, 0.5, 1.0):
        text = _sequence(task.sample(np.random.default_rng(7), 2, 2048, depth=depth))
        pos = text.index("The pass key is")
        depths.append(pos / len(text))
        assert pos == 0 or text[pos - 2 : pos] == ". "
    assert depths[0] == 0.0 and 0.4 < depths[1] < 0.6 and depths[2] > 0.85
    random_depths = {_sequence(batch, b).index("The pass key") for b in range(16)}
    assert len(random_depths) > 8  # the depth varies across the batch
    minimal = _sequence(task.sample(np.random.default_rng(0), 1, 101))
    assert minimal.startswith("The pass key is ")


def test_pad_to():
    task = get_task("copy")
    batch = task.sample(np.random.default_rng(0), 3, 5, pad_to=16)
    assert batch["inputs"].shape == (3, 16)
    assert batch["loss_mask"][:, 10:].sum() == 0 and batch["loss_mask"][:, 5:10].sum() == 15
    np.testing.assert_array_equal(batch["inputs"][:, 10:], 0)
    with pytest.raises(ValueError, match="pad_to must be >= the sequence length 10"):
        task.sample(np.random.default_rng(0), 3, 5, pad_to=9)


@pytest.mark.parametrize(
    ("name", "length", "message"),
    [
        ("copy", 0, "length=0: must be a positive int"),
        ("reverse", -3, "length=-3: must be a positive int"),
        ("associative_recall", 84, r"length for task 'associative_recall' must be in \[1, 83\]"),
        ("passkey", 100, "length for task 'passkey' must be >= 101, got 100"),
    ],
)
def test_bad_lengths(name, length, message):
    with pytest.raises(ValueError, match=message):
        get_task(name).sample(np.random.default_rng(0), 2, length)


def test_other_errors():
    task = get_task("copy")
    with pytest.raises(ValueError, match="batch_size=0: must be a positive int"):
        task.sample(np.random.default_rng(0), 0, 3)
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        task.sample(42, 2, 3)
    batch = task.sample(np.random.default_rng(0), 2, 3)
    with pytest.raises(ValueError, match=r"predictions must have the shape of batch\['targets'\]"):
        task.exact_match(np.zeros((2, 5)), batch)
    with pytest.raises(ValueError, match="eval_lengths for task 'associative_recall'"):
        get_task("associative_recall", eval_lengths=(10, 90))
    with pytest.raises(ValueError, match="alphabet must be non-empty bytes without"):
        get_task("copy", alphabet=b"ab|")
    with pytest.raises(ValueError, match="depth must be in"):
        get_task("passkey").sample(np.random.default_rng(0), 1, 200, depth=1.5)
