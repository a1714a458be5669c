"""The CUDA backend's virtual memory (csrc/backend_cuda.cpp: cuMemAddressReserve,
cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease), the bottom
layer of expandable segments, through memalloc._C._testing.vm_* on an
allocator this test owns (pytest -m gpu; skipped without a GPU). The host
backend's counterpart: tests/test_backend_vm.py."""
from __future__ import annotations

import pytest
import torch

import memalloc
from memalloc import _C

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

T = _C._testing
MiB = 1 << 20


class _Array:
    """A uint8 CUDA array over raw device memory (__cuda_array_interface__)."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False),
                                         "version": 3, "strides": None}


@pytest.fixture(scope="module")
def a():
    return memalloc.Allocator("cuda", "")


def test_map_backs_pages_with_device_memory_and_unmap_gives_them_back(a):
    page = T.vm_page_size(a)
    assert page >= 2 * MiB and page % (2 * MiB) == 0
    base = T.vm_reserve(a, 512 * page)
    assert base != 0 and base % page == 0
    warm = torch.zeros(1024, dtype=torch.uint8, device="cuda")  # load fill_/sum's kernels first:
    warm.fill_(1)                                                # their code takes device memory too
    int(warm.sum(dtype=torch.int64))
    free0 = torch.cuda.mem_get_info()[0]
    assert T.vm_map(a, base, 32 * page)
    assert free0 - torch.cuda.mem_get_info()[0] >= 32 * page
    t = torch.as_tensor(_Array(base, 32 * page), device="cuda")
    t.fill_(3)
    assert int(t[-1]) == 3 and int(t.sum(dtype=torch.int64)) == 3 * 32 * page
    del t
    torch.cuda.synchronize()
    mapped_free = torch.cuda.mem_get_info()[0]
    T.vm_unmap(a, base, 32 * page)
    assert torch.cuda.mem_get_info()[0] - mapped_free >= 32 * page  # the pages went back
    T.vm_free(a, base)


def test_a_map_beyond_the_device_returns_false_and_changes_nothing(a):
    page = T.vm_page_size(a)
    total = torch.cuda.mem_get_info()[1]
    pages = total // page + 8
    base = T.vm_reserve(a, pages * page)
    free0 = torch.cuda.mem_get_info()[0]
    assert T.vm_map(a, base, pages * page) is False
    assert torch.cuda.mem_get_info()[0] >= free0 - page
    T.vm_free(a, base)


def test_misuse_is_refused_with_the_rule(a):
    page = T.vm_page_size(a)
    base = T.vm_reserve(a, 4 * page)
    assert T.vm_map(a, base, page)
    with pytest.raises(memalloc.InvalidArgumentError, match="already mapped"):
        T.vm_map(a, base, 2 * page)
    with pytest.raises(memalloc.InvalidArgumentError, match="multiples of the page size"):
        T.vm_map(a, base + page + 4096, page)
    with pytest.raises(memalloc.InvalidArgumentError, match="unmap every page"):
        T.vm_free(a, base)
    T.vm_unmap(a, base, page)
    T.vm_free(a, base)
