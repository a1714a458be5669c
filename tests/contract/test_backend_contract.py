"""The backend contract (csrc/backend/backend.h), the same tests on every backend: the
host backend (the simulated device, in CI) and the CUDA backend (pytest -m
gpu; skipped without a GPU), as RMM runs one resource test suite over every
memory resource.

Virtual memory, the bottom layer of expandable segments, through the test
hooks memalloc._C._testing.vm_*: address space is reserved without memory,
pages are device memory in use (and usable) only while mapped, a map beyond
the device returns False and changes nothing, and misuse is refused with the
rule it breaks. The host backend counts to the byte; the CUDA device's free
memory also moves with the driver's own use, so there the counts are lower
bounds. Host-only features (injected faults, deterministic addresses) are
the last tests.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import memalloc
from memalloc import _C

T = _C._testing
MiB = 1 << 20


class _CudaArray:
    """A uint8 CUDA array over raw device memory (__cuda_array_interface__)."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (addr, False),
            "version": 3,
            "strides": None,
        }


def _host_fill(addr: int, nbytes: int, value: int) -> list[int]:
    ctypes.memset(addr, value, nbytes)
    return list(ctypes.string_at(addr, 1) + ctypes.string_at(addr + nbytes - 1, 1))


def _cuda_fill(addr: int, nbytes: int, value: int) -> list[int]:
    t = torch.as_tensor(_CudaArray(addr, nbytes), device="cuda")
    t.fill_(value)
    out = [int(t[0]), int(t[-1])]
    del t
    torch.cuda.synchronize()
    return out


@dataclass
class Backend:
    name: str
    allocator: memalloc.Allocator
    exact: bool  # free memory moves by exactly what is mapped
    fill: Callable[[int, int, int], list]  # writes `value` over [addr, addr + n); the first and last byte read back

    @property
    def page(self) -> int:
        return T.vm_page_size(self.allocator)

    def free(self) -> int:
        return self.allocator.mem_get_info(0)[0]

    def total(self) -> int:
        return self.allocator.mem_get_info(0)[1]

    def dropped_by(self, before: int, nbytes: int) -> bool:
        """Free memory fell by ``nbytes`` since ``before`` (at least, on CUDA)."""
        drop = before - self.free()
        return drop == nbytes if self.exact else drop >= nbytes


@pytest.fixture(
    params=[
        "host",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
        ),
    ]
)
def backend(request):
    if request.param == "host":
        b = Backend("host", memalloc.Allocator("host", "host_capacity_mb:16"), True, _host_fill)
    else:
        b = Backend("cuda", memalloc.Allocator("cuda", ""), False, _cuda_fill)
        warm = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # fill_'s kernels take device
        _cuda_fill(warm.data_ptr(), warm.numel(), 0)  # memory too: load them first
    yield b
    b.allocator.validate()


def test_the_page_is_a_multiple_of_2_mib(backend):
    assert backend.page >= 2 * MiB and backend.page % (2 * MiB) == 0


def test_reserving_takes_address_space_not_memory(backend):
    page = backend.page
    n = (2 * backend.total() // page + 1) * page  # more than the device holds: address space only
    before = backend.free()
    base = T.vm_reserve(backend.allocator, n)
    assert base != 0 and base % page == 0
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() >= before - page
    T.vm_free(backend.allocator, base)


def test_mapped_pages_are_memory_in_use_and_usable(backend):
    a, page = backend.allocator, backend.page
    base = T.vm_reserve(a, 8 * page)
    before = backend.free()
    assert T.vm_map(a, base + page, 2 * page) is True
    assert backend.dropped_by(before, 2 * page)
    assert backend.fill(base + page, 2 * page, 7) == [7, 7]
    T.vm_unmap(a, base + page, page)  # half of it
    assert backend.dropped_by(before, page) if backend.exact else backend.free() > before - 2 * page
    assert T.vm_map(a, base + page, page)
    assert backend.fill(base + page, page, 9) == [9, 9]  # a page mapped again is usable again
    T.vm_unmap(a, base + page, 2 * page)
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() >= before - page
    T.vm_free(a, base)


def test_a_map_beyond_the_device_returns_false_and_changes_nothing(backend):
    a, page = backend.allocator, backend.page
    pages = backend.total() // page + 8
    base = T.vm_reserve(a, pages * page)
    before = backend.free()
    assert T.vm_map(a, base, pages * page) is False
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() >= before - page
    assert T.vm_map(a, base, page)  # a map within the device still works
    T.vm_unmap(a, base, page)
    T.vm_free(a, base)


def test_misuse_is_refused_with_the_rule_and_changes_nothing(backend):
    a, page = backend.allocator, backend.page
    base = T.vm_reserve(a, 4 * page)
    assert T.vm_map(a, base, page)
    mapped = backend.free()
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="already mapped"):
        T.vm_map(a, base, 2 * page)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="not mapped"):
        T.vm_unmap(a, base, 2 * page)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="whole pages of the reservation"):
        T.vm_map(a, base + page + 4096, page)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="in no reservation"):
        T.vm_map(a, base + 4 * page, page)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="unmap every page"):
        T.vm_free(a, base)
    assert backend.dropped_by(mapped, 0) if backend.exact else backend.free() >= mapped - page
    T.vm_unmap(a, base, page)
    T.vm_free(a, base)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="no reservation starts"):
        T.vm_free(a, base)


def test_a_reservation_maps_and_unmaps_in_its_own_pages(backend):
    """A reservation of pages three times the granularity (one physical
    allocation each: the large pool's pages, pool/vm_arena.h): whole pages
    map, are memory in use and usable, and unmap; a range that cuts a page
    is refused and changes nothing; so are page sizes that are not
    multiples of the granularity."""
    a, gran = backend.allocator, backend.page
    page = 3 * gran
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="positive multiple of the granularity"):
        T.vm_reserve(a, 4 * page, page=gran + 4096)
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="positive multiple of the page size"):
        T.vm_reserve(a, 4 * page + gran, page=page)
    base = T.vm_reserve(a, 4 * page, page=page)
    before = backend.free()
    for start, n in [(base, gran), (base + gran, page), (base + page, 2 * gran)]:  # cuts a page
        with pytest.raises(memalloc.errors.InvalidArgumentError, match="whole pages of the reservation"):
            T.vm_map(a, start, n)
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() >= before - gran
    assert T.vm_map(a, base + page, 2 * page) is True
    assert backend.dropped_by(before, 2 * page)
    assert backend.fill(base + page, 2 * page, 5) == [5, 5]
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="whole pages of the reservation"):
        T.vm_unmap(a, base + page, gran)
    T.vm_unmap(a, base + 2 * page, page)  # the second page alone
    assert backend.dropped_by(before, page) if backend.exact else backend.free() > before - 2 * page
    assert backend.fill(base + page, page, 6) == [6, 6]
    T.vm_unmap(a, base + page, page)
    T.vm_free(a, base)


def _cuda_bytes(addr: int, nbytes: int) -> list[int]:
    t = torch.as_tensor(_CudaArray(addr, nbytes), device="cuda")
    out = [int(t[0]), int(t[-1])]
    del t
    return out


def test_a_page_move_takes_no_new_memory(backend):
    """vm_detach (a page move, Expandable::grow above the reuse ceiling):
    the range reads as unmapped at once, its memory stays taken, and the
    next vm_map of the same page size maps those pages: no memory is
    obtained (on CUDA the pages' bytes arrive with them: the same physical
    pages). The detached range maps again at once (on CUDA after its
    pending unmap), with new memory; spare pages no map took are given
    back by vm_drop_spares."""
    a, page = backend.allocator, backend.page
    base = T.vm_reserve(a, 4 * page, page=page)
    start = backend.free()
    assert T.vm_map(a, base, 2 * page)
    assert backend.fill(base, 2 * page, 7) == [7, 7]
    before = backend.free()
    T.vm_detach(a, base, 2 * page)
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() < before + page  # kept
    with pytest.raises(memalloc.errors.InvalidArgumentError, match="not mapped"):
        T.vm_unmap(a, base, page)  # unmapped as far as the books go
    assert T.vm_map(a, base + 2 * page, 2 * page)
    assert backend.dropped_by(before, 0) if backend.exact else backend.free() > before - page  # none obtained
    if backend.name == "cuda":
        assert _cuda_bytes(base + 2 * page, 2 * page) == [7, 7]  # the same physical pages
    assert backend.fill(base + 2 * page, 2 * page, 8) == [8, 8]
    assert T.vm_map(a, base, 2 * page)  # the moved range again: new memory
    assert backend.dropped_by(before, 2 * page)
    assert backend.fill(base, 2 * page, 9) == [9, 9]
    assert backend.fill(base + 2 * page, 2 * page, 8) == [8, 8]
    T.vm_drop_spares(a)  # none left: nothing changes
    assert backend.dropped_by(before, 2 * page) if backend.exact else backend.free() <= before - page
    T.vm_detach(a, base + 2 * page, 2 * page)
    T.vm_drop_spares(a)
    T.vm_unmap(a, base, 2 * page)
    T.vm_free(a, base)  # ends the reservation once the pending unmap is done
    assert backend.dropped_by(start, 0) if backend.exact else backend.free() > start - page


# ---- host backend only -------------------------------------------------------
def test_host_counts_the_driver_calls_cuda_would_make():
    """The host backend's count of CUDA's virtual-memory calls
    (backend_cuda.cpp's, call for call): cuMemCreate and cuMemMap per page,
    cuMemSetAccess per map, cuMemUnmap per unmap and cuMemRelease per page;
    a map beyond the device creates and maps pages until one does not fit,
    then undoes each."""
    a = memalloc.Allocator("host", "host_capacity_mb:16")
    base = T.vm_reserve(a, 32 * MiB, page=4 * MiB)
    assert T.vm_calls(a) == dict(create=0, map=0, set_access=0, unmap=0, release=0, stream_syncs=0, waits=0)
    assert T.vm_map(a, base, 8 * MiB)
    assert T.vm_calls(a) == dict(create=2, map=2, set_access=1, unmap=0, release=0, stream_syncs=0, waits=0)
    T.vm_unmap(a, base, 8 * MiB)
    assert T.vm_calls(a) == dict(create=2, map=2, set_access=1, unmap=1, release=2, stream_syncs=0, waits=0)
    assert T.vm_map(a, base, 4 * MiB)
    assert T.vm_map(a, base + 4 * MiB, 16 * MiB) is False  # 12 MiB free: three pages fit, the fourth does not
    assert T.vm_calls(a) == dict(
        create=3 + 4, map=3 + 3, set_access=2, unmap=1 + 3, release=2 + 3, stream_syncs=0, waits=0
    )
    T.vm_unmap(a, base, 4 * MiB)
    T.vm_free(a, base)
    a.validate()


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def test_host_counts_a_page_move_as_cuda_makes_it():
    """vm_detach is one cuMemUnmap (CUDA's, once the stream's work is done)
    and no stream synchronisation; a vm_map that takes its pages maps them
    (cuMemMap each, one cuMemSetAccess) and creates none; spare pages
    dropped are released (cuMemRelease each). Mapping the detached range
    before its stream's work is done waits for that work (CUDA's
    cuEventSynchronize), once; after a synchronisation it does not."""
    a = memalloc.Allocator("host", "host_capacity_mb:16")
    base = T.vm_reserve(a, 16 * MiB, page=2 * MiB)
    assert T.vm_map(a, base, 8 * MiB)
    c0 = T.vm_calls(a)
    T.vm_detach(a, base, 6 * MiB, stream=5)
    c1 = T.vm_calls(a)
    assert _delta(c1, c0) == dict(create=0, map=0, set_access=0, unmap=1, release=0, stream_syncs=0, waits=0)
    assert T.vm_map(a, base + 8 * MiB, 4 * MiB)  # 2 of the 3 spare pages
    c2 = T.vm_calls(a)
    assert _delta(c2, c1) == dict(create=0, map=2, set_access=1, unmap=0, release=0, stream_syncs=0, waits=0)
    assert T.vm_map(a, base, 4 * MiB)  # inside the detached range, its work not done: a wait; 1 spare, 1 new
    c3 = T.vm_calls(a)
    assert _delta(c3, c2) == dict(create=1, map=2, set_access=1, unmap=0, release=0, stream_syncs=0, waits=1)
    T.vm_detach(a, base + 8 * MiB, 4 * MiB, stream=5)  # [8, 12) MiB: two spare pages
    a.host_synchronize_stream(5)
    T.vm_drop_spares(a)
    assert T.vm_map(a, base + 8 * MiB, 2 * MiB)  # its work done: no wait
    c4 = T.vm_calls(a)
    assert _delta(c4, c3) == dict(create=1, map=1, set_access=1, unmap=1, release=2, stream_syncs=1, waits=0)
    assert a.mem_get_info(0)[0] == 16 * MiB - (2 + 4 + 2) * MiB  # [0, 4), [6, 8), [8, 10) MiB mapped
    T.vm_unmap(a, base, 4 * MiB)
    T.vm_unmap(a, base + 6 * MiB, 4 * MiB)
    T.vm_free(a, base)
    assert a.mem_get_info(0)[0] == 16 * MiB
    a.validate()


def test_host_segments_share_the_device_with_mappings_and_never_land_in_a_reservation():
    """(Host only: on CUDA it would fill the whole GPU with mappings.)"""
    a = memalloc.Allocator("host", "host_capacity_mb:16")
    base = T.vm_reserve(a, 32 * MiB)
    assert T.vm_map(a, base, 16 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(MiB)
    T.vm_unmap(a, base, 16 * MiB)
    p = a.malloc(MiB)
    assert not base <= p < base + 32 * MiB
    a.free(p)
    a.empty_cache()
    T.vm_free(a, base)
    a.validate()


def test_host_injected_faults_refuse_a_map():
    a = memalloc.Allocator("host", "host_capacity_mb:16")
    base = T.vm_reserve(a, 8 * MiB)
    T.inject_allocate_faults(a, 0, 1)
    assert T.vm_map(a, base, 2 * MiB) is False
    assert a.mem_get_info(0)[0] == 16 * MiB
    assert T.vm_map(a, base, 2 * MiB)
    T.vm_unmap(a, base, 2 * MiB)
    T.vm_free(a, base)
    a.validate()


def test_host_reservations_are_deterministic_and_reused():
    a = memalloc.Allocator("host", "host_capacity_mb:16")
    first = T.vm_reserve(a, 8 * MiB)
    second = T.vm_reserve(a, 8 * MiB)
    assert second == first + 8 * MiB  # first fit, in address order
    T.vm_free(a, first)
    assert T.vm_reserve(a, 4 * MiB) == first
    other = memalloc.Allocator("host", "host_capacity_mb:16")
    assert T.vm_reserve(other, 8 * MiB) != 0
    assert T.vm_reserve(a, 1 << 40) == 0  # beyond the device's address range: exhausted, not an error
