"""The padding trim's arithmetic (the tensors' side runs in the image: smoke's "padding trim keeps outputs")."""

from __future__ import annotations

import pytest

from verlbox.runtime.training.padding import trim_widths


def columns(text: str) -> list[bool]:
    return [mark == "x" for mark in text]


@pytest.mark.parametrize(
    ("used", "response_length", "expected"),
    [
        ("..xxxx|xxx..", 5, (2, 2)),  # verl's layout: prompts padded left, responses right
        ("xxxxxx|xxxxx", 5, (0, 0)),  # nothing padded in every row: nothing cut
        ("....xx|x....", 5, (4, 4)),  # one response token: one response column stays
        ("......|.....", 5, (5, 4)),  # an empty batch still keeps a prompt and a response column
        ("..x..x|x.x..", 5, (2, 2)),  # a column used by some row inside the span stays
    ],
)
def test_only_columns_padded_in_every_row_at_either_end_are_cut(
    used: str, response_length: int, expected: tuple[int, int]
) -> None:
    assert trim_widths(columns(used.replace("|", "")), response_length) == expected


def test_a_response_longer_than_the_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold a prompt"):
        trim_widths(columns("xxxx"), 4)
