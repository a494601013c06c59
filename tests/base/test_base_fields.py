"""`base.fields.field_comments`: each way a config dataclass documents a field, read back."""

from __future__ import annotations

import dataclasses

from flaxformer_lite.base.fields import field_comments
from flaxformer_lite.train import run_config


@dataclasses.dataclass(frozen=True)
class Parent:
    inherited: int = 1  # from the parent


@dataclasses.dataclass(frozen=True)
class Example(Parent):
    trailing: int = 0  # at the line's end
    # a block above,
    # two lines long
    above: str = "# not a comment"
    continued: float = 1.0  # a trailing comment
    # continued below it
    next_one: bool = False  # has its own
    # shared by the pair
    first_of_pair: int = 1
    second_of_pair: int = 2

    plain: int = 3
    last: tuple[int, ...] = (  # split over
        1,
        2,
    )  # lines


def test_each_form_of_field_comment_is_read_back():
    assert field_comments(Example) == {
        "inherited": "from the parent",
        "trailing": "at the line's end",
        "above": "a block above, two lines long",
        "continued": "a trailing comment continued below it",
        "next_one": "has its own",
        "first_of_pair": "shared by the pair",
        "second_of_pair": "shared by the pair",
        "plain": "",
        "last": "split over lines",
    }


def test_every_run_config_field_has_a_meaning_and_a_type():
    docs = run_config.field_docs()
    assert docs["train.num_steps"] == ("int", "optimizer steps")
    assert docs["model.positional_options.rope.base"][0] == "float"
    assert docs["model.positional_options.rope.base"][1].startswith("frequency base")
    assert docs["eval.max_bytes"][1].startswith("0: every target of the split; N:")
    missing = sorted(name for name, (_, meaning) in docs.items() if not meaning)
    assert missing == []
