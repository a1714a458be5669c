"""Bad-input sweep: every public entry point of memalloc fed wrong types,
negative and huge sizes, unknown / freed / interior pointers, invalid devices
and streams, malformed MEMALLOC_CONF, corrupt files, and calls made before
enable().

The sweep is data: CASES below. A case names the area, the exact call (run as
written), what is wrong with its input, and the answer it must get: an
exception type (a subclass also matches) and a fragment its message must
contain. Every case also checks that nothing changed: the allocator's counters
and settings, recording, the files in the scratch folder, whether memalloc is
enabled. The one allowed change: an out-of-memory error adds one to the
device's num_ooms, as in torch.

A case that does not get such an answer today is a finding: it carries
``bug="..."`` and runs as a strict xfail, so fixing the bug turns it into an
XPASS failure until the marker is removed.

Where the cases run (``env``):
  inproc    this process: a fresh host-backend Allocator per case; no enable().
  before    a fresh interpreter in which memalloc is not enabled.
  conf      a fresh interpreter; MEMALLOC_CONF set per case; enable() must fail.
  cli       a fresh interpreter; ``python -m memalloc ...`` through
            memalloc.__main__.main, MEMALLOC_CONF set per case.
  enabled   a fresh interpreter after memalloc.enable(backend="host", ...).
  fresh:*   one interpreter for one case that may enable memalloc.
before, conf and cli share one interpreter (none of them may enable memalloc).
Each interpreter runs all of its cases and prints one ``CASE <json>`` line per
case; the interpreters run in parallel.

tests/integration/bad_input_catalogue.md (test data beside this file, not a
user's document) is rendered from CASES: ``python
tests/integration/test_bad_input.py --write-doc`` writes it and
test_doc_is_current fails when it differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "tests" / "integration" / "bad_input_catalogue.md"
MiB = 1 << 20
HOST_CONFIG = "host_capacity_mb:64,host_devices:2"  # the inproc allocator and the enabled process
RAW_PYBIND = ("incompatible function arguments", "incompatible constructor arguments")
STDERR = "STDERR"  # expected "error" of entry points that must not raise: a message on stderr


@dataclasses.dataclass(frozen=True)
class Case:
    area: str  # the function or surface under test
    call: str  # exact Python (or `python -m memalloc ...` command line) run
    input: str  # what is wrong with the input
    expect: tuple[tuple[str, str], ...]  # alternatives: (exception type name, message fragment)
    env: str = "inproc"
    conf: str | None = None  # MEMALLOC_CONF while the case runs
    bug: str | None = None  # a finding: why it does not get a clear error today

    @property
    def id(self) -> str:
        conf = f" [MEMALLOC_CONF={self.conf}]" if self.conf is not None else ""
        return f"{self.env}: {self.call}{conf}"


CASES: list[Case] = []


def add(
    area: str,
    call: str,
    input: str,
    error: str,
    fragment: str,
    *,
    env: str = "inproc",
    conf: str | None = None,
    bug: str | None = None,
    alt: tuple[tuple[str, str], ...] = (),
) -> None:
    CASES.append(Case(area, call, input, ((error, fragment),) + tuple(alt), env, conf, bug))


# =============================================================================
# inproc: memalloc.Allocator (host backend), parse_config, config_text.
# Names: a = Allocator("host", HOST_CONFIG) with live blocks p (1000 B, small
# pool) and q (3 MiB, large pool) on device 0, f = a freed pointer whose
# segment is still held by p.
# =============================================================================
A = "Allocator.malloc"
add(A, "a.malloc(-1)", "negative size", "InvalidArgumentError", "negative size -1 bytes")
add(A, 'a.malloc("10")', "str size", "TypeError", "size must be")
add(A, "a.malloc(1.5)", "float size", "TypeError", "size must be")
add(A, "a.malloc(None)", "None size", "TypeError", "size must be")
add(A, "a.malloc(True)", "bool size", "TypeError", "size must be")
add(A, "a.malloc(2**62)", "huge size (2**62)", "OutOfMemoryError", "Tried to allocate")
add(
    A,
    "a.malloc(2**63)",
    "size above int64 (2**63)",
    "OutOfMemoryError",
    "Tried to allocate",
    alt=(("ValueError", "too large"),),
)
add(
    A,
    "a.malloc(2**64)",
    "size above size_t (2**64)",
    "OutOfMemoryError",
    "Tried to allocate",
    alt=(("ValueError", "too large"),),
)
add(A, "a.malloc(1000, -1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "a.malloc(1000, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(
    A,
    "a.malloc(1000, 2**40)",
    "device beyond int (2**40)",
    "InvalidArgumentError",
    "device 1099511627776 does not exist",
    alt=(("TypeError", "device must be"),),
)
add(
    A,
    'a.malloc(1000, "cuda:7")',
    'device "cuda:7"',
    "InvalidArgumentError",
    "device 7 does not exist",
    alt=(("TypeError", "device must be"),),
)
add(A, "a.malloc(1000, 1.5)", "float device", "TypeError", "device must be")
add(A, "a.malloc(1000, 0, -1)", "negative stream", "ValueError", "stream -1")

add("Allocator.live_blocks", "a.live_blocks(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add("Allocator.live_blocks", 'a.live_blocks("0")', "str device", "TypeError", "device must be")

A = "Allocator.free"
add(A, "a.free(0xdead000)", "unknown pointer", "InvalidPointerError", "unknown pointer")
add(A, "a.free(f)", "double free", "InvalidPointerError", "double free")
add(A, "a.free(p + 512)", "interior pointer", "InvalidPointerError", "no live allocation starts there")
add(A, "a.free(p, 1)", "pointer of another device", "InvalidPointerError", "not allocated by memalloc on this device")
add(A, "a.free(p, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.free(-1)", "negative pointer", "InvalidPointerError", "unknown pointer", alt=(("ValueError", "ptr -1"),))
add(A, 'a.free("p")', "str pointer", "TypeError", "ptr must be")

A = "Allocator.record_stream"
add(A, "a.record_stream(0xdead000, 1)", "unknown pointer", "InvalidPointerError", "unknown pointer")
add(A, "a.record_stream(p + 512, 1)", "interior pointer", "InvalidPointerError", "no live allocation starts there")
add(A, "a.record_stream(f, 1)", "freed pointer", "InvalidPointerError", "record_stream of 0x")
add(A, "a.record_stream(p, 1, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.record_stream(p, -1)", "negative stream", "ValueError", "stream -1")
add(A, 'a.record_stream(p, "1")', "str stream", "TypeError", "stream must be")

A = "Allocator.apply_settings"
add(
    A,
    'a.apply_settings("max_split_size_mb:2")',
    "max_split_size_mb too small",
    "InvalidArgumentError",
    "max_split_size_mb must be greater than 20",
)
add(A, 'a.apply_settings("nokey:1")', "unknown key", "InvalidArgumentError", "unknown key 'nokey'")
add(
    A,
    'a.apply_settings("roundup_power2_divisions:[64:3]")',
    "divisions not a power of two",
    "InvalidArgumentError",
    "must be a power of two",
)
add(
    A,
    'a.apply_settings("roundup_power2_divisions:[48:2]")',
    "bound not a power of two",
    "InvalidArgumentError",
    "bound 48 is not a power of two",
)
add(A, "a.apply_settings(5)", "int text", "TypeError", "text must be")

A = "Allocator.settings"
add(A, "a.settings(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, 'a.settings("0")', "str device", "TypeError", "device must be")

A = "_C._testing.HostSegmentSource"
add(A, "memalloc._C._testing.HostSegmentSource(-1)", "negative limit", "InvalidArgumentError", "negative size -1")
add(A, 'memalloc._C._testing.HostSegmentSource("x")', "str limit", "TypeError", "size must be an int")

A = "Allocator.empty_cache"
add(A, "a.empty_cache(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "a.empty_cache(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, 'a.empty_cache("0")', "str device", "TypeError", "device must be")
add(A, "a.empty_cache(1.5)", "float device", "TypeError", "device must be")

A = "Allocator.set_memory_fraction"
for v, what in (("-0.5", "negative"), ("1.5", "above 1"), ('float("nan")', "NaN")):
    add(A, f"a.set_memory_fraction({v})", f"{what} fraction", "InvalidArgumentError", "set a value in [0, 1]")
add(A, "a.set_memory_fraction(0.5, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, 'a.set_memory_fraction("0.5")', "str fraction", "TypeError", "fraction must be")
add(A, "a.set_memory_fraction(None)", "None fraction", "TypeError", "fraction must be")

A = "Allocator.set_gc_threshold"
for v, what in (("1.0", "1"), ("-0.1", "negative"), ('float("nan")', "NaN"), ('float("inf")', "infinite")):
    add(
        A,
        f"a.set_gc_threshold({v})",
        f"{what} threshold",
        "InvalidArgumentError",
        "invalid garbage_collection_threshold",
    )
add(A, "a.set_gc_threshold(0.5, -1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, 'a.set_gc_threshold("0.5")', "str threshold", "TypeError", "threshold must be")

A = "Allocator queries"
add(A, "a.stats(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.stats(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, 'a.stats("0")', "str device", "TypeError", "device must be")
add(A, "a.stats(True)", "bool device", "TypeError", "device must be")
add(A, "a.segments(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "a.segments(1.5)", "float device", "TypeError", "device must be")
add(A, "a.trace(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.mem_get_info(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.memory_fraction(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.gc_threshold(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "a.reset_peak_stats(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.reset_accumulated_stats(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "a.validate(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.take_window(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.take_window(-1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, 'a.enter_phase("fwd")', "unknown phase name", "InvalidArgumentError", "unknown phase 'fwd'")
add(A, "a.enter_phase(None)", "None phase", "TypeError", "phase must be a str")
add(A, "a.phase(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, 'a.resolve("idle", "other")', "the idle phase", "InvalidArgumentError", "phase 'idle' has nothing to resolve")
add(A, 'a.resolve("backward", "grads")', "unknown category name", "InvalidArgumentError", "unknown category 'grads'")
add(A, "a.end_step(-1)", "negative step number", "InvalidArgumentError", "negative step -1")
add(A, 'a.end_step("3")', "str step number", "TypeError", "step must be an int >= 0")
add(A, 'a.mark(-1, "parameters")', "negative pointer", "InvalidArgumentError", "ptr")
add(A, 'a.mark(4096, "weights")', "unknown category name", "InvalidArgumentError", "unknown category 'weights'")
add(A, "a.breakdown(99)", "device 99", "InvalidArgumentError", "device 99 does not exist")

A = "_C._testing private pools"
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (0, 0))",
    "the default pool's id",
    "InvalidArgumentError",
    "default pool",
)
add(A, "memalloc._C._testing.create_or_incref_pool(a, 7)", "int pool id", "TypeError", "pool must be a pair of ints")
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (0, 7), source=3)",
    "int source",
    "TypeError",
    "source must be a memalloc._C._testing.HostSegmentSource",
)
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (1, 2, 3))",
    "three-part pool id",
    "InvalidArgumentError",
    "got 3 items",
)
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (-1, 2))",
    "negative pool id part",
    "InvalidArgumentError",
    "negative part",
)
add(
    A,
    'memalloc._C._testing.create_or_incref_pool(a, ("1", 2))',
    "str pool id part",
    "TypeError",
    "pool must be a pair of ints",
)
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (True, 2))",
    "bool pool id part",
    "TypeError",
    "pool must be a pair of ints",
)
add(
    A,
    "memalloc._C._testing.create_or_incref_pool(a, (1, 2), 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(
    A,
    "memalloc._C._testing.begin_allocate_to_pool(a, (1, 2), [-3])",
    "negative stream",
    "InvalidArgumentError",
    "negative value",
)
add(
    A,
    'memalloc._C._testing.begin_allocate_to_pool(a, (1, 2), ["s"])',
    "str stream",
    "TypeError",
    "streams must hold ints",
)
add(A, "memalloc._C._testing.begin_allocate_to_pool(a, (1, 2), 5)", "streams not iterable", "TypeError", "not iterable")
add(A, "memalloc._C._testing.end_allocate_to_pool(a, (1, 2))", "no open route", "InvalidArgumentError", "do not go to")
add(A, "memalloc._C._testing.release_pool(a, (1, 2))", "unknown pool", "InvalidArgumentError", "does not exist")
add(
    A, "memalloc._C._testing.pool_use_count(a, (0, 0))", "the default pool's id", "InvalidArgumentError", "default pool"
)
add(
    A,
    "memalloc._C._testing.set_pool_use_on_oom(a, (1, 2), True)",
    "unknown pool",
    "InvalidArgumentError",
    "does not exist",
)
add(A, "memalloc._C._testing.set_pool_use_on_oom(a, (1, 2), 1)", "int flag", "TypeError", "use_on_oom must be")
add(A, "memalloc._C._testing.empty_pool_cache(a, [1])", "one-part pool id", "InvalidArgumentError", "got 1 items")
add(A, "memalloc._C._testing.capturing(a, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(
    A,
    "memalloc._C._testing.pool_live_blocks_are(a, (1, 2), [-1])",
    "negative pointer",
    "InvalidArgumentError",
    "negative value",
)
add(A, "memalloc._C._testing.checkpoint_pool(a, (1, 2))", "unknown pool", "InvalidArgumentError", "does not exist")
add(A, "memalloc._C._testing.restore_pool(a, None)", "not a PoolState", "TypeError", "state must be a PoolState")
add(A, "memalloc._C._testing.PoolState()", "constructed by hand", "TypeError", "No constructor defined")

A = "Allocator.set_recording"
add(A, "a.set_recording(10, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.set_recording(-1)", "negative capacity", "ValueError", "capacity -1")
add(A, "a.set_recording(2**62)", "huge capacity (2**62)", "ValueError", "capacity")
add(A, "a.set_recording(2**64)", "capacity above size_t (2**64)", "ValueError", "capacity")
add(A, 'a.set_recording("10")', "str capacity", "TypeError", "capacity must be")

A = "Allocator.record_to_file"
FM = 'memalloc._C.FlightMap(__import__("os").path.join(__import__("tempfile").mkdtemp(), "{}"), 8192)'
add(
    A,
    f"a.record_to_file({FM.format('r1')}, 4096, 100)",
    "a ring beyond the file's end",
    "InvalidArgumentError",
    "does not fit in the 8192-byte file",
)
add(
    A,
    f"a.record_to_file({FM.format('r2')}, 100, 1)",
    "offset not a multiple of 64",
    "InvalidArgumentError",
    "must be a multiple of 64",
)
add(A, f"a.record_to_file({FM.format('r3')}, 4096, 0)", "zero records", "InvalidArgumentError", "capacity must be > 0")
add(
    A,
    f"a.record_to_file({FM.format('r4')}, 4096, 1, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(
    A,
    "a.record_to_file(None, 4096, 1)",
    "None for the file",
    "TypeError",
    "file must be a memalloc._C.FlightMap, not NoneType",
)
add(
    A,
    'a.record_to_file("f", 4096, 1)',
    "a str for the file",
    "TypeError",
    "file must be a memalloc._C.FlightMap, not str",
)
A = "FlightMap"
add(
    A,
    'memalloc._C.FlightMap(__import__("os").path.join(__import__("tempfile").mkdtemp(), "no-dir", "f"), 8192)',
    "a directory that does not exist",
    "RuntimeError",
    "cannot create",
)
add(
    A,
    'memalloc._C.FlightMap(__import__("os").path.join(__import__("tempfile").mkdtemp(), "z"), 0)',
    "zero bytes",
    "InvalidArgumentError",
    "nbytes 0 is too small",
)

A = "Allocator.host_synchronize_stream"
add(A, "a.host_synchronize_stream(0, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "a.host_synchronize_stream(-1)", "negative stream", "ValueError", "stream -1")

A = "Allocator.host_buffer"
add(A, "a.host_buffer(0)", "zero bytes", "InvalidArgumentError", "nbytes must be positive")
add(A, "a.host_buffer(-5)", "negative size", "InvalidArgumentError", "negative size -5 bytes")
add(A, "a.host_buffer(2**62)", "huge size (2**62)", "OutOfMemoryError", "Tried to allocate")
add(
    A,
    "a.host_buffer(2**64)",
    "size above size_t (2**64)",
    "OutOfMemoryError",
    "Tried to allocate",
    alt=(("ValueError", "too large"),),
)
add(A, "a.host_buffer(10, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")

A = "_C._testing faults"
add(
    A,
    "memalloc._C._testing.inject_allocate_faults(a, 0, 1, False, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(A, "memalloc._C._testing.inject_allocate_faults(a, -1, 1)", "negative skip", "ValueError", "skip -1")
add(A, "memalloc._C._testing.inject_allocate_faults(a, 0, -1)", "negative count", "ValueError", "count -1")
add(A, 'memalloc._C._testing.inject_allocate_faults(a, "0", 1)', "str skip", "TypeError", "skip must be")
add(A, "memalloc._C._testing.inject_allocate_faults(None, 0, 1)", "None allocator", "TypeError", "allocator must be")
add(
    A,
    "memalloc._C._testing.inject_release_faults(a, 0, 1, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(A, "memalloc._C._testing.inject_release_faults(a, 0, -1)", "negative count", "ValueError", "count -1")
add(
    A,
    "memalloc._C._testing.set_fault_rates(a, 2.0, 0.0)",
    "allocate rate above 1",
    "InvalidArgumentError",
    "fault rates are probabilities in [0, 1]",
)
add(
    A,
    "memalloc._C._testing.set_fault_rates(a, 0.0, -0.5)",
    "negative release rate",
    "InvalidArgumentError",
    "fault rates are probabilities in [0, 1]",
)
add(
    A,
    'memalloc._C._testing.set_fault_rates(a, float("nan"), 0.0)',
    "NaN rate",
    "InvalidArgumentError",
    "fault rates are probabilities in [0, 1]",
)
add(
    A,
    "memalloc._C._testing.set_fault_rates(a, 0.0, 0.0, 0, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(A, "memalloc._C._testing.set_fault_rates(a, 0.0, 0.0, -1)", "negative seed", "ValueError", "seed -1")
add(A, "memalloc._C._testing.clock_ns(1)", "an argument", "TypeError", "takes no arguments")
add(A, "memalloc._C._testing.faults_injected(a, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "memalloc._C._testing.live_segments(a, -1)", "device -1", "InvalidArgumentError", "device -1 does not exist")
add(A, "memalloc._C._testing.live_segments(a.stats)", "not an allocator", "TypeError", "allocator must be")
add(
    A,
    "memalloc._C._testing.capture_work(a, 5)",
    "stream not captured",
    "InvalidArgumentError",
    "capture_work on a stream not being captured",
)
add(
    A,
    "memalloc._C._testing.capture_end(a, 5)",
    "stream not captured",
    "InvalidArgumentError",
    "capture_end on a stream not being captured",
)
add(
    A,
    "memalloc._C._testing.capture_begin(a, 5); memalloc._C._testing.capture_begin(a, 5)",
    "captured twice",
    "InvalidArgumentError",
    "the stream is already being captured",
)
add(
    A,
    "memalloc._C._testing.capture_begin(a, 5); memalloc._C._testing.capture_begin(a, 6); "
    "memalloc._C._testing.capture_wait(a, 6, 5)",
    "two captures",
    "InvalidArgumentError",
    "the streams are in different captures",
)
add(A, "memalloc._C._testing.capture_begin(a, -1)", "negative stream", "ValueError", "stream -1")
add(
    A, "memalloc._C._testing.capture_wait(a, 1, 2, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist"
)

A = "_C._testing CUDA IPC handle bytes"
add(
    A,
    'memalloc._C._testing.ipc_decode(bytes([3]) + b"e" + bytes(10))',
    "a short 'e' handle",
    "InvalidArgumentError",
    "has a 32-byte header",
)
add(
    A,
    'memalloc._C._testing.ipc_encode_cuda_malloc(2, b"x")',
    "a 1-byte cudaIpcMemHandle",
    "InvalidArgumentError",
    "a cudaIpcMemHandle has 64 bytes",
)
add(
    A,
    "memalloc._C._testing.ipc_encode_expandable(4, 1, 2 << 20, [3])",
    "version 4",
    "InvalidArgumentError",
    "version 2 or 3",
)
add(
    A,
    "memalloc._C._testing.ipc_encode_expandable(3, 1, 2 << 20, [])",
    "no pages",
    "InvalidArgumentError",
    "at least one page",
)
add(
    A,
    'memalloc._C._testing.ipc_version_for_torch("2", 13)',
    "a str major",
    "TypeError",
    "two non-negative ints, e.g. (2, 13), not '2'",
)

A = "_C._testing virtual memory"
add(A, "memalloc._C._testing.vm_page_size(a, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "memalloc._C._testing.vm_page_size(None)", "None allocator", "TypeError", "allocator must be")
add(
    A,
    "memalloc._C._testing.vm_reserve(a, 3)",
    "not a page multiple",
    "InvalidArgumentError",
    "positive multiple of the page size",
)
add(A, "memalloc._C._testing.vm_reserve(a, -1)", "negative size", "InvalidArgumentError", "negative size -1")
add(
    A,
    "memalloc._C._testing.vm_reserve(a, 8 << 20, page=3)",
    "a page that is no granularity multiple",
    "InvalidArgumentError",
    "positive multiple of the granularity (2097152 bytes), not 3",
)
add(
    A,
    "memalloc._C._testing.vm_reserve(a, 6 << 20, page=4 << 20)",
    "not a multiple of its page",
    "InvalidArgumentError",
    "positive multiple of the page size (4194304 bytes)",
)
add(
    A,
    "memalloc._C._testing.vm_map(a, memalloc._C._testing.vm_reserve(a, 8 << 20) + 4096, 2 << 20)",
    "unaligned address",
    "InvalidArgumentError",
    "whole pages of the reservation (2097152 bytes)",
)
add(A, "memalloc._C._testing.vm_calls(a, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(A, "memalloc._C._testing.vm_calls(None)", "None allocator", "TypeError", "allocator must be")
add(
    A,
    "memalloc._C._testing.vm_map(a, 0, 2 << 20)",
    "address in no reservation",
    "InvalidArgumentError",
    "in no reservation",
)
add(A, "memalloc._C._testing.vm_map(a, -1, 2 << 20)", "negative address", "ValueError", "-1")
add(
    A,
    "memalloc._C._testing.vm_unmap(a, 0, 2 << 20)",
    "address in no reservation",
    "InvalidArgumentError",
    "in no reservation",
)
add(
    A,
    "memalloc._C._testing.vm_detach(a, memalloc._C._testing.vm_reserve(a, 8 << 20), 2 << 20)",
    "range not mapped",
    "InvalidArgumentError",
    "vm_detach: a page of the range is not mapped",
)
add(A, "memalloc._C._testing.vm_detach(a, 0, 2 << 20, stream=-1)", "negative stream", "ValueError", "-1")
add(A, "memalloc._C._testing.vm_drop_spares(a, 99)", "device 99", "InvalidArgumentError", "device 99 does not exist")
add(
    A,
    "memalloc._C._testing.vm_free(a, 4096)",
    "no reservation there",
    "InvalidArgumentError",
    "no reservation starts at this address",
)

A = "_C._testing.malloc_on_native_thread"
add(
    A,
    "memalloc._C._testing.malloc_on_native_thread(a, -1)",
    "negative size",
    "InvalidArgumentError",
    "negative size -1 bytes",
)
add(A, 'memalloc._C._testing.malloc_on_native_thread(a, "10")', "str size", "TypeError", "size must be")
add(
    A,
    "memalloc._C._testing.malloc_on_native_thread(a, 1000, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
)
add(A, "memalloc._C._testing.malloc_on_native_thread(None, 1000)", "None allocator", "TypeError", "allocator must be")

A = "memalloc.Allocator()"
add(A, 'memalloc.Allocator("bogus")', "unknown backend", "InvalidArgumentError", "unknown backend 'bogus'")
add(
    A,
    'memalloc.Allocator("host", "host_devices:0")',
    "bad config value",
    "InvalidArgumentError",
    "host_devices must be between 1 and 64",
)
add(A, 'memalloc.Allocator("cuda")', "CUDA backend without a GPU", "DriverError", "CUDA backend unavailable")
add(A, "memalloc.Allocator(None)", "None backend", "TypeError", "backend must be")
add(A, 'memalloc.Allocator("host", 5)', "int config", "TypeError", "config must be")

A = "parse_config"
add(A, 'memalloc._C.parse_config("host_devices")', "missing colon", "InvalidArgumentError", "has no ':'")
add(A, 'memalloc._C.parse_config("host_devices=2")', "'=' instead of ':'", "InvalidArgumentError", "has no ':'")
add(
    A,
    'memalloc._C.parse_config("bogus:1")',
    "unknown key",
    "InvalidArgumentError",
    "unknown key 'bogus'; valid keys are",
)
add(A, 'memalloc._C.parse_config(":1")', "empty key", "InvalidArgumentError", "unknown key ''")
add(
    A,
    'memalloc._C.parse_config("Host_Devices:2")',
    "key in the wrong case",
    "InvalidArgumentError",
    "unknown key 'Host_Devices'",
)
add(
    A,
    'memalloc._C.parse_config("host_devices:2;host_capacity_mb:4")',
    "';' instead of ','",
    "InvalidArgumentError",
    "value '2;host_capacity_mb:4' of key 'host_devices'",
)
add(
    A,
    'memalloc._C.parse_config("host_devices:1:2")',
    "two colons",
    "InvalidArgumentError",
    "value '1:2' of key 'host_devices'",
)
add(
    A,
    f'memalloc._C.parse_config("record_history:{2**62}")',
    "record_history too large to allocate",
    "InvalidArgumentError",
    "record_history",
)
add(A, "memalloc._C.parse_config(None)", "None text", "TypeError", "must be a")

A = "config_text"
add(A, "memalloc.core._config.config_text(123)", "int config", "TypeError", "config must be a 'key:value,...' string")
add(
    A,
    'memalloc.core._config.config_text({"nope": 1}, use_env=False)',
    "mapping with an unknown key",
    "InvalidArgumentError",
    "unknown key 'nope'",
)
add(
    A,
    'memalloc.core._config.config_text({"host_devices": None}, use_env=False)',
    "mapping value None",
    "InvalidArgumentError",
    "value 'None' of key 'host_devices'",
)
add(
    A,
    'memalloc.core._config.config_text({"host_devices": "2,host_capacity_mb:1"}, use_env=False)',
    "mapping value containing ',' and ':'",
    "InvalidArgumentError",
    "host_devices",
)
add(
    A,
    'memalloc.core._config.config_text({"host_capacity_mb:1,host_devices": 2}, use_env=False)',
    "mapping key containing ',' and ':'",
    "InvalidArgumentError",
    "host_capacity_mb:1,host_devices",
)

A = "host.cpu_tensors_from"
add(
    A,
    'host.cpu_tensors_from("x").__enter__()',
    "allocator that is not an Allocator",
    "TypeError",
    "allocator must be a memalloc.Allocator on the host backend",
)
add(A, "memalloc._C.CpuRoute(None)", "None allocator", "TypeError", "allocator must be")

A = "host.empty"
add(A, 'host.empty(10, allocator="x")', "allocator that is not an Allocator", "TypeError", "allocator must be")

A = "largest_batch"
add(
    A,
    "memalloc.largest_batch(3, allocator=a)",
    "a step that is not a function",
    "PlannerError",
    "step must be a function of the batch size, not int",
)
add(
    A,
    "memalloc.largest_batch(lambda b: None, allocator=a, probes=(4,))",
    "one probe batch size",
    "PlannerError",
    "probes must be two or more different batch sizes",
)
add(
    A,
    "memalloc.largest_batch(lambda b: None, allocator=a, probes=(0, 2))",
    "a probe of 0",
    "PlannerError",
    "probes must be two or more different batch sizes (ints >= 1)",
)
add(
    A,
    "memalloc.largest_batch(lambda b: None, allocator=a, steps=0)",
    "no recorded steps",
    "PlannerError",
    "steps must be an int >= 1",
)
add(
    A,
    "memalloc.largest_batch(lambda b: None, budget=1000, allocator=a)",
    "a budget under 1 MiB",
    "PlannerError",
    "budget must be an int of bytes, at least 1 MiB",
)
add(
    A,
    "memalloc.largest_batch(lambda b: None, allocator=a, device=5)",
    "device 5",
    "InvalidArgumentError",
    "device 5 does not exist",
)

# =============================================================================
# before: memalloc not enabled. Names: scratch = an empty scratch folder.
# =============================================================================
NOT_ENABLED = "call memalloc.enable() first"
for call in (
    "memory.memory_allocated()",
    "memory.max_memory_allocated()",
    "memory.memory_reserved()",
    "memory.max_memory_reserved()",
    "memory.memory_stats()",
    "memory.memory_stats_raw()",
    "memory.memory_stats_as_nested_dict()",
    "memory.memory_summary()",
    "memory.reset_peak_memory_stats()",
    "memory.reset_accumulated_memory_stats()",
    "memory.empty_cache()",
    "memory.mem_get_info()",
    "memory.get_per_process_memory_fraction()",
    "memory.set_per_process_memory_fraction(0.5)",
    "memory.list_gpu_processes()",
    "memory.set_empty_cache_policy(threshold=0.5)",
    "memory.empty_cache_policy()",
    "record_history()",
    "events()",
    "recording.events_array()",
    "snapshot()",
    'save_trace(scratch + "/run.trace")',
    "installed_allocator()",
    "memory.memory_allocated(99)",
    "memory_breakdown()",
):
    add("before enable()", f"memalloc.{call}", "not enabled yet", "RuntimeError", NOT_ENABLED, env="before")
add(
    "before enable()",
    'memalloc.dump_snapshot(scratch + "/snap.pickle")',
    "not enabled yet",
    "RuntimeError",
    NOT_ENABLED,
    env="before",
)
add("before enable()", "memalloc.StepTracker().start()", "not enabled yet", "RuntimeError", NOT_ENABLED, env="before")
for call in ("host.empty(10)", "host.zeros(10)"):
    add(
        "before enable()",
        call,
        "no host allocator installed",
        "RuntimeError",
        "call memalloc.enable(backend='host') first",
        env="before",
    )

# =============================================================================
# conf: MEMALLOC_CONF per case, then memalloc.enable(); nothing may be enabled.
# =============================================================================
BAD_CONF = [
    ("bogus:1", "unknown key", "InvalidArgumentError", "unknown key 'bogus'; valid keys are"),
    ("host_devices", "missing colon", "InvalidArgumentError", "has no ':'"),
    ("backend:gpu", "backend", "InvalidArgumentError", "backend 'gpu' is unknown; use one of auto, cuda, host"),
    ("backend:cuda", "backend cuda without a GPU", "RuntimeError", "CUDA is not usable"),
    ("max_split_size_mb:20", "max_split_size_mb", "InvalidArgumentError", "max_split_size_mb must be greater than 20"),
    ("max_split_size_mb:abc", "max_split_size_mb", "InvalidArgumentError", "value 'abc' of key 'max_split_size_mb'"),
    ("max_split_size_mb:-1", "max_split_size_mb", "InvalidArgumentError", "value '-1' of key 'max_split_size_mb'"),
    (f"max_split_size_mb:{2**41}", "max_split_size_mb", "InvalidArgumentError", "is too large"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions", "InvalidArgumentError", "must be a power of two"),
    ("roundup_power2_divisions:128", "roundup_power2_divisions", "InvalidArgumentError", "must be a power of two"),
    (
        "garbage_collection_threshold:1",
        "garbage_collection_threshold",
        "InvalidArgumentError",
        "value '1' of key 'garbage_collection_threshold' is invalid",
    ),
    (
        "garbage_collection_threshold:-0.5",
        "garbage_collection_threshold",
        "InvalidArgumentError",
        "value '-0.5' of key 'garbage_collection_threshold' is invalid",
    ),
    (
        "garbage_collection_threshold:nan",
        "garbage_collection_threshold",
        "InvalidArgumentError",
        "value 'nan' of key 'garbage_collection_threshold' is invalid",
    ),
    (
        "garbage_collection_threshold:abc",
        "garbage_collection_threshold",
        "InvalidArgumentError",
        "value 'abc' of key 'garbage_collection_threshold' is invalid",
    ),
    (
        "expandable_segments:yes",
        "expandable_segments",
        "InvalidArgumentError",
        "value 'yes' of key 'expandable_segments' is not a boolean",
    ),
    (
        "reuse_free_pages:2",
        "reuse_free_pages",
        "InvalidArgumentError",
        "value '2' of key 'reuse_free_pages' is not a boolean",
    ),
    (
        "empty_cache_every_n_steps:-1",
        "empty_cache_every_n_steps",
        "InvalidArgumentError",
        "value '-1' of key 'empty_cache_every_n_steps'",
    ),
    (
        "empty_cache_every_n_steps:1.5",
        "empty_cache_every_n_steps",
        "InvalidArgumentError",
        "value '1.5' of key 'empty_cache_every_n_steps'",
    ),
    ("patch_torch:yes", "patch_torch", "InvalidArgumentError", "value 'yes' of key 'patch_torch' is not a boolean"),
    ("record_history:x", "record_history", "InvalidArgumentError", "value 'x' of key 'record_history'"),
    ("record_history:-5", "record_history", "InvalidArgumentError", "value '-5' of key 'record_history'"),
    ("record_stacks:all", "record_stacks", "InvalidArgumentError", "record_stacks 'all' is unknown"),
    ("call_sites:on", "call_sites", "InvalidArgumentError", "value 'on' of key 'call_sites' is not a boolean"),
    ("host_capacity_mb:0", "host_capacity_mb", "InvalidArgumentError", "host_capacity_mb must be positive"),
    ("host_capacity_mb:1e3", "host_capacity_mb", "InvalidArgumentError", "value '1e3' of key 'host_capacity_mb'"),
    ("host_devices:0", "host_devices", "InvalidArgumentError", "host_devices must be between 1 and 64 (got 0)"),
    ("host_devices:65", "host_devices", "InvalidArgumentError", "host_devices must be between 1 and 64 (got 65)"),
    ("host_devices:", "host_devices (empty value)", "InvalidArgumentError", "value '' of key 'host_devices'"),
]
for conf, what, error, fragment in BAD_CONF:
    add("MEMALLOC_CONF", "memalloc.enable()", f"bad {what}", error, fragment, env="conf", conf=conf)
add(
    "MEMALLOC_CONF",
    'memalloc.enable(backend="host", config="host_devices:2")',
    "bad environment, valid argument",
    "InvalidArgumentError",
    "unknown key 'bogus'",
    env="conf",
    conf="bogus:1",
)

A = "enable"
add(
    A,
    'memalloc.enable(backend="bogus")',
    "unknown backend",
    "ValueError",
    "unknown backend 'bogus': use one of auto, cuda, host",
    env="conf",
)
add(A, "memalloc.enable(backend=None)", "None backend", "ValueError", "unknown backend None", env="conf")
add(A, 'memalloc.enable(backend="cuda")', "CUDA without a GPU", "RuntimeError", "CUDA is not usable", env="conf")
add(A, "memalloc.enable(config=123)", "int config", "TypeError", "config must be a 'key:value,...' string", env="conf")
add(A, 'memalloc.enable(config=["host_devices:2"])', "list config", "TypeError", "not list", env="conf")
add(
    A,
    'memalloc.enable(config={"host_devices": 0})',
    "mapping with a bad value",
    "InvalidArgumentError",
    "host_devices must be between 1 and 64",
    env="conf",
)
add(
    A,
    f'memalloc.enable(backend="host", config="record_history:{2**62}")',
    "record_history too large",
    "InvalidArgumentError",
    "record_history",
    env="fresh:record_history",
)

# =============================================================================
# cli: python -m memalloc ... (MEMALLOC_CONF per case)
# =============================================================================
A = "python -m memalloc"
add(
    A,
    "python -m memalloc info",
    "bad MEMALLOC_CONF",
    "SystemExit",
    "memalloc: MEMALLOC_CONF: unknown key 'bogus'",
    env="cli",
    conf="bogus:1",
)
add(
    A,
    "python -m memalloc demo",
    "bad MEMALLOC_CONF",
    "SystemExit",
    "memalloc: MEMALLOC_CONF: backend 'gpu' is unknown",
    env="cli",
    conf="backend:gpu",
)
add(
    A,
    "python -m memalloc run --config host_devices:0 script.py",
    "bad --config",
    "SystemExit",
    "host_devices must be between 1 and 64",
    env="cli",
)
add(
    A,
    "python -m memalloc run --backend cuda script.py",
    "CUDA without a GPU",
    "SystemExit",
    "CUDA is not usable",
    env="cli",
)
add(
    A,
    "python -m memalloc run --backend gpu script.py",
    "unknown --backend",
    "SystemExit",
    "invalid choice: 'gpu'",
    env="cli",
)
add(A, "python -m memalloc demo --steps 0", "--steps 0", "SystemExit", "--steps must be at least 1", env="cli")
add(A, "python -m memalloc demo --steps x", "non-integer --steps", "SystemExit", "invalid int value: 'x'", env="cli")
add(A, "python -m memalloc", "no command", "SystemExit", "the following arguments are required: command", env="cli")
add(A, "python -m memalloc run", "no script", "SystemExit", "the following arguments are required: script", env="cli")
add(A, "python -m memalloc bogus", "unknown command", "SystemExit", "invalid choice: 'bogus'", env="cli")
add(
    A,
    "python -m memalloc run /nonexistent/script.py",
    "missing script",
    "SystemExit",
    "/nonexistent/script.py",
    env="fresh:run_missing_script",
)
add(
    A,
    "python -m memalloc run --fit 7GiB script.py --batch-size 3",
    "--fit without {batch} in the script's arguments",
    "SystemExit",
    "--fit needs the script's batch size argument written as {batch}",
    env="cli",
)
add(
    A,
    "python -m memalloc run --fit 7parsecs script.py {batch}",
    "--fit budget in an unknown unit",
    "SystemExit",
    "give bytes (an int), a number with a unit (7GiB, 7.5G, 512MiB, 500MB) or 'free'",
    env="cli",
)
add(
    A,
    "python -m memalloc run --fit 1GiB --fit-probes 4 script.py {batch}",
    "one probe batch size",
    "SystemExit",
    "give two or more different batch sizes",
    env="cli",
)
add(
    A,
    "python -m memalloc run --fit 1GiB --fit-max 4 script.py {batch}",
    "--fit-max below the probes",
    "SystemExit",
    "--fit-max 4 is below the largest probe (8)",
    env="cli",
)

# =============================================================================
# enabled: memalloc.enable(backend="host", config=HOST_CONFIG) in a fresh
# interpreter. Names: a = memalloc.installed_allocator(); t = a live
# host.empty(1000) tensor; lib = ctypes.CDLL(memalloc._C.__file__) with
# argtypes set; LIVE = lib.memalloc_alloc(4096, 0, None); FREED = a 3 MiB
# pointer from lib.memalloc_alloc already given back with lib.memalloc_free;
# scratch = a scratch folder; fd = a file descriptor opened on a scratch file
# for the case; not_a_trace, empty_file, magic_only, bad_json, no_devices,
# short_records, bad_action, huge_header = corrupt trace files in scratch.
# =============================================================================
E = "enabled"
DEVICE_QUERIES = (
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "memory_stats_raw",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "mem_get_info",
    "get_per_process_memory_fraction",
    "list_gpu_processes",
    "events",
    "events_array",
    "snapshot",
    "memory_breakdown",
)
# where each lives: torch.cuda's queries in memalloc.memory, the raw events in memalloc.recording
WHERE = {"events_array": "recording."} | {
    fn: "memory." for fn in DEVICE_QUERIES if fn not in ("events", "events_array", "snapshot", "memory_breakdown")
}
for fn in DEVICE_QUERIES:
    for dev, what, error, fragment in (
        ("-1", "device -1", "InvalidArgumentError", "device -1 does not exist"),
        ("99", "device 99", "InvalidArgumentError", "device 99 does not exist"),
        ('"cuda:7"', 'device "cuda:7"', "InvalidArgumentError", "device 7 does not exist"),
        ("1.5", "float device", "TypeError", "device must be an int"),
        ("True", "bool device", "TypeError", "not bool"),
    ):
        add(fn, f"memalloc.{WHERE.get(fn, '')}{fn}({dev})", what, error, fragment, env=E)
add(
    "memory_allocated",
    'memalloc.memory.memory_allocated(torch.device("cuda", 5))',
    "torch.device cuda:5",
    "InvalidArgumentError",
    "device 5 does not exist",
    env=E,
)
add("memory_allocated", "memalloc.memory.memory_allocated([0])", "list device", "TypeError", "not list", env=E)
add(
    "memory_allocated",
    'memalloc.memory.memory_allocated("xyz")',
    "unparsable device string",
    "RuntimeError",
    "device string: xyz",
    env=E,
)
add("memory_allocated", 'memalloc.memory.memory_allocated("cpu")', 'device "cpu"', "ValueError", "cpu", env=E)
add(
    "memory_allocated",
    "memalloc.memory.memory_allocated(2**64)",
    "device beyond int (2**64)",
    "InvalidArgumentError",
    "does not exist",
    env=E,
)

A = "set_per_process_memory_fraction"
for v, what in (("-0.5", "negative"), ("1.5", "above 1"), ('float("nan")', "NaN")):
    add(
        A,
        f"memalloc.memory.set_per_process_memory_fraction({v})",
        f"{what} fraction",
        "InvalidArgumentError",
        "set a value in [0, 1]",
        env=E,
    )
add(
    A,
    "memalloc.memory.set_per_process_memory_fraction(0.5, 99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
    env=E,
)
add(
    A,
    'memalloc.memory.set_per_process_memory_fraction(0.5, "cuda:7")',
    'device "cuda:7"',
    "InvalidArgumentError",
    "device 7 does not exist",
    env=E,
)
add(
    A,
    "memalloc.memory.set_per_process_memory_fraction(0.5, 1.5)",
    "float device",
    "TypeError",
    "device must be an int",
    env=E,
)
add(A, 'memalloc.memory.set_per_process_memory_fraction("0.5")', "str fraction", "TypeError", "fraction must be", env=E)
add(A, "memalloc.memory.set_per_process_memory_fraction(True)", "bool fraction", "TypeError", "fraction must be", env=E)
add(A, "memalloc.memory.set_per_process_memory_fraction(None)", "None fraction", "TypeError", "fraction must be", env=E)
add(
    A,
    'memalloc.memory.set_per_process_memory_fraction("abc")',
    "non-numeric str fraction",
    "TypeError",
    "fraction must be",
    env=E,
)

A = "set_empty_cache_policy"
for kw, what in (
    ("threshold=1.0", "threshold 1"),
    ("threshold=-0.1", "negative threshold"),
    ('threshold=float("nan")', "NaN threshold"),
):
    add(
        A,
        f"memalloc.memory.set_empty_cache_policy({kw})",
        what,
        "ValueError",
        "invalid garbage_collection_threshold",
        env=E,
    )
for kw, what in (
    ("every_n_steps=-1", "negative every_n_steps"),
    ("every_n_steps=1.5", "float every_n_steps"),
    ("every_n_steps=True", "bool every_n_steps"),
    ('every_n_steps="3"', "str every_n_steps"),
    ("threshold=0.5, every_n_steps=-1", "valid threshold, bad every_n_steps"),
):
    add(
        A,
        f"memalloc.memory.set_empty_cache_policy({kw})",
        what,
        "ValueError",
        "every_n_steps must be an int >= 0",
        env=E,
    )
add(
    A,
    "memalloc.memory.set_empty_cache_policy(0.5)",
    "positional argument",
    "TypeError",
    "takes 0 positional arguments",
    env=E,
)
add(
    A, 'memalloc.memory.set_empty_cache_policy(threshold="x")', "str threshold", "TypeError", "threshold must be", env=E
)
add(
    A,
    'memalloc.memory.set_empty_cache_policy(threshold="0.5")',
    "numeric str threshold",
    "TypeError",
    "threshold must be",
    env=E,
)

A = "empty_cache_policy"
add(A, "memalloc.memory.empty_cache_policy(99)", "device 99", "InvalidArgumentError", "device 99 does not exist", env=E)
add(
    A,
    'memalloc.memory.empty_cache_policy("cuda:7")',
    'device "cuda:7"',
    "InvalidArgumentError",
    "device 7 does not exist",
    alt=(("TypeError", "device must be"),),
    env=E,
)

add("step", "memalloc.step(1)", "unexpected argument", "TypeError", "takes 0 positional arguments", env=E)
add("steps", "memalloc.iteration.steps(1)", "unexpected argument", "TypeError", "takes 0 positional arguments", env=E)
add("steps_of", "memalloc.steps_of(5)", "not iterable", "TypeError", "steps_of needs an iterable", env=E)
add(
    "add_step_listener",
    "memalloc.iteration.add_step_listener(3)",
    "not callable",
    "TypeError",
    "a step listener must be callable",
    env=E,
)
add(
    "remove_step_listener",
    "memalloc.iteration.remove_step_listener(None)",
    "not callable",
    "TypeError",
    "a step listener must be callable",
    env=E,
)
add("auto_step", 'memalloc.auto_step("yes")', "str flag", "TypeError", "enabled must be a bool", env=E)

A = "leak_check"
add(
    A,
    "memalloc.leak_check(warmup_steps=-1)",
    "negative warmup_steps",
    "ValueError",
    "warmup_steps must be an int >= 0",
    env=E,
)
add(
    A,
    "memalloc.leak_check(warmup_steps=1.5)",
    "float warmup_steps",
    "ValueError",
    "warmup_steps must be an int >= 0",
    env=E,
)
add(
    A,
    'memalloc.leak_check(threshold_bytes_per_step="1k")',
    "str threshold",
    "ValueError",
    "threshold_bytes_per_step must be an int >= 0",
    env=E,
)
add(
    A,
    "memalloc.leak_check(max_bytes_per_step=-1)",
    "negative limit",
    "ValueError",
    "max_bytes_per_step must be a number >= 0",
    env=E,
)
add(A, "memalloc.leak_check(99)", "device 99", "ValueError", "device 99 does not exist", env=E)
add(
    "LeakTracker",
    "memalloc.LeakTracker(threshold_bytes_per_step=True)",
    "bool threshold",
    "ValueError",
    "threshold_bytes_per_step must be an int >= 0",
    env=E,
)

A = "set_oom_report"
add(
    A,
    "memalloc.set_oom_report(max_reports=-1)",
    "negative max_reports",
    "ValueError",
    "max_reports must be an int >= 0",
    env=E,
)
add(A, "memalloc.set_oom_report(top=0)", "zero top", "ValueError", "top must be an int >= 1", env=E)
add(A, 'memalloc.set_oom_report("yes")', "str enabled", "TypeError", "enabled must be a bool", env=E)
add(A, "memalloc.set_oom_report(directory=5)", "int directory", "TypeError", "directory must be a path", env=E)
add("top_holders", "memalloc.top_holders(99)", "device 99", "InvalidArgumentError", "device 99 does not exist", env=E)
add("top_holders", "memalloc.top_holders(n=0)", "zero n", "ValueError", "n must be an int >= 1", env=E)
add(
    "remove_step_listener",
    "memalloc.iteration.remove_step_listener()",
    "no listener",
    "TypeError",
    "missing 1 required positional argument",
    env=E,
)
add("auto_step", "memalloc.auto_step(True, 1)", "extra argument", "TypeError", "positional argument", env=E)

A = "StepTracker"
for dev, what, error, fragment in (
    ("2", "device 2 (of 0..1)", "InvalidArgumentError", "device 2 does not exist"),
    ('"cuda:7"', 'device "cuda:7"', "InvalidArgumentError", "device 7 does not exist"),
    ("1.5", "float device", "TypeError", "device must be an int"),
    ("True", "bool device", "TypeError", "not bool"),
):
    add(A, f"memalloc.StepTracker({dev})", what, error, fragment, env=E)
add(A, "memalloc.StepTracker().record_row()", "not started", "RuntimeError", "call start()", env=E)
add(A, "with memalloc.StepTracker() as tr: tr.start()", "started twice", "RuntimeError", "already running", env=E)
for arg, what, error in (
    ("-1", "negative step", "ValueError"),
    ('"3"', "str step", "TypeError"),
    ("True", "bool step", "TypeError"),
):
    add(A, f"with memalloc.StepTracker() as tr: tr.record_row(step={arg})", what, error, "step must be", env=E)
add(A, "memalloc.StepTracker().to_csv(scratch)", "a folder, not a file", "IsADirectoryError", "is a directory", env=E)
add(
    A,
    'memalloc.StepTracker().to_json("/nonexistent/rows.json")',
    "folder that does not exist",
    "FileNotFoundError",
    "does not exist; create it first",
    env=E,
)
add(
    A,
    'memalloc.StepTracker().to_csv(b"rows.csv")',
    "bytes path",
    "TypeError",
    "path must be a str or os.PathLike",
    env=E,
)
add(
    A,
    'memalloc.StepTracker().plot(scratch + "/m.png")',
    "no rows (or no matplotlib)",
    "ImportError",
    "pip install matplotlib",
    alt=(("ValueError", "no rows yet"),),
    env=E,
)

A = "record_history"
for kw, what in (
    ("max_entries=0", "zero max_entries"),
    ("max_entries=-5", "negative max_entries"),
    ("max_entries=1.5", "float max_entries"),
    ("max_entries=True", "bool max_entries"),
    ('max_entries="10"', "str max_entries"),
):
    add(A, f"memalloc.record_history({kw})", what, "ValueError", "max_entries must be a positive int", env=E)
add(
    A,
    "memalloc.record_history(max_entries=2**62)",
    "huge max_entries (2**62)",
    "ValueError",
    "max_entries",
    env=E,
)
add(
    A,
    "memalloc.record_history(max_entries=2**64)",
    "max_entries above size_t (2**64)",
    "ValueError",
    "max_entries",
    env=E,
)
for kw, what in (('stacks="all"', "unknown stacks mode"), ("stacks=None", "None stacks mode")):
    add(
        A,
        f"memalloc.record_history({kw})",
        what,
        "ValueError",
        "stacks must be one of none, tags, python",
        env=E,
    )
add(
    A,
    "memalloc.record_history(device=99)",
    "device 99",
    "InvalidArgumentError",
    "device 99 does not exist",
    env=E,
)
add(
    A,
    'memalloc.record_history(device="cuda:7")',
    'device "cuda:7"',
    "InvalidArgumentError",
    "device 7 does not exist",
    env=E,
)
add(A, "memalloc.record_history(device=1.5)", "float device", "TypeError", "device must be an int", env=E)

for arg, what in (('""', "empty tag"), ('"a/b"', "tag with '/'"), ("1", "int tag"), ("None", "None tag")):
    add("tag", f"with memalloc.tag({arg}): pass", what, "ValueError", "a tag is a non-empty str without '/'", env=E)

for fn, ext in (("dump_snapshot", "pickle"), ("save_trace", "trace")):
    add(
        fn,
        f'memalloc.{fn}("/nonexistent/out.{ext}")',
        "folder that does not exist",
        "FileNotFoundError",
        "No such file or directory",
        env=E,
    )
    add(fn, f"memalloc.{fn}(scratch)", "a folder, not a file", "IsADirectoryError", "Is a directory", env=E)
    add(fn, f"memalloc.{fn}(None)", "None path", "TypeError", "expected str, bytes or os.PathLike object", env=E)
    add(fn, f"memalloc.{fn}(fd)", "int path (an open descriptor)", "TypeError", "not int", env=E)

A = "load_trace"
add(
    A,
    "memalloc.load_trace(not_a_trace)",
    "not a trace file",
    "ValueError",
    "is not a memalloc trace file (bad magic)",
    env=E,
)
add(A, "memalloc.load_trace(empty_file)", "empty file", "ValueError", "is not a memalloc trace file", env=E)
add(
    A,
    'memalloc.load_trace("/nonexistent/run.trace")',
    "missing file",
    "FileNotFoundError",
    "No such file or directory",
    env=E,
)
add(A, "memalloc.load_trace(scratch)", "a folder, not a file", "IsADirectoryError", "Is a directory", env=E)
add(A, "memalloc.load_trace(None)", "None path", "TypeError", "expected str, bytes or os.PathLike object", env=E)
for name, what in (
    ("magic_only", "magic line only (truncated header)"),
    ("bad_json", "metadata that is not JSON"),
    ("no_devices", "metadata without 'devices'"),
    ("short_records", "fewer record bytes than the header says"),
    ("bad_action", "a record with action 255"),
    ("huge_header", "metadata length 2**62"),
):
    add(A, f"memalloc.load_trace({name})", what, "ValueError", "trace file", env=E)
add(A, "memalloc.load_trace(fd)", "int path (an open descriptor)", "TypeError", "not int", env=E)

A = "host.empty"
add(A, "host.empty(-1)", "negative size", "ValueError", "negative dimension -1", env=E)
add(A, "host.empty((2, -3))", "negative dimension", "ValueError", "negative dimension -3", env=E)
add(A, 'host.empty("10")', "str shape", "TypeError", "shape entries must be ints", env=E)
add(A, "host.empty(True)", "bool shape", "TypeError", "shape entries must be ints, got True", env=E)
add(A, "host.empty([2, 2.0])", "float dimension", "TypeError", "shape entries must be ints, got 2.0", env=E)
add(A, "host.empty(1.5)", "float shape", "TypeError", "shape", env=E)
add(A, "host.empty(None)", "None shape", "TypeError", "shape", env=E)
add(
    A, "host.empty(2**62, dtype=torch.uint8)", "huge size (2**62 bytes)", "OutOfMemoryError", "Tried to allocate", env=E
)
add(
    A,
    "host.empty(2**62)",
    "2**62 float32 elements (2**64 bytes)",
    "OutOfMemoryError",
    "Tried to allocate",
    alt=(("ValueError", "too large"),),
    env=E,
)
add(
    A,
    "host.empty((2**32, 2**32))",
    "2**64 elements",
    "OutOfMemoryError",
    "Tried to allocate",
    alt=(("ValueError", "too large"),),
    env=E,
)
add(A, "host.empty(10, device=99)", "device 99", "InvalidArgumentError", "device 99 does not exist", env=E)
add(A, "host.empty(10, device=-1)", "device -1", "InvalidArgumentError", "device -1 does not exist", env=E)
add(
    A,
    'host.empty(10, device="cuda:7")',
    'device "cuda:7"',
    "InvalidArgumentError",
    "device 7 does not exist",
    alt=(("TypeError", "device must be"),),
    env=E,
)
add(A, "host.empty(10, device=1.5)", "float device", "TypeError", "device must be", env=E)
add(A, "host.empty(10, stream=-1)", "negative stream", "ValueError", "stream -1", env=E)
add(A, 'host.empty(10, dtype="float")', "str dtype", "TypeError", "must be torch.dtype, not str", env=E)
add(A, "host.empty(10, dtype=None)", "None dtype", "TypeError", "dtype must be", env=E)
A = "host.zeros"
add(A, "host.zeros(-1)", "negative size", "ValueError", "negative dimension -1", env=E)
add(A, "host.zeros(10, device=99)", "device 99", "InvalidArgumentError", "device 99 does not exist", env=E)
add(
    A, "host.zeros(2**62, dtype=torch.uint8)", "huge size (2**62 bytes)", "OutOfMemoryError", "Tried to allocate", env=E
)

A = "enable (already enabled)"
add(
    A,
    'memalloc.enable(backend="host", config="host_devices:3")',
    "different config",
    "RuntimeError",
    "already enabled",
    env=E,
)
add(A, 'memalloc.enable(backend="cuda")', "different backend", "RuntimeError", "already enabled", env=E)
add(A, 'memalloc.enable(config="bogus:1")', "bad config", "InvalidArgumentError", "unknown key 'bogus'", env=E)

A = "entry point memalloc_free"
for call, what, fragment in (
    ("lib.memalloc_free(0xdead000, 0, 0, None)", "unknown pointer", "free ignored: free of 0xdead000"),
    ("lib.memalloc_free(FREED, 0, 0, None)", "double free", "double free"),
    ("lib.memalloc_free(LIVE + 512, 0, 0, None)", "interior pointer", "no live allocation starts there"),
    ("lib.memalloc_free(LIVE, 0, 1, None)", "pointer of another device", "not allocated by memalloc on this device"),
    ("lib.memalloc_free(LIVE, 0, 99, None)", "device 99", "free ignored: device 99 does not exist"),
    ("lib.memalloc_free(LIVE, 0, -1, None)", "device -1", "free ignored: device -1 does not exist"),
):
    add(A, call, what, STDERR, fragment, env=E)


# =============================================================================
# Running cases
# =============================================================================
def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return {prefix: obj}


@contextlib.contextmanager
def _captured_stderr():
    """Captures file descriptor 2 (C++ fprintf and Python alike)."""
    sys.stderr.flush()
    tmp = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(tmp.fileno(), 2)
    box = {"text": ""}
    try:
        yield box
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        box["text"] = tmp.read().decode(errors="replace")
        tmp.close()


def _open_fd(ns: dict) -> None:
    path = os.path.join(ns["scratch"], "fd-target")
    ns["fd"] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    ns["_fd_ino"] = os.fstat(ns["fd"]).st_ino


def _fd_is_ours(ns: dict) -> bool | None:
    if "_fd_ino" not in ns:
        return None
    try:
        return os.fstat(ns["fd"]).st_ino == ns["_fd_ino"]
    except OSError:
        return False


def _close_fd(ns: dict) -> None:
    if _fd_is_ours(ns):
        os.close(ns["fd"])
    ns.pop("fd", None)
    ns.pop("_fd_ino", None)


def run_case(case: Case, ns: dict, state: Callable[[dict], Any]) -> dict:
    """Runs one case in namespace ``ns``; returns its outcome (JSON-able)."""
    uses_fd = re.search(r"\bfd\b", case.call) is not None
    if uses_fd:
        _open_fd(ns)
    before = state(ns)
    raised: dict | None = None
    with _captured_stderr() as err:
        if case.conf is not None:
            os.environ["MEMALLOC_CONF"] = case.conf
        try:
            if case.call.startswith("python -m memalloc"):
                from memalloc.__main__ import main

                main(shlex.split(case.call)[3:])
            else:
                exec(compile(case.call, "<bad-input case>", "exec"), ns)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit is an answer too
            raised = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)}
        finally:
            os.environ.pop("MEMALLOC_CONF", None)
    after = state(ns)
    if after != before:  # a traceback may have kept a tensor alive a moment longer
        import gc

        gc.collect()
        after = state(ns)
    if uses_fd:
        _close_fd(ns)
    return {"id": case.id, "raised": raised, "stderr": err["text"], "before": before, "after": after}


# ---- namespaces and state, per environment -----------------------------------
def _scratch_files(ns: dict) -> list:
    d = ns["scratch"]
    return sorted([n, os.path.getsize(os.path.join(d, n))] for n in os.listdir(d))


def _inproc_namespace() -> dict:
    import torch

    import memalloc
    from memalloc import host

    a = memalloc.Allocator("host", HOST_CONFIG)
    p = a.malloc(1000)
    q = a.malloc(3 * MiB)
    f = a.malloc(2000)
    a.free(f)
    return {"memalloc": memalloc, "torch": torch, "host": host, "a": a, "p": p, "q": q, "f": f}


def _allocator_state(ns: dict) -> dict:
    from memalloc._C import _testing

    a = ns["a"]
    devices = range(a.device_count)

    def valid(d: int) -> str:
        try:
            a.validate(d)
            return "ok"
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"

    return {
        "stats": [a.stats(d) for d in devices],
        "memory_fraction": [a.memory_fraction(d) for d in devices],
        "gc_threshold": [a.gc_threshold(d) for d in devices],
        "trace": [[len(a.trace(d)[0]), a.trace(d)[1]] for d in devices],
        "faults_injected": [list(_testing.faults_injected(a, d)) for d in devices],
        "live_segments": [_testing.live_segments(a, d) for d in devices],
        "validate": [valid(d) for d in devices],
    }


def _trace_files(scratch: str) -> dict[str, str]:
    magic = b"MEMALLOC-TRACE-1\n"

    def with_meta(meta: Any, raw_meta: bytes | None = None) -> bytes:
        blob = raw_meta if raw_meta is not None else json.dumps(meta).encode()
        return magic + struct.pack("<Q", len(blob)) + blob

    one_device = {"tags": [], "stacks": {}, "devices": [{"records": 1, "dropped": 0}]}
    contents = {
        "not_a_trace": b"hello, world\n",
        "empty_file": b"",
        "magic_only": magic,
        "bad_json": with_meta(None, b"{not json"),
        "no_devices": with_meta({"tags": [], "stacks": {}}),
        "short_records": with_meta({"tags": [], "stacks": {}, "devices": [{"records": 2, "dropped": 0}]}) + bytes(70),
        "bad_action": with_meta(one_device) + b"\xff" * 64,
        "huge_header": magic + struct.pack("<Q", 2**62),
    }
    paths = {}
    for name, data in contents.items():
        path = os.path.join(scratch, name + ".trace")
        with open(path, "wb") as fh:
            fh.write(data)
        paths[name] = path
    return paths


def _child_namespace(env: str, scratch: str) -> dict:
    import torch

    import memalloc
    from memalloc import _C, host

    ns = {"memalloc": memalloc, "torch": torch, "host": host, "_C": _C, "scratch": scratch}
    if env == "enabled":
        import ctypes

        memalloc.enable(backend="host", config=HOST_CONFIG)
        ns["a"] = memalloc.installed_allocator()
        ns["t"] = host.empty(1000)
        lib = ctypes.CDLL(_C.__file__)
        lib.memalloc_alloc.restype = ctypes.c_void_p
        lib.memalloc_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.memalloc_free.restype = None
        lib.memalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        ns["lib"] = lib
        ns["LIVE"] = lib.memalloc_alloc(4096, 0, None)
        freed = lib.memalloc_alloc(3 * MiB, 0, None)
        lib.memalloc_free(freed, 3 * MiB, 0, None)
        ns["FREED"] = freed
        ns.update(_trace_files(scratch))
    return ns


def _child_state(ns: dict) -> dict:
    import memalloc
    from memalloc import _C
    from memalloc.core import _policy, _state

    s: dict[str, Any] = {
        "enabled": [memalloc.is_enabled(), memalloc.enabled_backend(), _state.installed_config()],
        "installed": _C.installed() is not None,
        "torch_patched": memalloc.install._torch_patch.is_patched(),
        "stack_mode": _C.stack_mode(),
        "files": _scratch_files(ns),
        "fd_open": _fd_is_ours(ns),
    }
    if "a" in ns:
        a = ns["a"]
        devices = range(a.device_count)
        s.update(
            {
                "memory_allocated": [memalloc.memory.memory_allocated(d) for d in devices],
                "memory_reserved": [memalloc.memory.memory_reserved(d) for d in devices],
                "stats": [memalloc.memory.memory_stats_raw(d) for d in devices],
                "memory_fraction": [a.memory_fraction(d) for d in devices],
                "gc_threshold": [a.gc_threshold(d) for d in devices],
                "every_n_steps": _policy._every(),
                "trace": [[len(a.trace(d)[0]), a.trace(d)[1]] for d in devices],
            }
        )
    return s


def process_of(env: str) -> str:
    """The interpreter that runs the cases of ``env``."""
    return "disabled" if env in ("before", "conf", "cli") else env


def child_main(process: str) -> int:
    """Runs every case of ``process`` in this interpreter; one ``CASE <json>`` line each."""
    scratch = tempfile.mkdtemp(prefix="memalloc-bad-input-")
    try:
        ns = _child_namespace(process, scratch)
        for case in CASES:
            if process_of(case.env) == process:
                out = run_case(case, ns, _child_state)
                sys.stdout.write("CASE " + json.dumps(out) + "\n")
                sys.stdout.flush()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


# =============================================================================
# Judging an outcome
# =============================================================================
def problems(case: Case, out: dict | None) -> list[str]:
    """What is wrong with ``out`` for ``case``; [] when it is the answer wanted."""
    if out is None:
        return ["no outcome: the interpreter running this case died before reporting it (a crash?)"]
    found: list[str] = []
    raised, stderr = out["raised"], out["stderr"]
    if case.expect[0][0] == STDERR:
        if raised is not None:
            found.append(f"raised {raised['type']}: {raised['message']!r}; it must not raise")
        if case.expect[0][1] not in stderr:
            found.append(f"stderr {stderr!r} lacks {case.expect[0][1]!r}")
    elif raised is None:
        found.append("no exception was raised")
    else:
        text = raised["message"] + ("\n" + stderr if raised["type"] == "SystemExit" else "")
        if not any(t in raised["mro"] and frag in text for t, frag in case.expect):
            want = " or ".join(f"{t} containing {frag!r}" for t, frag in case.expect)
            found.append(f"got {raised['type']}: {raised['message'][:400]!r}; want {want}")
        if any(r in raised["message"] for r in RAW_PYBIND):
            found.append("the message is pybind11's raw argument-mismatch text")
    before, after = _flatten(out["before"]), _flatten(out["after"])
    changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if raised is not None and raised["type"] == "OutOfMemoryError":
        ooms = [k for k, (b, a) in changed.items() if k.endswith(".num_ooms") and isinstance(b, int) and a == b + 1]
        if len(ooms) == 1:
            del changed[ooms[0]]
        else:
            found.append("an out-of-memory error must add exactly one to one device's num_ooms")
    if changed:
        shown = dict(sorted(changed.items())[:8])
        found.append(f"state changed ({len(changed)} values): {shown}")
    return found


# =============================================================================
# The documentation table
# =============================================================================
TYPE_NAMES = {
    "InvalidArgumentError": "memalloc.errors.InvalidArgumentError",
    "InvalidPointerError": "memalloc.errors.InvalidPointerError",
    "DriverError": "memalloc.errors.DriverError",
    "OutOfMemoryError": "torch.OutOfMemoryError",
}

DOC_INTRO = (
    "This file is generated from the case list `CASES` in `tests/integration/test_bad_input.py` by "
    "`python tests/integration/test_bad_input.py --write-doc`, and `test_doc_is_current` in that file fails when this "
    "file differs from what the data renders: change the cases, then regenerate. Every row is a test: the "
    "call is run exactly as written and must raise the error type shown (a subclass also counts, e.g. "
    "`memalloc.errors.InvalidArgumentError` for `ValueError`) with a message containing the excerpt, and "
    "afterwards the allocator's counters and settings, recording, scratch files and enabled state must be "
    "unchanged (an out-of-memory error may only add one to the device's `num_ooms`). Rows marked † are "
    "open bugs: they state the answer wanted, run as strict xfails, and the list at the end says what "
    "happens today."
)

DOC_NAMES = [
    '`inproc`: this process, no `enable()`; `a = memalloc.Allocator("host", "' + HOST_CONFIG + '")` '
    "(fresh per case) holding live blocks `p` (1000 B) and `q` (3 MiB) on device 0; `f` is a freed pointer "
    "inside `p`'s segment.",
    "`before`: a fresh interpreter in which memalloc is not enabled; `scratch` is an empty folder.",
    "`conf`: a fresh interpreter, `MEMALLOC_CONF` set as shown for the call; memalloc must stay disabled.",
    "`cli`: the command line, run through `memalloc.__main__.main` in a fresh interpreter.",
    '`enabled`: a fresh interpreter after `memalloc.enable(backend="host", config="' + HOST_CONFIG + '")`; '
    "`a = memalloc.installed_allocator()`; `t` is a live `host.empty(1000)`; "
    "`lib = ctypes.CDLL(memalloc._C.__file__)` (the entry points torch calls); `LIVE` is a live "
    "`lib.memalloc_alloc(4096, 0, None)`, `FREED` a 3 MiB one already given to `lib.memalloc_free`; "
    "`fd` is a descriptor opened on a scratch file; `not_a_trace`, `empty_file`, `magic_only`, `bad_json`, "
    "`no_devices`, `short_records`, `bad_action`, `huge_header` are corrupt trace files.",
    "`fresh:*`: a fresh interpreter for that one case (it may enable memalloc).",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return "`" + _cell(text) + "`" if text else ""


def _type_name(t: str) -> str:
    if t == STDERR:
        return "none raised; stderr"
    return _code(TYPE_NAMES.get(t, t))


def render_doc() -> str:
    bugs = [c for c in CASES if c.bug]
    lines = [
        "# Bad input: what each memalloc call answers",
        "",
        DOC_INTRO,
        "",
        f"{len(CASES)} cases, {len(bugs)} of them open bugs (†). Where a case runs and the names its call uses:",
        "",
        *[f"- {n}" for n in DOC_NAMES],
        "",
        "| area | call | input | error type | message excerpt |",
        "|---|---|---|---|---|",
    ]
    for c in CASES:
        call = _code(c.call)
        if c.conf is not None:
            call = f"`MEMALLOC_CONF={_cell(c.conf)}` {call}"
        if c.env != "inproc":
            call += f" ({c.env})"
        error = " or ".join(_type_name(t) for t, _ in c.expect) + (" †" if c.bug else "")
        fragment = " / ".join(_code(f) for _, f in c.expect if f)
        lines.append(f"| {_cell(c.area)} | {call} | {_cell(c.input)} | {error} | {fragment} |")
    lines += ["", "## Open bugs (†): what happens today", ""]
    for c in bugs:
        conf = f" with `MEMALLOC_CONF={c.conf}`" if c.conf is not None else ""
        lines.append(f"- {_code(c.call)}{conf} ({c.input}): {c.bug}.")
    if not bugs:
        lines.append("None: every case gets the answer it wants.")
    return "\n".join(lines) + "\n"


# =============================================================================
# pytest
# =============================================================================
try:
    import pytest
except ImportError:  # the child interpreters and --write-doc do not need it
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def _param(case: Case):
        marks = [pytest.mark.xfail(strict=True, reason=f"BUG: {case.bug}")] if case.bug else []
        return pytest.param(case, id=case.id, marks=marks)

    @pytest.fixture(scope="module")
    def child_outcomes(fresh_python) -> dict[str, dict]:
        """Runs every non-inproc environment in its own interpreter (tests/conftest.py), in parallel."""
        envs = sorted({process_of(c.env) for c in CASES if c.env != "inproc"})
        procs = {e: fresh_python.start([__file__, "--run-env", e]) for e in envs}
        outcomes: dict[str, dict] = {}
        failures: dict[str, str] = {}
        for e, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            for line in stdout.splitlines():
                if line.startswith("CASE "):
                    out = json.loads(line[len("CASE ") :])
                    outcomes[out["id"]] = out
            if p.returncode != 0:
                failures[e] = f"rc={p.returncode}\n{stderr[-3000:]}"
        outcomes["__failures__"] = failures  # type: ignore[assignment]
        return outcomes

    @pytest.mark.parametrize("case", [_param(c) for c in CASES])
    def test_bad_input(case: Case, request) -> None:
        if case.env == "inproc":
            out = run_case(case, _inproc_namespace(), _allocator_state)
        else:
            outcomes = request.getfixturevalue("child_outcomes")
            out = outcomes.get(case.id)
            process = process_of(case.env)
            if out is None and process in outcomes["__failures__"]:
                pytest.fail(f"the {process} interpreter failed: {outcomes['__failures__'][process]}")
        found = problems(case, out)
        assert not found, f"{case.call} ({case.input}):\n  " + "\n  ".join(found)

    def test_case_ids_are_unique() -> None:
        ids = [c.id for c in CASES]
        assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})

    def test_every_public_function_has_a_case() -> None:
        import memalloc

        calls = "\n".join(c.call for c in CASES)
        # Names that take no input a caller could get wrong, types and modules.
        no_input = {
            "Allocator",
            "MemallocError",
            "config_keys",
            "enabled_backend",
            "errors",
            "host",
            "memory",
            "is_enabled",
            "patch_torch",
            "unpatch_torch",
        }
        public = [f"memalloc.{n}" for n in memalloc.__all__ if n not in no_input]
        public += [f"memalloc.memory.{n}" for n in memalloc.memory.__all__]
        missing = [n for n in public if f"{n}(" not in calls]
        assert not missing, f"public functions without a bad-input case: {missing}"
        methods = [
            m for m in dir(memalloc.Allocator) if not m.startswith("_") and callable(getattr(memalloc.Allocator, m))
        ]
        missing = [m for m in methods if f"a.{m}(" not in calls]
        assert not missing, f"Allocator methods without a bad-input case: {missing}"
        hooks = [
            f for f in dir(memalloc._C._testing) if not f.startswith("_") and callable(getattr(memalloc._C._testing, f))
        ]
        missing = [f for f in hooks if f"memalloc._C._testing.{f}(" not in calls]
        assert not missing, f"memalloc._C._testing hooks without a bad-input case: {missing}"
        for fn in (
            "host.empty(",
            "host.zeros(",
            "memalloc.Allocator(",
            "memalloc._C.parse_config(",
            "lib.memalloc_free(",
            "python -m memalloc info",
            "python -m memalloc run",
            "python -m memalloc demo",
        ):
            assert fn in calls, fn

    def test_doc_is_current() -> None:
        assert DOC.exists(), f"{DOC} is missing: run python tests/integration/test_bad_input.py --write-doc"
        assert DOC.read_text() == render_doc(), (
            f"{DOC.relative_to(REPO)} differs from the cases: "
            "run python tests/integration/test_bad_input.py --write-doc"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-env"] and len(sys.argv) == 3:
        sys.exit(child_main(sys.argv[2]))
    if sys.argv[1:] == ["--write-doc"]:
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(render_doc())
        print(f"wrote {DOC} ({len(CASES)} cases)")
        sys.exit(0)
    sys.exit("usage: python tests/integration/test_bad_input.py --write-doc | --run-env PROCESS")
