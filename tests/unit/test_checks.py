"""memalloc/core/_checks.py: the one int check every layer uses."""

from __future__ import annotations

import pytest

from memalloc.core._checks import check_int


@pytest.mark.parametrize("value", [0, 3, 10])
def test_ints_in_bounds_pass_through(value):
    assert check_int("n", value, 0, 10) == value


@pytest.mark.parametrize(
    "value,low,high,message",
    [
        (-1, 0, None, "n must be an int >= 0, not -1"),
        (11, 0, 10, "n must be an int in 0..10, not 11"),
        (True, 0, None, "n must be an int >= 0, not True"),  # a bool is an int in Python, never a count
        (1.0, 0, None, "n must be an int >= 0, not 1.0"),
        ("3", 0, None, "n must be an int >= 0, not '3'"),
    ],
)
def test_the_message_names_the_bound_and_the_value(value, low, high, message):
    with pytest.raises(ValueError) as e:
        check_int("n", value, low, high)
    assert str(e.value) == message


def test_note_and_error_type():
    with pytest.raises(KeyError, match=r"steps must be an int >= 1 \(steps per probe\), not 0"):
        check_int("steps", 0, 1, note="steps per probe", error=KeyError)
