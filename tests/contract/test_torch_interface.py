"""memalloc's subclass of torch's CUDAPluggableAllocator against the interface
of the torch in use (issue 42): every virtual method of
c10::cuda::CUDACachingAllocator::CUDAAllocator and its bases, read from the
installed torch's own headers (the CPU wheel ships them), is overridden by
csrc/boundary/torch/cuda/torch_allocator.cpp as compiled for this torch
version, or listed as inherited on purpose, with the reason, in
torch_allocator.h. A new torch release that adds a method fails here until
memalloc answers it. The reader's own tests: tests/unit/test_interface_parser.py."""

from __future__ import annotations

import pytest
import torch

from benchmarks.compat import interface as itf


@pytest.fixture(scope="module")
def report() -> itf.Report:
    include = itf.torch_include()
    if not (include / itf.CHAIN[-1][0]).is_file():
        pytest.fail(f"this torch ({torch.__version__}) ships no {itf.CHAIN[-1][0]} under {include}")
    return itf.report(include)


def test_reads_the_torch_in_use(report):
    assert "%d.%d" % report.torch_version == ".".join(torch.__version__.split(".")[:2])
    # The reader found the interface and the subclass (a reader that finds
    # nothing would pass the checks below vacuously).
    assert len(report.overridden) >= 40, report.overridden
    assert "allocate(size_t)" in report.overridden and "getDeviceStats(DeviceIndex)" in report.overridden


def test_every_virtual_method_is_overridden_or_inherited_on_purpose(report):
    assert not report.missing, (
        f"torch {torch.__version__} declares virtual methods that memalloc's subclass neither overrides nor lists as "
        f"inherited on purpose (csrc/boundary/torch/cuda/torch_allocator.h): {report.missing}"
    )


def test_the_inherited_list_is_not_stale_and_every_override_overrides(report):
    assert not report.stale, f"listed as inherited but overridden: {report.stale}"
    assert not report.strays, f"declared override but match no method of this torch's interface: {report.strays}"
    for key, reason in report.inherited.items():
        assert len(reason.split("[answered by")[0].strip()) > 20, f"{key}: give the reason it is right: {reason!r}"


# torch.accelerator's memory API, each answered under memalloc as torch.cuda's
# is (tests/gpu/test_cuda_interface.py calls every one of these on a GPU;
# empty_host_cache is torch's pinned host allocator, which memalloc leaves).
ACCELERATOR_MEMORY = {
    "empty_cache",
    "empty_host_cache",
    "get_memory_info",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
}


def test_every_accelerator_memory_query_of_this_torch_is_checked_on_the_gpu():
    import torch.accelerator.memory as am

    new = set(am.__all__) - ACCELERATOR_MEMORY
    assert not new, f"torch {torch.__version__} has accelerator memory functions no GPU test checks: {sorted(new)}"
