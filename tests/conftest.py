"""Fixtures shared by the test files."""
import gc

import pytest

from memalloc import _C


@pytest.fixture
def host_allocator():
    """A fresh host-backend allocator (64 MiB), not installed; validated after
    the test once its tensors are collected."""
    a = _C.Allocator("host", "host_capacity_mb:64")
    yield a
    gc.collect()
    a.validate()
