"""The event ring's clock (csrc/common/clock.h): steady_clock nanoseconds,
read from the CPU's time-stamp counter where Linux keeps its own monotonic
clock on it. Checked against Python's time.monotonic_ns() (the same
CLOCK_MONOTONIC), read on both sides: the scaled counter stays within the
drift bound clock.h states, never runs backwards, and the ring's records
carry times that fall between the monotonic times read around them."""

from __future__ import annotations

import struct
import threading
import time

from memalloc import _C
from memalloc.trace.recording import ACTIONS, RECORD_FORMAT

MAX_DRIFT = 1e-4  # clock.h's kMaxDrift: of the time since calibration


def kernel_clock() -> str:
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_the_counter_is_used_exactly_where_linux_keeps_time_on_it():
    import platform

    _, counter, _ = _C._testing.clock_ns()
    assert counter == (platform.machine() == "x86_64" and kernel_clock() == "tsc")


def test_clock_follows_the_monotonic_clock_within_the_stated_drift():
    _, counter, calibrated_at = _C._testing.clock_ns()
    start = calibrated_at if counter else time.monotonic_ns()
    deadline = time.monotonic_ns() + 300_000_000
    while time.monotonic_ns() < deadline:
        before = time.monotonic_ns()
        ours, _, _ = _C._testing.clock_ns()
        after = time.monotonic_ns()
        # our reading lies between the two monotonic ones, up to the drift since the calibration (and 2 us)
        slack = MAX_DRIFT * max(0, after - start) + 2_000
        assert before - slack <= ours <= after + slack, (before, ours, after)
        time.sleep(0.01)


def test_clock_never_runs_backwards_on_any_thread():
    bad = []

    def run():
        last = 0
        for _ in range(200_000):
            t = _C._testing.clock_ns()[0]
            if t < last:
                bad.append((last, t))
            last = t

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert bad == []


def test_ring_records_are_stamped_between_the_times_around_them(host_allocator):
    a = host_allocator
    a.set_recording(1024, device=0)
    try:
        stamps = []
        for _ in range(50):
            before = time.monotonic_ns()
            p = a.malloc(4096, device=0)
            after = time.monotonic_ns()
            stamps.append((before, after))
            a.free(p, device=0)
        raw, _dropped = a.trace(0)
    finally:
        a.set_recording(0, device=0)
    times = [rec[0] for rec in struct.iter_unpack(RECORD_FORMAT, raw) if ACTIONS[rec[9]] == "alloc"]
    assert len(times) == 50
    _, counter, calibrated_at = _C._testing.clock_ns()
    for (before, after), t in zip(stamps, times):
        slack = (MAX_DRIFT * (after - calibrated_at) if counter else 0) + 2_000
        assert before - slack <= t <= after + slack, (before, t, after)
