"""memalloc.host: real CPU torch tensors whose storage comes from a host-backend
allocator.

Every test except the "no allocator installed" one uses its own
``memalloc.Allocator("host", ...)`` object and so runs in-process; the
exception needs a fresh interpreter where nothing has been installed.

Expected sizes follow the allocator's size rules: requests round up to a
multiple of 512 bytes (minimum 512); rounded sizes <= 1 MiB come from 2 MiB
"small" segments; 1-10 MiB requests get 20 MiB "large" segments; >= 10 MiB
requests get their own segment rounded up to 2 MiB.
"""

from __future__ import annotations

import gc
import math
import textwrap
import threading

import pytest
import torch
from memtest_helpers import LARGE_SEGMENT, SMALL_SEGMENT, MiB, rnd, stat

import memalloc
from memalloc import host


def nbytes_of(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


@pytest.fixture
def a(host_allocator):
    return host_allocator  # tests/conftest.py


def reference(shape, dtype) -> torch.Tensor:
    """Distinct values of ``dtype`` laid out in ``shape`` (on torch's allocator)."""
    n = math.prod(shape)
    base = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        ref = base % 3 == 1
    elif dtype == torch.uint8:
        ref = (base * 7 + 3) % 251
    elif dtype == torch.float16:
        ref = base % 1000 - 0.5  # exactly representable in float16
    else:
        ref = base * 3 - 11
    return ref.to(dtype).reshape(shape)


CASES = [
    (torch.float32, (3, 5)),  # 60 B   -> 512
    (torch.float32, ()),  # 0-d: 4 B -> 512
    (torch.float16, (300,)),  # 600 B  -> 1024
    (torch.int64, (129,)),  # 1032 B -> 1536
    (torch.int64, (2, 1, 3, 1)),  # 48 B   -> 512
    (torch.bool, (513,)),  # 513 B  -> 1024
    (torch.uint8, (2, 3, 4)),  # 24 B   -> 512
    (torch.uint8, (512,)),  # exactly 512
    (torch.float32, (64, 64, 4)),  # 64 KiB, already a multiple of 512
]


@pytest.mark.parametrize("dtype,shape", CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_empty_shape_dtype_values_and_placement(a, dtype, shape):
    nbytes = nbytes_of(shape, dtype)
    t = host.empty(shape, dtype, allocator=a)

    assert isinstance(t, torch.Tensor)
    assert t.device.type == "cpu"
    assert t.shape == torch.Size(shape)
    assert t.dim() == len(shape)
    assert t.dtype == dtype
    assert t.is_contiguous()
    assert t.numel() * t.element_size() == nbytes

    # Writable and readable.
    ref = reference(shape, dtype)
    t.copy_(ref)
    assert torch.equal(t, ref)
    flat = t.view(-1)
    flat[-1] = ref.view(-1)[0]
    assert t.view(-1)[-1].item() == ref.view(-1)[0].item()

    # The accounting grew by the rounded size, with the exact request recorded.
    assert stat(a, "allocated_bytes") == rnd(nbytes)
    assert stat(a, "requested_bytes") == nbytes
    assert stat(a, "allocation") == 1

    # The storage is a live block of a memalloc segment.
    ptr = t.data_ptr()
    segs = a.segments()
    assert len(segs) == 1
    seg = segs[0]
    assert seg["total_size"] == SMALL_SEGMENT and seg["segment_type"] == "small"
    assert seg["address"] <= ptr and ptr + nbytes <= seg["address"] + seg["total_size"]
    live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert len(live) == 1
    assert live[0]["address"] == ptr
    assert live[0]["size"] == rnd(nbytes)
    assert live[0]["requested_size"] == nbytes
    assert t.untyped_storage().data_ptr() == ptr

    del t, flat
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    assert stat(a, "allocation") == 0
    assert stat(a, "allocation", field="freed") == 1
    # The segment stays cached.
    assert stat(a, "reserved_bytes") == SMALL_SEGMENT
    a.validate()


def test_zero_dim_tensor_holds_a_scalar(a):
    t = host.empty((), torch.float64, allocator=a)
    assert t.shape == torch.Size([]) and t.dim() == 0
    t.fill_(2.5)
    assert t.item() == 2.5
    assert stat(a, "allocated_bytes") == 512
    assert stat(a, "requested_bytes") == 8


def test_shape_forms_int_list_and_size(a):
    assert host.empty(7, allocator=a).shape == torch.Size([7])
    assert host.empty([2, 3], allocator=a).shape == torch.Size([2, 3])
    assert host.empty(torch.Size([4, 1]), allocator=a).shape == torch.Size([4, 1])


def test_large_requests_use_large_segments(a):
    # >= 10 MiB: its own segment rounded up to 2 MiB. The 1 MiB - 512 B left
    # over is too small to split off a large block (<= 1 MiB), so the whole
    # 12 MiB segment is the block and counts as allocated.
    huge = host.empty(11 * MiB + 1, torch.uint8, allocator=a)
    assert rnd(11 * MiB + 1) == 11 * MiB + 512
    assert stat(a, "allocated_bytes", "large_pool") == 12 * MiB
    assert stat(a, "requested_bytes") == 11 * MiB + 1
    assert stat(a, "reserved_bytes", "large_pool") == 12 * MiB
    # 1-10 MiB: a 20 MiB segment (the 12 MiB one has no free block).
    medium = host.empty((1024, 1024), torch.float32, allocator=a)  # 4 MiB
    assert stat(a, "allocated_bytes") == 12 * MiB + 4 * MiB
    assert stat(a, "reserved_bytes") == 12 * MiB + LARGE_SEGMENT
    assert stat(a, "reserved_bytes", "small_pool") == 0
    assert sorted(s["total_size"] for s in a.segments()) == [12 * MiB, LARGE_SEGMENT]
    assert all(s["segment_type"] == "large" for s in a.segments())
    # A second 4 MiB request is carved from the cached rest of the 20 MiB segment.
    medium2 = host.empty(4 * MiB, torch.uint8, allocator=a)
    assert a.stats(0)["num_device_alloc"] == 2
    assert stat(a, "allocated_bytes") == 12 * MiB + 8 * MiB
    huge[-1] = 9
    medium[-1, -1] = 1.5
    medium2[0] = 4
    assert huge[-1].item() == 9 and medium[-1, -1].item() == 1.5 and medium2[0].item() == 4
    del medium, huge, medium2
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    assert stat(a, "reserved_bytes") == 12 * MiB + LARGE_SEGMENT


def test_views_and_slices_keep_the_memory_alive(a):
    t = host.empty((4, 256), torch.float32, allocator=a)  # 4096 B
    t.copy_(torch.arange(1024, dtype=torch.float32).reshape(4, 256))
    row = t[1:3]
    strided = t.view(-1)[::2]
    transposed = t.t()
    del t
    gc.collect()
    assert stat(a, "allocated_bytes") == 4096
    assert row[0, 0].item() == 256.0
    assert strided[1].item() == 2.0
    del row, strided
    gc.collect()
    assert stat(a, "allocated_bytes") == 4096
    assert transposed[255, 3].item() == 3 * 256 + 255
    del transposed
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    assert stat(a, "active") == 0


def test_loop_is_served_from_the_cache(a):
    first_segments = None
    for i in range(20):
        x = host.empty((256, 256), torch.float32, allocator=a)  # 256 KiB, small pool
        y = host.empty((1024, 1024), torch.float32, allocator=a)  # 4 MiB, large pool
        x.fill_(float(i))
        y.fill_(1.0)
        assert x.sum().item() == 256 * 256 * i
        del x, y
        if i == 0:
            first_segments = a.stats(0)["num_device_alloc"]
            assert first_segments == 2
        assert a.stats(0)["num_device_alloc"] == first_segments
        assert stat(a, "allocated_bytes") == 0
        assert stat(a, "allocation", field="allocated") == 2 * (i + 1)
    assert stat(a, "reserved_bytes") == SMALL_SEGMENT + LARGE_SEGMENT
    assert a.stats(0)["num_device_free"] == 0


def test_tensor_bigger_than_capacity_raises_oom_and_allocator_stays_consistent(a):
    keep = host.empty(1000, torch.float32, allocator=a)  # 4000 B -> 4096
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        host.empty(65 * MiB, torch.uint8, allocator=a)
    a.validate()
    s = a.stats(0)
    assert s["num_ooms"] == 1
    assert s["allocated_bytes"]["all"]["current"] == 4096
    assert s["allocation"]["all"]["current"] == 1
    # Later allocations work, including a large one that fits.
    after = host.empty(30 * MiB, torch.uint8, allocator=a)
    after[0] = 1
    after[-1] = 2
    assert after[0].item() == 1 and after[-1].item() == 2
    assert stat(a, "allocated_bytes") == 4096 + 30 * MiB
    del keep, after
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    a.validate()


@pytest.mark.parametrize("shape", [(0,), 0, (3, 0, 2), (0, 0)])
def test_zero_element_tensors_do_not_allocate(a, shape):
    t = host.empty(shape, torch.float32, allocator=a)
    expected = (shape,) if isinstance(shape, int) else shape
    assert t.shape == torch.Size(expected)
    assert t.numel() == 0
    s = a.stats(0)
    assert s["allocation"]["all"]["allocated"] == 0
    assert s["num_device_alloc"] == 0
    assert a.segments() == []
    z = host.zeros(shape, allocator=a)
    assert z.numel() == 0
    assert a.stats(0)["allocation"]["all"]["allocated"] == 0


@pytest.mark.parametrize("shape,bad", [((3, -2), -2), (-1, -1), ((0, -5), -5), ((2, 3, -7), -7)])
def test_negative_dimension_raises_value_error_naming_it(a, shape, bad):
    with pytest.raises(ValueError, match=rf"negative dimension {bad}\b"):
        host.empty(shape, allocator=a)
    assert a.stats(0)["allocation"]["all"]["allocated"] == 0


@pytest.mark.parametrize("shape", [(2.0, 3), ("3",), (True, 2), (2, None), 2.5])
def test_non_int_dimension_raises_type_error(a, shape):
    with pytest.raises(TypeError):
        host.empty(shape, allocator=a)
    assert a.stats(0)["allocation"]["all"]["allocated"] == 0


def test_zeros_is_zero_filled_even_on_reused_memory(a):
    dirty = host.empty(1024, torch.float32, allocator=a)
    dirty.fill_(7.0)
    ptr = dirty.data_ptr()
    del dirty
    gc.collect()
    z = host.zeros(1024, torch.float32, allocator=a)
    # Same block as before (best fit of the only free block): zeros() must
    # really clear what empty() left there.
    assert z.data_ptr() == ptr
    assert z.shape == torch.Size([1024]) and z.dtype == torch.float32
    assert torch.count_nonzero(z).item() == 0
    zi = host.zeros((3, 4), torch.int64, allocator=a)
    assert torch.equal(zi, torch.zeros(3, 4, dtype=torch.int64))


def test_torch_ops_with_out_write_into_memalloc_tensors(a):
    g = torch.Generator().manual_seed(0)
    x = host.empty((16, 32), allocator=a).copy_(torch.randn(16, 32, generator=g))
    w = host.empty((32, 8), allocator=a).copy_(torch.randn(32, 8, generator=g))
    out = host.empty((16, 8), allocator=a)
    ptr = out.data_ptr()
    allocated = stat(a, "allocated_bytes")

    r = torch.mm(x, w, out=out)
    assert r.data_ptr() == ptr and out.data_ptr() == ptr
    torch.testing.assert_close(out, x.clone() @ w.clone())

    torch.add(out, 1.0, out=out)
    torch.testing.assert_close(out, x.clone() @ w.clone() + 1.0)

    colsum = host.empty(8, allocator=a)
    torch.sum(out, dim=0, out=colsum)
    torch.testing.assert_close(colsum, out.clone().sum(dim=0))

    # The ops wrote in place: no memalloc tensor was reallocated.
    assert out.data_ptr() == ptr
    assert stat(a, "allocated_bytes") == allocated + 512
    a.validate()


def test_tensor_freed_from_another_thread_returns_memory(a):
    holder = [host.empty((512, 512), torch.float32, allocator=a)]  # 1 MiB
    holder[0].fill_(3.0)
    assert stat(a, "allocated_bytes") == MiB
    errors = []

    def drop():
        try:
            t = holder.pop()
            assert t.sum().item() == 3.0 * 512 * 512
            del t  # last reference dies on this thread
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=drop)
    th.start()
    th.join(timeout=60)
    assert not th.is_alive()
    assert errors == []
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    assert stat(a, "allocation", field="freed") == 1
    a.validate()


def test_tensors_allocated_on_many_threads(a):
    results = []
    lock = threading.Lock()

    def work(k):
        ts = [host.empty(100 + k, torch.int64, allocator=a).fill_(k) for _ in range(10)]
        total = sum(int(t.sum()) for t in ts)
        with lock:
            results.append((k, total))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(results) == [(k, 10 * k * (100 + k)) for k in range(4)]
    gc.collect()
    s = a.stats(0)
    assert s["allocated_bytes"]["all"]["current"] == 0
    assert s["allocation"]["all"]["allocated"] == 40
    a.validate()


def test_device_argument_selects_the_simulated_device():
    a2 = memalloc.Allocator("host", "host_capacity_mb:64,host_devices:2")
    t = host.empty(1000, torch.uint8, device=1, allocator=a2)
    assert a2.stats(1)["allocated_bytes"]["all"]["current"] == 1024
    assert a2.stats(0)["allocated_bytes"]["all"]["current"] == 0
    del t
    gc.collect()
    assert a2.stats(1)["allocated_bytes"]["all"]["current"] == 0
    with pytest.raises(ValueError, match="device 2 does not exist"):
        host.empty(10, device=2, allocator=a2)


def test_tensor_keeps_its_allocator_alive():
    a = memalloc.Allocator("host", "host_capacity_mb:8")
    t = host.empty(4096, torch.uint8, allocator=a)
    t.fill_(5)
    del a
    gc.collect()
    t[10] = 6
    assert int(t.sum()) == 5 * 4095 + 6
    del t
    gc.collect()


def test_host_empty_without_installed_allocator_raises(fresh_python):
    code = textwrap.dedent(
        """
        import memalloc, torch
        from memalloc import host
        assert not memalloc.is_enabled()
        for f in (lambda: host.empty(4), lambda: host.zeros((2, 2))):
            try:
                f()
            except RuntimeError as e:
                print("ERR", type(e).__name__, e)
            else:
                print("NOERR")
        memalloc.enable(backend="host")
        t = host.empty((2, 3))
        print("AFTER", tuple(t.shape), memalloc.memory.memory_allocated())
        """
    )
    p = fresh_python.run(["-c", code])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    errs = [l for l in lines if l.startswith("ERR ")]
    assert "NOERR" not in lines
    assert len(errs) == 2
    for l in errs:
        assert "memalloc.enable(backend='host')" in l
    # Once a host allocator is installed, host.empty uses it.
    assert "AFTER (2, 3) 512" in lines


# ---- torch's CPU tensors from an allocator, for one scope (cpu_tensors_from) ----
def test_cpu_tensors_from_routes_torch_cpu_tensors_for_the_block_only(a):
    before = torch.empty(1000)  # torch's own CPU allocator
    with host.cpu_tensors_from(a) as routed:
        assert routed is a
        inside = torch.empty(1000)  # 4000 B -> 4096 B block
        model = torch.nn.Linear(64, 32)  # weight 8192 B, bias 512 B
        assert stat(a, "allocated_bytes") == 4096 + 8192 + 512
        assert stat(a, "allocation") == 3
    after = torch.empty(1000)
    assert stat(a, "allocated_bytes") == 4096 + 8192 + 512  # `after` is torch's again
    # tensors made inside go back to the allocator when they die, after the block too
    del inside
    gc.collect()
    assert stat(a, "allocated_bytes") == 8192 + 512
    del model
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    del before, after


def test_cpu_tensors_from_serves_torch_kernels_that_allocate_raw_memory(a):
    # torch's CPU gelu takes scratch memory through c10's raw_allocate /
    # raw_deallocate, which need the route's DataPtr context to be the data
    # and its raw_deleter() to free it (it aborted the process before).
    x = torch.randn(2, 64, 128)
    expected = torch.nn.functional.gelu(x)  # torch's own CPU allocator
    with host.cpu_tensors_from(a):
        routed_x = x.clone()
        y = torch.nn.functional.gelu(routed_x)
        assert stat(a, "allocated_bytes") == 2 * x.numel() * 4  # the clone and the output
    assert torch.equal(y, expected)
    del routed_x, y
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    a.validate()


def test_a_routed_tensor_outliving_its_route_and_allocator_handle_is_freed_into_it(capfd):
    b = memalloc.Allocator("host", "host_capacity_mb:16")
    with host.cpu_tensors_from(b):
        t = torch.ones(1000)
        kept = torch.ones(10)
    del b  # the route's book keeps the allocator alive while its tensors live
    gc.collect()
    assert float(t.sum()) == 1000.0
    del t  # freed into that allocator: no "ignored" free, no crash
    gc.collect()
    assert float(kept.sum()) == 10.0
    del kept  # the last one: the book lets the allocator go
    gc.collect()
    assert "ignored" not in capfd.readouterr().err


def test_cpu_tensors_from_restores_torch_on_an_exception(a):
    with pytest.raises(KeyError):
        with host.cpu_tensors_from(a):
            torch.empty(10)
            raise KeyError("user error")
    t = torch.empty(1000)
    gc.collect()
    assert stat(a, "allocated_bytes") == 0
    del t


def test_cpu_tensors_from_oom_is_torch_out_of_memory_and_the_block_ends_clean():
    small = memalloc.Allocator("host", "host_capacity_mb:4")
    with host.cpu_tensors_from(small):
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
            torch.empty(8 * MiB, dtype=torch.uint8)
        ok = torch.empty(MiB, dtype=torch.uint8)
    assert stat(small, "allocated_bytes") == MiB
    del ok
    gc.collect()
    small.validate()
    assert stat(small, "allocated_bytes") == 0


def test_cpu_tensors_from_refuses_nesting_and_bad_allocators(a):
    other = memalloc.Allocator("host", "host_capacity_mb:8")
    with host.cpu_tensors_from(a):
        with pytest.raises(ValueError, match="already routed to a memalloc allocator: close that route"):
            with host.cpu_tensors_from(other):
                pass
        t = torch.empty(100)
    assert stat(a, "allocation") == 1 and stat(other, "allocation") == 0
    with pytest.raises(TypeError, match="allocator must be a memalloc.Allocator on the host backend"):
        with host.cpu_tensors_from("host"):
            pass
    del t


def test_permanent_route_waits_for_the_scoped_one_to_close(fresh_python):
    """use_for_cpu_tensors() needs enable(), hence a fresh interpreter."""
    _, r, _ = fresh_python.code(
        "",
        """
import gc
memalloc.enable(backend="host", config="host_capacity_mb:64")
other = memalloc.Allocator("host", "host_capacity_mb:8")
with host.cpu_tensors_from(other):
    R["inside"] = err(host.use_for_cpu_tensors)
host.use_for_cpu_tensors()
t = torch.empty(1000)
R["installed"] = memalloc.memory.memory_allocated()
R["other"] = other.stats(0)["allocated_bytes"]["all"]["current"]
R["used"] = host.used_for_cpu_tensors()
""",
    )
    assert r["inside"][0] == "InvalidArgumentError" and "close that route" in r["inside"][2]
    assert (r["installed"], r["other"], r["used"]) == (4096, 0, True)
