"""The backend's virtual memory on the host backend (csrc/backend.h,
backend_host.cpp), the bottom layer of expandable segments, through the test
hooks memalloc._C._testing.vm_*: address space is reserved without memory,
pages are backed (and counted as device memory in use) only while mapped,
and misuse is refused with the rule it breaks. In-process, on allocators the
tests own."""
from __future__ import annotations

import ctypes

import pytest
import torch

import memalloc
from memalloc import _C

T = _C._testing
MiB = 1 << 20
PAGE = 2 * MiB


@pytest.fixture
def a():
    allocator = memalloc.Allocator("host", "host_capacity_mb:16")
    yield allocator
    allocator.validate()


def free_bytes(a) -> int:
    return a.mem_get_info(0)[0]


def test_reserving_takes_address_space_not_memory(a):
    assert T.vm_page_size(a) == PAGE
    base = T.vm_reserve(a, 64 * MiB)  # four times the device: address space only
    assert base != 0 and base % PAGE == 0
    assert free_bytes(a) == 16 * MiB
    T.vm_free(a, base)


def test_mapped_pages_are_memory_in_use_and_usable(a):
    base = T.vm_reserve(a, 64 * MiB)
    assert T.vm_map(a, base + PAGE, 4 * MiB) is True
    assert free_bytes(a) == 12 * MiB
    ctypes.memset(base + PAGE, 7, 4 * MiB)
    assert ctypes.string_at(base + PAGE, 3) == b"\x07\x07\x07"
    assert ctypes.string_at(base + 5 * MiB - 1, 1) == b"\x07"
    T.vm_unmap(a, base + PAGE, 2 * MiB)  # half of it
    assert free_bytes(a) == 14 * MiB
    assert T.vm_map(a, base + PAGE, 2 * MiB)
    assert ctypes.string_at(base + PAGE, 1) == b"\x00"  # a fresh page
    T.vm_unmap(a, base + PAGE, 4 * MiB)
    assert free_bytes(a) == 16 * MiB
    T.vm_free(a, base)


def test_mapping_beyond_the_device_is_refused_and_changes_nothing(a):
    base = T.vm_reserve(a, 64 * MiB)
    assert T.vm_map(a, base, 12 * MiB)
    assert T.vm_map(a, base + 12 * MiB, 6 * MiB) is False  # 4 MiB left
    assert free_bytes(a) == 4 * MiB
    assert T.vm_map(a, base + 12 * MiB, 4 * MiB)  # the same pages, within the device: mapped
    # segments of the caching allocator share the device's memory with mappings
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(MiB)
    T.vm_unmap(a, base, 16 * MiB)
    p = a.malloc(MiB)
    assert not base <= p < base + 64 * MiB  # a segment never lands in a reservation
    a.free(p)
    a.empty_cache()
    T.vm_free(a, base)


def test_injected_faults_refuse_a_map(a):
    base = T.vm_reserve(a, 8 * MiB)
    T.inject_allocate_faults(a, 0, 1)
    assert T.vm_map(a, base, PAGE) is False
    assert free_bytes(a) == 16 * MiB
    assert T.vm_map(a, base, PAGE)
    T.vm_unmap(a, base, PAGE)
    T.vm_free(a, base)


def test_misuse_is_refused_with_the_rule(a):
    base = T.vm_reserve(a, 8 * MiB)
    assert T.vm_map(a, base, PAGE)
    with pytest.raises(memalloc.InvalidArgumentError, match="already mapped"):
        T.vm_map(a, base, 4 * MiB)
    with pytest.raises(memalloc.InvalidArgumentError, match="not mapped"):
        T.vm_unmap(a, base, 4 * MiB)
    with pytest.raises(memalloc.InvalidArgumentError, match="multiples of the page size"):
        T.vm_map(a, base + 4096, PAGE)
    with pytest.raises(memalloc.InvalidArgumentError, match="in no reservation"):
        T.vm_map(a, base + 8 * MiB, PAGE)
    with pytest.raises(memalloc.InvalidArgumentError, match="unmap every page"):
        T.vm_free(a, base)
    assert free_bytes(a) == 14 * MiB  # the refusals changed nothing
    T.vm_unmap(a, base, PAGE)
    T.vm_free(a, base)
    with pytest.raises(memalloc.InvalidArgumentError, match="no reservation starts"):
        T.vm_free(a, base)


def test_reservations_are_deterministic_and_reused(a):
    first = T.vm_reserve(a, 8 * MiB)
    second = T.vm_reserve(a, 8 * MiB)
    assert second == first + 8 * MiB  # first fit, in address order
    T.vm_free(a, first)
    assert T.vm_reserve(a, 4 * MiB) == first
    other = memalloc.Allocator("host", "host_capacity_mb:16")
    assert T.vm_reserve(other, 8 * MiB) != 0
    assert T.vm_reserve(a, 1 << 40) == 0  # beyond the device's address range: exhausted, not an error
