"""pytest helper: fail a test whose loop leaks memory.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["memalloc.pytest_plugin"]``
(memalloc must be enabled before the test runs, e.g. in a session fixture),
then::

    def test_training_loop_does_not_leak(memalloc_leaks):
        with memalloc_leaks(max_bytes_per_step=0):
            for batch in memalloc.steps_of(batches):
                train_step(batch)

The block fails the test with :class:`memalloc.errors.LeakError` (an
AssertionError whose message is the leak report) when the reported leaks
grow by more than ``max_bytes_per_step`` bytes per step. Other keyword
arguments are those of :class:`memalloc.leak_check`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from memalloc.features.leaks import leak_check


@pytest.fixture
def memalloc_leaks() -> Callable[..., leak_check]:
    """A factory of :class:`memalloc.leak_check` blocks that fail on leaks
    (``max_bytes_per_step`` defaults to 0 bytes)."""

    def make(max_bytes_per_step: float = 0, **kwargs: Any) -> leak_check:
        return leak_check(max_bytes_per_step=max_bytes_per_step, **kwargs)

    return make
