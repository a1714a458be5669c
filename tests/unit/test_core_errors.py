"""Error paths of the memalloc core: out of memory (retry, message, recovery),
invalid pointers (double free, unknown, interior), invalid devices and
fractions, and MEMALLOC_CONF parsing. Errors must leave the counters
unchanged; every allocator call is followed by validate().
"""

import pytest
import torch
from memtest_helpers import CONFIG_KEYS, SMALL_SEGMENT, Checked, MiB, cur, rnd

from memalloc import _C

VALID_KEYS = CONFIG_KEYS


def without(stats, *keys):
    return {k: v for k, v in stats.items() if k not in keys}


# ------------------------------------------------------------- exceptions ----
def test_exception_types():
    assert issubclass(_C.InvalidPointerError, ValueError)
    assert issubclass(_C.InvalidArgumentError, ValueError)
    assert issubclass(_C.MemallocError, RuntimeError)
    assert issubclass(torch.OutOfMemoryError, RuntimeError)


# -------------------------------------------------------------------- OOM ----
def test_oom_retry_releases_cache_then_succeeds():
    a = Checked()
    p = a.malloc(30 * MiB)
    q = a.malloc(30 * MiB)
    a.free(p)  # 30 MiB cached, 4 MiB left on the device
    assert a.mem_get_info() == (4 * MiB, 64 * MiB)
    # same stream, fits the cached block: no retry
    p2 = a.malloc(30 * MiB)
    assert p2 == p
    assert a.stats()["num_alloc_retries"] == 0
    a.free(p2)
    # on another stream the cached 30 MiB block is unusable: 12 MiB needs a new
    # segment, 30 + 30 + 12 > 64, so the cache is released and the grow retried
    r = a.malloc(12 * MiB, 0, 1)
    s = a.stats()
    assert s["num_alloc_retries"] == 1
    assert s["num_ooms"] == 0
    assert s["num_device_alloc"] == 3
    assert s["num_device_free"] == 1
    assert s["reserved_bytes"]["all"]["current"] == 42 * MiB
    assert _C._testing.live_segments(a.a) == 2
    assert a.mem_get_info() == (22 * MiB, 64 * MiB)
    a.free(q)
    a.free(r)


def test_oom_raises_after_retry_and_leaves_state_consistent():
    a = Checked()
    live = a.malloc(30 * MiB)
    cached = a.malloc(12 * MiB)
    small = a.malloc(1000)
    a.free(cached)
    before = a.stats()
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(40 * MiB)
    msg = str(exc.value)
    assert "Tried to allocate" in msg
    assert "40.00 MiB" in msg
    assert "64.00 MiB" in msg  # the capacity
    after = a.stats()
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert after["num_ooms"] == before["num_ooms"] + 1
    # the retry released the cached 12 MiB segment, nothing else changed
    assert after["num_device_free"] == before["num_device_free"] + 1
    assert after["reserved_bytes"]["all"]["current"] == 30 * MiB + SMALL_SEGMENT
    for key in ("allocation", "allocated_bytes", "requested_bytes", "active_bytes", "active"):
        assert after[key] == before[key], key
    assert _C._testing.live_segments(a.a) == 2
    # the allocator keeps working
    a.free(live)
    big = a.malloc(40 * MiB)
    assert a.stats()["num_ooms"] == 1
    assert a.stats()["num_alloc_retries"] == 2
    assert cur(a, "allocated_bytes") == 40 * MiB + rnd(1000)
    a.free(big)
    a.free(small)
    assert cur(a, "allocated_bytes") == 0
    assert a.empty_cache() == 40 * MiB + SMALL_SEGMENT
    assert a.mem_get_info() == (64 * MiB, 64 * MiB)


@pytest.mark.parametrize("size,shown", [(100 * MiB, "100.00 MiB"), (65 * MiB, "65.00 MiB"), (3 << 30, "3.00 GiB")])
def test_oom_request_bigger_than_device(size, shown):
    a = Checked()
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(size)
    msg = str(exc.value)
    assert "Tried to allocate " + shown in msg
    assert "64.00 MiB" in msg
    s = a.stats()
    assert s["num_ooms"] == 1
    assert s["num_alloc_retries"] == 1
    assert s["allocation"]["all"]["current"] == 0
    assert s["allocation"]["all"]["allocated"] == 0
    assert s["reserved_bytes"]["all"]["current"] == 0
    assert _C._testing.live_segments(a.a) == 0
    assert a.malloc(1000) != 0


def test_oom_absurd_size():
    a = Checked()
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(1 << 62)
    assert "Tried to allocate" in str(exc.value)
    assert a.stats()["num_ooms"] == 1
    assert cur(a, "allocation") == 0
    p = a.malloc(1 << 20)
    a.free(p)


def test_oom_message_reports_allocated_and_reserved():
    a = Checked()
    p = a.malloc(40 * MiB)  # 40 MiB segment
    q = a.malloc(4 * MiB)  # 20 MiB segment: 60 MiB reserved, 44 MiB allocated
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(10 * MiB, 0, 1)  # needs a 10 MiB segment: 70 > 64
    msg = str(exc.value)
    assert "Tried to allocate 10.00 MiB" in msg
    assert "total capacity of 64.00 MiB of which 4.00 MiB is free" in msg
    assert "44.00 MiB is allocated" in msg
    assert "16.00 MiB is reserved" in msg
    assert cur(a, "allocated_bytes") == 44 * MiB
    assert cur(a, "reserved_bytes") == 60 * MiB
    a.free(p)
    a.free(q)


def test_oom_message_mentions_fraction():
    a = Checked()
    a.set_memory_fraction(0.25)
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(20 * MiB)
    msg = str(exc.value)
    assert "Tried to allocate 20.00 MiB" in msg
    assert "16.00 MiB" in msg  # the fraction's limit
    # the device itself is empty
    assert a.mem_get_info() == (64 * MiB, 64 * MiB)
    assert a.stats()["num_ooms"] == 1


def test_repeated_ooms_do_not_leak():
    a = Checked()
    keep = a.malloc(60 * MiB)
    for i in range(20):
        with pytest.raises(torch.OutOfMemoryError):
            a.malloc(5 * MiB, 0, i % 3)
    s = a.stats()
    assert s["num_ooms"] == 20
    assert s["num_alloc_retries"] == 20
    assert s["segment"]["all"]["current"] == 1
    assert s["segment"]["all"]["allocated"] == 1
    assert _C._testing.live_segments(a.a) == 1
    a.free(keep)
    assert a.malloc(5 * MiB, 0, 2) != 0


# ----------------------------------------------------------- bad pointers ----
def test_double_free_leaves_counters_unchanged():
    a = Checked()
    p = a.malloc(3000)
    keep = a.malloc(5000)
    a.free(p)
    before = a.stats()
    segs = a.segments()
    with pytest.raises(_C.InvalidPointerError) as exc:
        a.free(p)
    assert isinstance(exc.value, ValueError)
    assert "double free" in str(exc.value)
    assert hex(p) in str(exc.value)
    assert a.stats() == before
    assert a.segments() == segs
    # the block can still be reused exactly once
    assert a.malloc(3000) == p
    a.free(p)
    a.free(keep)


def test_double_free_after_reuse_by_other_size():
    a = Checked()
    p = a.malloc(8192)
    a.free(p)
    q = a.malloc(4096)  # reuses p's address
    assert q == p
    a.free(q)
    with pytest.raises(_C.InvalidPointerError):
        a.free(p)
    assert cur(a, "allocation") == 0
    assert a.stats()["allocation"]["all"]["freed"] == 2


def test_unknown_and_interior_pointers():
    a = Checked()
    p = a.malloc(4096)
    before = a.stats()
    with pytest.raises(_C.InvalidPointerError) as exc:
        a.free(p + 512)
    assert "inside a memalloc segment" in str(exc.value)
    with pytest.raises(_C.InvalidPointerError) as exc:
        a.free(0x1234)
    assert "unknown pointer" in str(exc.value)
    with pytest.raises(_C.InvalidPointerError):
        a.free(p + 4096)  # start of the free tail block
    assert a.stats() == before
    a.free(p)


def test_free_on_wrong_device():
    a = Checked("host_capacity_mb:64,host_devices:2")
    p = a.malloc(4096, 1)
    b0, b1 = a.stats(0), a.stats(1)
    with pytest.raises(_C.InvalidPointerError) as exc:
        a.free(p, 0)
    assert "device 0" in str(exc.value)
    assert a.stats(0) == b0 and a.stats(1) == b1
    a.free(p, 1)
    assert cur(a, "allocation", device=1) == 0


# ---------------------------------------------------------- bad arguments ----
@pytest.mark.parametrize("device", [2, 5, -1])
def test_invalid_device_index(device):
    a = Checked("host_capacity_mb:64,host_devices:2")
    p = a.malloc(1000, 1)
    calls = [
        lambda: a.malloc(1000, device),
        lambda: a.free(p, device),
        lambda: a.record_stream(p, 1, device),
        lambda: a.empty_cache(device),
        lambda: a.set_memory_fraction(0.5, device),
        lambda: a.memory_fraction(device),
        lambda: a.stats(device),
        lambda: a.reset_peak_stats(device),
        lambda: a.reset_accumulated_stats(device),
        lambda: a.mem_get_info(device),
        lambda: a.segments(device),
        lambda: a.a.validate(device),
        lambda: a.host_synchronize_stream(0, device),
        lambda: _C._testing.live_segments(a.a, device),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="does not exist"):
            call()
    assert cur(a, "allocation", device=1) == 1
    assert cur(a, "allocation", device=0) == 0
    a.free(p, 1)


def test_typed_arguments_accept_int_and_real_like_values():
    """memalloc._C checks argument types itself (csrc/boundary/python/pyargs.h): what
    it must still accept besides int and float — numpy ints (__index__) and
    floats (__float__), ints for fractions, the largest valid values — and
    that a bool is no number (the wrong-type errors are in test_bad_input)."""
    np = pytest.importorskip("numpy")
    a = Checked("host_capacity_mb:64,host_devices:2")
    p = a.malloc(np.int64(1000), np.int32(1), stream=np.uint64(3))
    assert cur(a, "allocation", device=1) == 1
    a.record_stream(np.uint64(p), 2**64 - 1, device=1)  # any stream handle up to 2**64 - 1
    a.free(np.uint64(p), 1)
    a.set_memory_fraction(np.float32(0.5))
    assert a.memory_fraction() == 0.5
    a.set_memory_fraction(1)
    a.set_gc_threshold(0)
    _C._testing.set_fault_rates(a.a, np.float64(0.0), 0, seed=2**64 - 1)
    _C._testing.inject_allocate_faults(a.a, np.int64(0), 0, driver_error=False)
    with pytest.raises(TypeError, match="driver_error must be a bool"):
        _C._testing.inject_allocate_faults(a.a, 0, 0, 1)
    with pytest.raises(TypeError, match="device must be an int"):
        a.stats(True)
    with pytest.raises(TypeError, match="size must be an int"):
        a.malloc(np.float64(10.0))
    assert "size: int, device: int = 0, stream: int = 0" in _C.Allocator.malloc.__doc__


def test_memory_fraction_zero_allows_nothing_new_as_torch():
    """torch accepts fractions in [0, 1]; 0 lets no new segment be made
    (cached blocks still serve), and the fraction reads back as 0.0."""
    a = Checked()
    assert a.memory_fraction() == 1.0  # none set: the whole device, as torch answers
    kept = a.malloc(1 * MiB)
    a.free(kept)  # a cached 2 MiB segment
    a.set_memory_fraction(0.0)
    assert a.memory_fraction() == 0.0
    a.free(a.malloc(1 * MiB))  # the cached segment serves
    with pytest.raises(torch.OutOfMemoryError, match=r"memory fraction limit of 0 bytes \(fraction 0"):
        a.malloc(40 * MiB)
    a.set_memory_fraction(1.0)
    a.free(a.malloc(40 * MiB))


@pytest.mark.parametrize("fraction", [-0.5, 1.0000001, 2.0, float("nan")])
def test_invalid_memory_fraction(fraction):
    a = Checked()
    a.set_memory_fraction(0.5)
    with pytest.raises(ValueError, match="fraction"):
        a.set_memory_fraction(fraction)
    assert a.memory_fraction() == 0.5
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(40 * MiB)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        _C.Allocator("tpu", "")


# ------------------------------------------------------------------ config ----
def test_parse_config_defaults_and_canonical_form():
    default = _C.parse_config("")
    assert default == "backend:auto,host_capacity_mb:1024,host_devices:1"
    assert _C.parse_config(" , ") == default
    text = " backend : host , max_split_size_mb: 64,host_devices:3 ,roundup_power2_divisions:8, "
    canon = _C.parse_config(text)
    assert canon == (
        "backend:host,max_split_size_mb:64,roundup_power2_divisions:8,host_capacity_mb:1024,host_devices:3"
    )
    assert _C.parse_config(canon) == canon
    assert _C.config_keys() == VALID_KEYS
    a = _C.Allocator("host", text)
    assert a.config == canon
    assert a.device_count == 3
    assert a.backend_name == "host"
    assert a.mem_get_info(2) == (1024 * MiB, 1024 * MiB)


def test_parse_config_later_key_wins():
    assert "host_capacity_mb:8" in _C.parse_config("host_capacity_mb:4,host_capacity_mb:8")


@pytest.mark.parametrize(
    "text,needles",
    [
        ("bogus:1", ["bogus"] + VALID_KEYS),
        ("expandable_segment:True", ["expandable_segment"] + VALID_KEYS),
        ("expandable_segments:maybe", ["expandable_segments", "maybe", "expandable_segments:True"]),
        ("max_split_size_mb:20", ["max_split_size_mb", "20"]),
        ("max_split_size_mb:abc", ["max_split_size_mb", "abc"]),
        ("max_split_size_mb:-5", ["max_split_size_mb", "-5"]),
        ("max_split_size_mb:", ["max_split_size_mb"]),
        ("max_split_size_mb:1.5", ["max_split_size_mb", "1.5"]),
        ("roundup_power2_divisions:3", ["roundup_power2_divisions", "3"]),
        ("roundup_power2_divisions:128", ["roundup_power2_divisions", "128"]),
        ("host_capacity_mb:0", ["host_capacity_mb"]),
        ("host_devices:0", ["host_devices", "0"]),
        ("host_devices:65", ["host_devices", "65"]),
        ("backend:gpu", ["gpu", "auto", "cuda", "host"]),
        ("host_devices", ["host_devices", ":"]),
        ("host_capacity_mb:99999999999999999999999", ["host_capacity_mb", "99999999999999999999999"]),
    ],
)
def test_parse_config_rejects(text, needles):
    with pytest.raises(_C.InvalidArgumentError) as exc:
        _C.parse_config(text)
    assert isinstance(exc.value, ValueError)
    msg = str(exc.value)
    for needle in needles:
        assert needle in msg, (needle, msg)
    with pytest.raises(_C.InvalidArgumentError):
        _C.Allocator("host", text)


@pytest.mark.parametrize(
    "text",
    [
        "max_split_size_mb:21",
        "roundup_power2_divisions:0",
        "roundup_power2_divisions:64",
        "host_devices:64",
        "host_capacity_mb:1",
        "backend:cuda",
        "backend:auto",
    ],
)
def test_parse_config_accepts_boundaries(text):
    canon = _C.parse_config(text)
    assert _C.parse_config(canon) == canon


@pytest.mark.parametrize("value", [1 << 44, (1 << 44) + 21, (1 << 64) - 1])
@pytest.mark.parametrize("key", ["max_split_size_mb", "host_capacity_mb"])
def test_parse_config_megabyte_overflow(key, value):
    # value * 2^20 bytes does not fit size_t: it must not wrap around silently
    # (regression: config.cpp used to multiply without a check, 2^44 -> 0)
    try:
        canon = _C.parse_config(f"{key}:{value}")
    except _C.InvalidArgumentError as e:
        assert key in str(e)
        return
    # accepted: it must then mean what was written and round-trip
    assert f"{key}:{value}" in canon
    assert _C.parse_config(canon) == canon


@pytest.mark.parametrize("size", [-1, -512, -(1 << 40)])
def test_negative_size_is_rejected_and_counts_nothing(size):
    a = Checked()
    keep = a.malloc(4096)
    before = a.stats(0)
    with pytest.raises(ValueError, match="negative size"):
        a.malloc(size)
    with pytest.raises(ValueError, match="negative size"):
        a.host_buffer(size)
    assert a.stats(0) == before
    a.free(keep)
