"""Trace replay: allocator events replayed on a fresh host-backend allocator
under a given config, so that fragmentation (peak reserved / peak allocated)
is a number the CPU computes.

Two kinds of workload:

- a trace file written by :func:`memalloc.save_trace` (or a
  :class:`~memalloc.trace.trace_files.Trace` read by :func:`memalloc.load_trace`):
  :func:`replay_trace` replays its allocation-level events per device, on
  the same device and stream ids: ``alloc`` → ``malloc`` of the size that
  was requested; ``free_requested`` → ``free`` of the pointer the replay got
  for that original address; ``empty_cache`` → ``empty_cache``. A free the
  original allocator completed later (a block used on another stream through
  ``record_stream``) is replayed as such: the block is recorded on a private
  stream before the free, and that stream is synchronised at the trace's
  ``free_completed``. Every other event (segments, retries, OOMs,
  synchronisations) is what the policy did, so the replay's own policy
  redoes it.
- synthetic ops (:func:`replay_ops`): ``("alloc", size)`` (the k-th
  ``alloc`` op makes key k), ``("free", key)``, ``("empty_cache",)``, on
  device 0, stream 0. :func:`random_workload` yields the GPU benchmark's
  random workload this way, so it needs no file.

Every replay builds a new ``memalloc._C.Allocator("host", config)``: the
config text is the caller's alone (``MEMALLOC_CONF`` is not read), and the
host capacity defaults to an upper bound of what any replay of the workload
can reserve (:func:`capacity_bound`), so it never limits a replay unless
``host_capacity_mb`` asks it to. Sizes are in bytes throughout.

Repeatable to the byte: among free blocks of equal size best fit takes the
lowest address, and the host backend hands out addresses deterministically
(first fit in one reserved range per device, csrc/backend/backend_host.cpp), so the
ties fall the same way in every run and process.

Not replayed: private pools (CUDA graphs, ``MemPool``): their allocations
go to the default pool. Events the trace's ring dropped are lost: frees of
blocks allocated before the trace's first event are refused unless
``skip_unknown_frees=True``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Union

import torch

from memalloc import _C
from memalloc.core._checks import check_int
from memalloc.trace.recording import Event
from memalloc.trace.trace_files import Trace, load_trace

PathLike = Union[str, "os.PathLike[str]"]
Op = tuple  # ("alloc", size) | ("free", key) | ("empty_cache",)

MiB = 1 << 20
RANDOM_SOURCE = "random:"  # replay_source("random:N"): random_workload(N)
RANDOM_CAP = 512 * MiB  # the random workload's largest allocation (bytes)
_MAX_CAPACITY_MB = 1 << 40  # the largest host_capacity_mb the config accepts
_REPLAY_KEYS = ("backend", "host_devices")  # the replay sets these itself

# The replay's own ops: (code, key, size in bytes, stream, index of the op or
# trace event it comes from).
_ALLOC, _FREE, _FREE_LATER, _COMPLETE, _EMPTY_CACHE = range(5)
_Code = tuple[int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class DeviceReplay:
    """What one simulated device did during a replay (bytes; counts):
    the peaks, the allocations made (those that ran out of memory are
    ``ooms``), what was reserved and allocated when the workload ended, and
    the frees skipped by ``skip_unknown_frees``.

    ``recorded_peak_*`` are the peaks the trace's own events give (the
    running sums of ``alloc`` − ``free_requested`` block sizes and of
    ``segment_alloc`` − ``segment_free`` sizes from the trace's first
    event): the original allocator's peaks when recording started on an
    empty allocator. None for synthetic ops, and for a trace that does not
    start empty (dropped events, frees of blocks older than the trace)."""

    device: int
    peak_allocated: int
    peak_reserved: int
    allocations: int
    ooms: int
    final_reserved: int
    final_allocated: int
    unknown_frees: int = 0
    recorded_peak_allocated: int | None = None
    recorded_peak_reserved: int | None = None

    @property
    def ratio(self) -> float | None:
        """peak_reserved / peak_allocated; None when nothing was allocated."""
        return self.peak_reserved / self.peak_allocated if self.peak_allocated else None

    def to_dict(self) -> dict:
        """The fields and ``ratio``, as JSON takes them."""
        return {**dataclasses.asdict(self), "ratio": self.ratio}


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One workload replayed under one config.

    ``source``: the trace's path or name, ``random:N`` or the name given to
    :func:`replay_ops`; ``config``: the config text as given (``""``: the
    default policy); ``capacity``: bytes of each simulated device."""

    source: str
    config: str
    capacity: int
    devices: tuple[DeviceReplay, ...]

    def to_dict(self) -> dict:
        """The result as JSON takes it (``devices``: a list of dicts)."""
        return {
            "source": self.source,
            "config": self.config,
            "capacity": self.capacity,
            "devices": [d.to_dict() for d in self.devices],
        }


@dataclasses.dataclass(frozen=True)
class StepReplay:
    """One step of one device of a trace replayed step by step
    (:func:`replay_steps`; bytes, counts): the runs of pages mapped and
    unmapped in the step (torch's ``num_device_alloc`` / ``num_device_free``:
    expandable segments' mappings, plain segments' cudaMalloc/cudaFree), the
    peaks so far and the bytes reserved at its end. ``recorded_maps`` /
    ``recorded_unmaps``: the ``segment_map`` / ``segment_unmap`` events the
    recording run itself made in that step (a trace recorded under
    expandable segments: what the live run did, beside what the replay
    does)."""

    step: int
    maps: int
    unmaps: int
    peak_allocated: int
    peak_reserved: int
    reserved: int
    recorded_maps: int = 0
    recorded_unmaps: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- workloads ----------------------------------------------------------------
def random_workload(n_allocs: int = 50_000, live: int = 64, seed: int = 7) -> Iterator[Op]:
    """The GPU benchmark's random workload (benchmarks/speed/worker.py,
    ``random_plan`` and ``run_random``) as ops for :func:`replay_ops`.

    ``n_allocs`` allocations of e^N(11, 3) bytes (at least 1 B, at most
    :data:`RANDOM_CAP`, 512 MiB) fill ``live`` slots; before each one, the
    allocation held by a random slot (if any) is freed. Drawn as the
    benchmark draws them from ``random.Random(seed)`` (every size first,
    then every slot), so the ops are the same on every machine.
    """
    check_int("n_allocs", n_allocs, 0)
    check_int("live", live, 1)
    return _random_ops(n_allocs, live, seed)


def _random_ops(n_allocs: int, live: int, seed: int) -> Iterator[Op]:
    """random_workload's ops, arguments checked."""
    rng = random.Random(seed)
    sizes = [max(1, min(RANDOM_CAP, int(math.exp(rng.gauss(11, 3))))) for _ in range(n_allocs)]
    slots: list[int | None] = [None] * live
    for key, size in enumerate(sizes):
        slot = rng.randrange(live)
        if slots[slot] is not None:
            yield ("free", slots[slot])
        slots[slot] = key
        yield ("alloc", size)


def _ops_of(ops: Iterable[Op]) -> list[_Code]:
    """Synthetic ops as the replay's op codes; ValueError names a malformed op."""
    out: list[_Code] = []
    n_allocs = 0
    for index, op in enumerate(ops):
        is_op = isinstance(op, (tuple, list))
        name = op[0] if is_op and op else None
        arg = op[1] if is_op and len(op) == 2 else None
        if name == "empty_cache" and len(op) == 1:
            out.append((_EMPTY_CACHE, 0, 0, 0, index))
        elif name in ("alloc", "free") and isinstance(arg, int) and not isinstance(arg, bool) and arg >= 0:
            out.append((_ALLOC, n_allocs, arg, 0, index) if name == "alloc" else (_FREE, arg, 0, 0, index))
            n_allocs += name == "alloc"
        else:
            raise ValueError(
                f"op {index} is {op!r}: ops are ('alloc', size), ('free', key) and "
                "('empty_cache',), with sizes and keys ints >= 0 (the k-th alloc makes key k)"
            )
    return out


def _trace_ops(events: Sequence[Event]) -> list[_Code]:
    """The allocation-level events of one device as the replay's op codes:
    keys are the original addresses; a free whose ``free_completed`` does
    not follow at once becomes _FREE_LATER + _COMPLETE."""
    out: list[_Code] = []
    last = len(events) - 1
    for i, e in enumerate(events):
        if e.action == "alloc":
            out.append((_ALLOC, e.addr, e.requested, e.stream, i))
        elif e.action == "free_requested":
            at_once = i < last and events[i + 1].action == "free_completed" and events[i + 1].addr == e.addr
            out.append((_FREE if at_once else _FREE_LATER, e.addr, 0, 0, i))
        elif e.action == "free_completed":
            if not (i > 0 and events[i - 1].action == "free_requested" and events[i - 1].addr == e.addr):
                out.append((_COMPLETE, e.addr, 0, 0, i))
        elif e.action == "empty_cache":
            out.append((_EMPTY_CACHE, 0, 0, 0, i))
    return out


def _recorded_peaks(events: Sequence[Event]) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) of the trace's own events, from its
    first event; (None, None) when a free or segment_free names an address
    the trace never allocated (it did not start on an empty allocator).
    Reserved bytes: segments allocated minus freed, plus pages mapped minus
    unmapped (expandable segments)."""
    live: dict[str, dict[int, int]] = {"block": {}, "segment": {}}
    current = {"block": 0, "segment": 0}
    peak = {"block": 0, "segment": 0}
    for e in events:
        kind = "segment" if e.action.startswith("segment_") else "block"
        if e.action in ("alloc", "segment_alloc", "segment_map"):
            if e.action != "segment_map":
                live[kind][e.addr] = e.size
            current[kind] += e.size
            peak[kind] = max(peak[kind], current[kind])
        elif e.action == "segment_unmap":
            current[kind] -= e.size
        elif e.action in ("free_requested", "segment_free"):
            size = live[kind].pop(e.addr, None)
            if size is None:
                return None, None
            current[kind] -= size
    return peak["block"], peak["segment"]


def capacity_bound(sizes: Iterable[int]) -> int:
    """An upper bound, in bytes, of what a caching allocator can reserve
    for allocations of ``sizes`` bytes: each allocation makes at most one
    segment, of at most max(20 MiB, 2 × size + 2 MiB) (a rounding config
    at most doubles a request; a large segment rounds up to 2 MiB). Rounded
    up to MiB; at least 1 MiB, at most the largest capacity the config
    accepts."""
    total = sum(max(20 * MiB, 2 * size + 2 * MiB) for size in sizes)
    return min(max(1, -(-total // MiB)), _MAX_CAPACITY_MB) * MiB


# ---- replay ---------------------------------------------------------------------
class _Replayer:
    """One device of a host allocator driven by the replay's ops."""

    def __init__(self, allocator: _C.Allocator, device: int, streams_in_use: set[int], source: str, synthetic: bool):
        self.a, self.device, self.source, self.synthetic = allocator, device, source, synthetic
        self.ptrs: dict[int, int | None] = {}  # live key -> replay pointer (None: its malloc ran out of memory)
        self.pending: dict[int, int] = {}  # key of a free not completed yet -> its private stream
        self.spare: list[int] = []  # private streams with nothing pending
        self.private = (s for s in itertools.count((1 << 64) - 1, -1) if s not in streams_in_use)
        self.skipped: set[int] = set()  # keys of skipped frees whose completion is still to come
        self.unknown_frees = 0

    def run(self, ops: Sequence[_Code], skip_unknown_frees: bool) -> None:
        a, device = self.a, self.device
        for code, key, size, stream, where in ops:
            if code == _ALLOC:
                if key in self.ptrs or key in self.pending:
                    raise ValueError(
                        f"{self.source}: device {device}, event {where}: allocation at {key:#x}, "
                        "which is still allocated (the trace is corrupt)"
                    )
                try:
                    self.ptrs[key] = a.malloc(size, device, stream)
                except torch.OutOfMemoryError:
                    self.ptrs[key] = None  # the allocator counts it (num_ooms)
            elif code == _EMPTY_CACHE:
                a.empty_cache(device)
            elif key in (self.pending if code == _COMPLETE else self.ptrs):
                self._free(code, key)
            elif code == _COMPLETE and key in self.skipped:
                self.skipped.discard(key)  # the completion of a free already counted
            elif not skip_unknown_frees:
                raise ValueError(self._unknown_free(key, where))
            else:
                self.unknown_frees += 1
                if code == _FREE_LATER:
                    self.skipped.add(key)

    def _unknown_free(self, key: int, where: int) -> str:
        if self.synthetic:
            return (
                f"{self.source}: op {where} frees key {key}, which no earlier alloc op made, or which was freed already"
            )
        return (
            f"{self.source}: device {self.device}, event {where} frees {key:#x}, which no earlier alloc of the "
            "trace returned (or which was freed already): the trace began after that allocation (recording "
            "started late, or its ring dropped events); skip_unknown_frees=True (--skip-unknown-frees on the "
            "command line) skips such frees and counts them"
        )

    def _free(self, code: int, key: int) -> None:
        if code == _COMPLETE:
            stream = self.pending.pop(key)
            self.a.host_synchronize_stream(stream, self.device)
            self.spare.append(stream)
            return
        ptr = self.ptrs.pop(key)
        if code == _FREE_LATER:
            stream = self.spare.pop() if self.spare else next(self.private)
            self.pending[key] = stream
            if ptr is not None:
                self.a.record_stream(ptr, stream, self.device)
        if ptr is not None:
            self.a.free(ptr, self.device)

    def result(self, recorded: tuple[int | None, int | None]) -> DeviceReplay:
        s = self.a.stats(self.device)
        return DeviceReplay(
            self.device,
            s["allocated_bytes"]["all"]["peak"],
            s["reserved_bytes"]["all"]["peak"],
            s["allocation"]["all"]["allocated"],
            s["num_ooms"],
            s["reserved_bytes"]["all"]["current"],
            s["allocated_bytes"]["all"]["current"],
            self.unknown_frees,
            *recorded,
        )


def _allocator(config: str, host_capacity_mb: int | None, bound: int, devices: int) -> tuple[_C.Allocator, int]:
    """A fresh host allocator for a replay and its capacity in bytes."""
    if not isinstance(config, str):
        raise TypeError(f"config must be 'key:value,...' text, not {type(config).__name__}")
    _C.parse_config(config)  # InvalidArgumentError naming a bad key or value
    keys = {item.partition(":")[0].strip() for item in config.split(",") if item.strip()}
    refused = [k for k in _REPLAY_KEYS if k in keys]
    if refused:
        raise ValueError(
            f"config {config!r} sets {', '.join(refused)}: the replay sets "
            "those itself (the host backend, one device per device of the trace)"
        )
    if host_capacity_mb is not None and "host_capacity_mb" in keys:
        raise ValueError(f"the capacity is given twice: host_capacity_mb={host_capacity_mb} and config {config!r}")
    if host_capacity_mb is not None:
        check_int("host_capacity_mb", host_capacity_mb, 1, _MAX_CAPACITY_MB)
    parts = [config] if config.strip() else []
    parts.append(f"host_devices:{devices}")
    if "host_capacity_mb" not in keys:
        parts.append(f"host_capacity_mb:{host_capacity_mb or bound // MiB}")
    a = _C.Allocator("host", ",".join(parts))
    return a, a.mem_get_info(0)[1]


def _replayers(
    device_ops: Sequence[Sequence[_Code]], config: str, host_capacity_mb: int | None, source: str, synthetic: bool
) -> tuple[_C.Allocator, int, list[_Replayer]]:
    """A fresh host allocator sized for each device's op codes, its capacity
    (bytes) and a replayer per device (for _replay, and for replay_steps,
    which runs the ops a step at a time)."""
    bound = max(capacity_bound(op[2] for op in ops if op[0] == _ALLOC) for ops in device_ops)
    a, capacity = _allocator(config, host_capacity_mb, bound, len(device_ops))
    streams = {op[3] for ops in device_ops for op in ops if op[0] == _ALLOC}
    return a, capacity, [_Replayer(a, device, streams, source, synthetic) for device in range(len(device_ops))]


def _replay(
    device_ops: Sequence[Sequence[_Code]],
    config: str,
    host_capacity_mb: int | None,
    source: str,
    skip_unknown_frees: bool,
    recorded: Sequence[tuple[int | None, int | None]] | None,
) -> ReplayResult:
    """Replays each device's op codes (recorded: each device's recorded
    peaks; None for synthetic ops)."""
    _, capacity, replayers = _replayers(device_ops, config, host_capacity_mb, source, synthetic=recorded is None)
    devices = []
    for device, (ops, replayer) in enumerate(zip(device_ops, replayers)):
        replayer.run(ops, skip_unknown_frees)
        devices.append(replayer.result(recorded[device] if recorded else (None, None)))
    return ReplayResult(source, config, capacity, tuple(devices))


def replay_ops(
    ops: Iterable[Op], config: str = "", *, host_capacity_mb: int | None = None, name: str = "ops"
) -> ReplayResult:
    """Replays synthetic ops (``("alloc", size)`` in bytes, ``("free", key)``
    where the k-th alloc made key k, ``("empty_cache",)``) on device 0,
    stream 0 of a fresh host allocator built with ``config`` (e.g. ``""``
    for the default policy, ``"max_split_size_mb:64"``).

    ``host_capacity_mb`` (MiB) limits the simulated device; by default it
    is :func:`capacity_bound` of the sizes, so only a limit that is asked for
    makes OOMs. A ``host_capacity_mb`` key in ``config`` does the same.
    ``name`` labels the result. Raises ValueError for a malformed op, a
    free of a key no earlier alloc made (or freed twice), or a config that
    sets ``backend`` or ``host_devices``; InvalidArgumentError for a bad
    config text; TypeError for a config that is not a str."""
    return _replay([_ops_of(ops)], config, host_capacity_mb, name, False, None)


def replay_trace(
    trace: Trace | PathLike,
    config: str = "",
    *,
    host_capacity_mb: int | None = None,
    skip_unknown_frees: bool = False,
    name: str | None = None,
) -> ReplayResult:
    """Replays a trace (a path of a file written by :func:`memalloc.save_trace`,
    or a :class:`~memalloc.trace.trace_files.Trace`) on a fresh host allocator
    built with ``config``, one simulated device per device of the trace,
    keeping the original stream ids (module docstring: what is replayed).

    ``host_capacity_mb`` as in :func:`replay_ops`. A free of an address no
    earlier ``alloc`` of the trace returned raises ValueError naming the
    event, unless ``skip_unknown_frees`` (then each device's
    ``unknown_frees`` counts them). ``name`` labels the result (default:
    the path, or ``"trace"``). Raises as :func:`memalloc.load_trace` for an
    unreadable file."""
    if not isinstance(trace, Trace):
        name = name if name is not None else os.fspath(trace)
        trace = load_trace(trace)
    device_ops = [_trace_ops(events) for events in trace.events]
    recorded = [
        _recorded_peaks(events) if not dropped else (None, None) for events, dropped in zip(trace.events, trace.dropped)
    ]
    if not device_ops:
        raise ValueError(f"{name or 'trace'}: the trace has no device")
    return _replay(device_ops, config, host_capacity_mb, name or "trace", skip_unknown_frees, recorded)


def replay_steps(
    trace: Trace | PathLike | Sequence[Event],
    config: str = "",
    *,
    device: int = 0,
    host_capacity_mb: int | None = None,
    skip_unknown_frees: bool = False,
) -> list[StepReplay]:
    """One device of a trace (a path, a :class:`~memalloc.trace.trace_files.Trace`,
    or one device's events) replayed one step at a time (the events' step
    numbers, :func:`memalloc.step`), under ``config`` as in
    :func:`replay_trace`: a :class:`StepReplay` per step. Whether a loop
    keeps moving pages under expandable segments (a stream synchronisation
    and driver calls per step on a GPU) shows here. ``host_capacity_mb`` and
    ``skip_unknown_frees`` as in :func:`replay_trace`. Raises as
    :func:`replay_trace`, and ValueError for a device the trace lacks."""
    if isinstance(trace, Trace):
        if not 0 <= device < len(trace.events):
            raise ValueError(f"device {device}: the trace has {len(trace.events)} device(s)")
        events, source = trace.events[device], "trace"
    elif isinstance(trace, (str, os.PathLike)):
        return replay_steps(
            load_trace(trace),
            config,
            device=device,
            host_capacity_mb=host_capacity_mb,
            skip_unknown_frees=skip_unknown_frees,
        )
    else:
        events, source = list(trace), "events"
    ops = _trace_ops(events)
    if not ops:
        return []
    a, _capacity, (player,) = _replayers([ops], config, host_capacity_mb, source, synthetic=False)
    by_step: dict[int, list[_Code]] = {}
    for op in ops:
        by_step.setdefault(events[op[4]].step, []).append(op)
    recorded: dict[tuple[int, str], int] = {}
    for e in events:
        if e.action in ("segment_map", "segment_unmap"):
            recorded[e.step, e.action] = recorded.get((e.step, e.action), 0) + 1
    rows, before = [], (0, 0)
    for step in sorted(by_step):
        player.run(by_step[step], skip_unknown_frees)
        s = a.stats(0)
        now = (s["num_device_alloc"], s["num_device_free"])
        rows.append(
            StepReplay(
                step,
                now[0] - before[0],
                now[1] - before[1],
                s["allocated_bytes"]["all"]["peak"],
                s["reserved_bytes"]["all"]["peak"],
                s["reserved_bytes"]["all"]["current"],
                recorded.get((step, "segment_map"), 0),
                recorded.get((step, "segment_unmap"), 0),
            )
        )
        before = now
    return rows


def repeat_last_step(events: Sequence[Event], times: int) -> list[Event]:
    """One device's events with its last step run ``times`` more times: a
    longer run of a loop, from a short trace (for :func:`replay_steps`).
    Each copy is the last step's allocation-level events (alloc,
    free_requested, free_completed, empty_cache; its segment events are not
    copied, so a copy's recorded_maps/unmaps are 0) with fresh addresses
    (the replay's keys): where the last step freed a block of the step
    before, the copy frees the one the copy before allocated at the same
    point. ValueError when the trace is not such a loop: the last step frees
    a block of an earlier step, or allocates other sizes than the step
    before."""
    check_int("times", times, 0)
    if not events:
        raise ValueError("no events to repeat")
    last = max(e.step for e in events)
    if min(e.step for e in events) == last:
        raise ValueError(f"the trace has one step (step {last}): a loop needs two steps to repeat the last")
    owner: dict[int, tuple[int, int]] = {}  # live address -> (step, position of its alloc in the step)
    count: dict[int, int] = {}
    sizes: dict[int, list[int]] = {last - 1: [], last: []}
    real: dict[int, int] = {}  # position -> address of the last step's allocation
    body: list[tuple[Event, tuple[int, int]]] = []
    for e in events:
        at: tuple[int, int] | None
        if e.action == "alloc":
            at = (e.step, count.get(e.step, 0))
            count[e.step] = at[1] + 1
            owner[e.addr] = at
            if e.step in sizes:
                sizes[e.step].append(e.requested)
            if e.step == last:
                real[at[1]] = e.addr
        elif e.action in ("free_requested", "free_completed"):
            at = owner.get(e.addr)
        else:
            at = (last, -1)  # empty_cache and segment events: no block
        if e.step == last and e.action in ("alloc", "free_requested", "free_completed", "empty_cache"):
            if at is None or at[0] < last - 1:
                what = "no event of the trace allocated" if at is None else f"step {at[0]} allocated"
                raise ValueError(
                    f"the last step (step {last}) frees {e.addr:#x}, which {what}: only a loop "
                    "whose step frees what it or the step before allocated repeats"
                )
            body.append((e, at))
        if e.action == "free_completed":
            owner.pop(e.addr, None)
    if sizes[last - 1] != sizes[last]:
        raise ValueError(
            f"steps {last - 1} and {last} allocate other sizes ({len(sizes[last - 1])} and "
            f"{len(sizes[last])} allocations): not one loop's steps"
        )
    base = 1 << 60  # above any device address: the copies' keys clash with no real one

    def addr(copy: int, step: int, position: int) -> int:
        if step == last - 1:  # the block of the copy before (the real last step for the first copy)
            copy -= 1
        return real[position] if copy == 0 else base + ((copy * (len(real) + 1) + position) << 9)

    out = list(events)
    for k in range(1, times + 1):
        for e, (step, position) in body:
            out.append(dataclasses.replace(e, step=last + k, addr=e.addr if position < 0 else addr(k, step, position)))
    return out


def replay_source(source: str, config: str = "", **options) -> ReplayResult:
    """``random:N``: :func:`random_workload` (N allocations, the benchmark's
    64 slots and seed 7) through :func:`replay_ops`; anything else: a trace
    path through :func:`replay_trace`. ``options`` go to that function."""
    if source.startswith(RANDOM_SOURCE):
        n = source[len(RANDOM_SOURCE) :]
        if not n.isdigit():
            raise ValueError(f"{source!r}: write random:N with N the number of allocations, e.g. random:50000")
        return replay_ops(random_workload(int(n)), config, name=source, **options)
    return replay_trace(source, config, **options)


def __getattr__(name: str) -> object:
    if name == "smallest_capacity_mb":  # moved to the batch planner: one search answers "what fits"
        raise AttributeError(
            "memalloc.replay.smallest_capacity_mb is now memalloc.features.planner.smallest_device_mb "
            "(the same arguments; python -m memalloc replay --smallest-device calls it)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DeviceReplay",
    "Op",
    "RANDOM_CAP",
    "RANDOM_SOURCE",
    "ReplayResult",
    "StepReplay",
    "capacity_bound",
    "random_workload",
    "repeat_last_step",
    "replay_ops",
    "replay_source",
    "replay_steps",
    "replay_trace",
]
