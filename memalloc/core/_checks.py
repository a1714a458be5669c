"""Checks of arguments that every layer makes the same way.

Invariant: a check passes the value through unchanged or raises the error
its caller names, with one message shape, ``NAME must be an int >= LOW
(NOTE), not VALUE`` (``in LOW..HIGH`` with an upper bound), so a user sees
one wording wherever memalloc takes an int. ``bool`` is refused though it
is an ``int`` in Python: ``True`` is never meant as a count.
"""

from __future__ import annotations

from typing import Any


def check_int(
    name: str,
    value: Any,
    low: int,
    high: int | None = None,
    *,
    note: str = "",
    error: type[Exception] = ValueError,
) -> int:
    """``value`` when it is an int (not a bool) in ``low``..``high`` (no upper
    bound when ``high`` is None); otherwise ``error`` naming ``name``, the
    bound, ``note`` (what the number counts, in parentheses) and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise error(f"{name} must be an int {bound}{f' ({note})' if note else ''}, not {value!r}")
    return value
