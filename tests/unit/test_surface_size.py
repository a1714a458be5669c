"""Issue 40's limits on what a newcomer has to hold, as ratchets: at most 30
public names in ``memalloc.__all__``, a README of at most 8,000 bytes, docs/
of at most 90,000 bytes together. A name that left the top level says where
it went, and that place exists."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import memalloc

REPO = Path(__file__).resolve().parents[2]


def test_at_most_30_public_names_each_defined():
    assert len(memalloc.__all__) <= 30, len(memalloc.__all__)
    assert len(set(memalloc.__all__)) == len(memalloc.__all__)
    assert [n for n in memalloc.__all__ if not hasattr(memalloc, n)] == []


def test_readme_and_docs_stay_within_their_sizes():
    readme = (REPO / "README.md").stat().st_size
    docs = sum(p.stat().st_size for p in (REPO / "docs").glob("*.md"))
    assert readme <= 8_000, readme
    assert docs <= 90_000, docs


def resolve(dotted: str) -> object:
    """memalloc.a.b.c: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("old", sorted(memalloc._MOVED))
def test_a_name_that_left_says_where_it_went(old):
    with pytest.raises(AttributeError, match=f"memalloc.{old} is no longer a top-level name: use "):
        getattr(memalloc, old)
    assert old not in memalloc.__all__
    target = memalloc._MOVED[old].split()[0].strip("`(),")
    if target.startswith("memalloc."):
        assert callable(resolve(target.split("(")[0])), target
