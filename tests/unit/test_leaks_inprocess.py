"""Leak rules and OOM holders in this process, on an allocator the test owns
(the allocator seam: LeakTracker, leak_check and top_holders take an
allocator, default the installed one), with real torch tensors whose
storage comes from it (DLPack). No memalloc.enable(), no subprocess.
"""

import pytest
import torch

import memalloc
from memalloc import _C

KiB = 1 << 10


@pytest.fixture
def allocator(host_allocator):
    return host_allocator  # tests/conftest.py


def tensor(a, nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor over ``nbytes`` of ``a``'s memory, freed back to it
    when it dies (its call site is this line: tests that check sites
    allocate inline)."""
    return torch.from_dlpack(a.host_buffer(nbytes))


def line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, l in enumerate(f, 1) if l.rstrip().endswith(marker) and "line_of(" not in l)


def test_a_list_that_keeps_a_tensor_every_step_is_reported_at_its_line(allocator):
    kept = []
    with memalloc.leak_check(allocator=allocator, warmup_steps=1) as check:
        for _ in range(10):
            scratch = tensor(allocator, 64 * KiB)  # freed at the next iteration: not a leak
            kept.append(torch.from_dlpack(allocator.host_buffer(4 * KiB)))  # KEEPS-ONE
            del scratch
            memalloc.step()
    assert check.report.backend == "host"
    assert len(check.leaks) == 1, check.to_text()
    leak = check.leaks[0]
    assert leak.bytes_per_step == pytest.approx(4 * KiB)
    assert (leak.alloc_site["filename"], leak.alloc_site["line"]) == (__file__, line_of("# KEEPS-ONE"))
    # reported at the line that keeps it, allocated at the marked line
    assert leak.holder is not None and leak.holder["name"] == "kept", check.to_text()
    assert leak.site["line"] == leak.alloc_site["line"]  # the same line appends and allocates
    del kept


def test_the_adding_line_is_code_not_a_string_or_a_comment_that_reads_like_it(allocator):
    # Between the allocating line and the line that keeps the tensor, two
    # lines read like the adding line but are not code: the middle of a
    # string and a trailing comment. The report's line is the code's.
    kept2 = []
    with memalloc.leak_check(allocator=allocator, warmup_steps=1) as check:
        for _ in range(10):
            x = torch.from_dlpack(allocator.host_buffer(4 * KiB))  # ALLOCATES
            note = """
            kept2.append(x)
            """
            n = len(note)  # kept2.append(x)
            kept2.append(x)  # ADDS
            del x, n
            memalloc.step()
    assert len(check.leaks) == 1, check.to_text()
    leak = check.leaks[0]
    assert leak.alloc_site["line"] == line_of("# ALLOCATES")
    assert leak.holder is not None and leak.holder["name"] == "kept2", check.to_text()
    assert (leak.site["filename"], leak.site["line"]) == (__file__, line_of("# ADDS")), check.to_text()
    del kept2


def test_tensors_kept_for_one_step_and_warm_up_are_not_leaks(allocator):
    previous = None
    warm = []
    with memalloc.leak_check(allocator=allocator, warmup_steps=2) as check:
        for i in range(10):
            if i < 2:
                warm.append(tensor(allocator, 32 * KiB))  # one-off growth during warm-up
            current = tensor(allocator, 8 * KiB)
            previous = current  # the previous iteration's tensor dies here
            memalloc.step()
    assert check.leaks == [], check.to_text()
    del previous, warm


def test_top_holders_of_an_allocator_name_the_line_holding_the_most(allocator):
    mode = _C.stack_mode()
    _C.set_stack_mode(2)  # Python stacks
    try:
        big = [torch.from_dlpack(allocator.host_buffer(256 * KiB)) for _ in range(3)]  # HOLDS-MOST
        small = torch.from_dlpack(allocator.host_buffer(1 * KiB))
    finally:
        _C.set_stack_mode(mode)
    holders = memalloc.top_holders(n=2, allocator=allocator)
    assert holders[0]["bytes"] == 3 * 256 * KiB and holders[0]["tensors"] == 3
    assert (holders[0]["filename"], holders[0]["line"]) == (__file__, line_of("# HOLDS-MOST"))
    assert holders[1]["bytes"] == 1 * KiB
    del big, small


def test_an_allocator_argument_checks_its_own_devices(allocator):
    with pytest.raises(_C.InvalidArgumentError, match="device 3 does not exist"):
        memalloc.LeakTracker(3, allocator=allocator)


def test_step_tracker_on_an_allocator_records_in_step_peaks(allocator):
    with memalloc.StepTracker(allocator=allocator) as tracker:
        kept = torch.from_dlpack(allocator.host_buffer(64 * KiB))
        spike = torch.from_dlpack(allocator.host_buffer(1 << 20))  # alive only inside step 1
        del spike
        tracker.record_row()
        tracker.record_row()
    rows = tracker.rows
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["allocated"] == rows[1]["allocated"] == 64 * KiB
    assert rows[0]["peak_allocated"] == 64 * KiB + (1 << 20)  # the spike, within step 1
    assert rows[1]["peak_allocated"] == 64 * KiB  # gone by step 2
    assert tracker.to_dict()["backend"] == "host"
    del kept


def test_first_step_is_numbered_as_the_steps_sampled(allocator):
    """A leak that starts in the 4th iteration (the one that ends at the 4th
    boundary) reports first_step 4, in the numbering of ``steps`` (the
    boundaries sampled), and the text says so (issue 37: a report said
    "since step 0" beside "sampled (1..20)")."""
    kept = []
    start = memalloc.iteration.steps()
    with memalloc.leak_check(allocator=allocator, warmup_steps=1) as check:
        for i in range(1, 13):
            if i >= 4:
                kept.append(torch.from_dlpack(allocator.host_buffer(4 * KiB)))
            memalloc.step()
    (leak,) = check.leaks
    steps = check.report.steps
    assert steps[0] == start + 1 and steps[-1] == start + 12
    assert leak.first_step == start + 4
    assert leak.retained_tensors == 9 and leak.retained_bytes == 9 * 4 * KiB
    assert f"since step {start + 4}" in check.to_text()
    del kept
