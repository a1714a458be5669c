"""The batch planner: the largest batch that fits a memory budget, predicted
from a few steps at small batch sizes instead of found by trial and error.

:func:`largest_batch` takes the function a user would hand to accelerate's
``find_executable_batch_size``: ``step(batch)`` runs one training step at
that batch size. For each probe batch (small, default 2, 4 and 8) it runs
``1 + steps`` steps with the allocator's event ring on and notes the blocks
live when recording began (parameters, and after the first probe the
optimizer state and whatever the model holds between steps). The first
probe's first step is usually the model's first, in which the optimizer
state, workspaces and caches come into being, as in a fresh run at the
planned batch. Every allocation is named by
where it came from: its Python call stack and tag, and its place among the
allocations of that call stack (the k-th from that line), so the same
allocation is found again in the next probe's recording. Its requested size
at the probes says how it grows: the same at every probe (parameters,
optimizer state, workspaces) or more with each (activations, temporaries),
extrapolated linearly in the batch from the two largest probes in which
it appears, and never below its size there.

A candidate batch is judged by replaying the smallest probe's allocation
pattern (its recording starts where the model's training does), every size
scaled to that batch, on the host backend under the allocator's own policy
(a fresh host allocator, as memalloc/features/replay.py replays) with a
simulated device of the budget's size: the blocks live at the start where
they are (each segment's blocks in address order, the holes between them,
which the model's construction left, made and freed again:
ProbeRecord.layout), then the recorded steps in their order, then the
recorded steps after the first again and again, in turn, as a training run
goes on (the probe notes where its steps end, ProbeRecord.step_allocs; for
a step that runs the same shapes every time this is its last step over and
over, for one whose shapes change it is their cycle) until the replay is
steady: a training run's fragmentation builds up over its steps (a batch
that runs the probes' three steps can run out of memory in its sixth, or
its thirty-first), so the replay goes on until, at the end of a turn, the
allocator is in a state it was in at the end of an earlier one (every
segment and block, and which allocation of which step, counted back, each
block in use holds). From there the same steps make the same states again:
no later step reserves more or runs out of memory (tests/planner_cases'
wide CNN on 100 MiB settles after 17 to 48 steps at batches 32 to 95: the
fixed 16 repeats before were not a proof). A replay that has not settled
after MAX_REPEATS (64) steps stops there and the plan says so
(BatchPlan.steady). A batch fits when no allocation of the replay runs out
of memory (the replay, like the allocator, frees its cache and retries
first), so fragmentation is in the prediction rather than a guessed margin.
The search doubles the batch from the largest probe while it fits, then
bisects (where fragmentation makes fitting non-monotonic in the batch, a
larger batch than the one found may run too).

What it assumes, and what breaks it:
- The step's allocations are the same in number and order at every batch
  size, only their sizes changing (a step whose loop runs once per sample
  breaks this; allocations found in one probe only keep their size).
- Variable shapes: the planner sees the shapes the step function runs.
  Either give it the worst case (the longest sequence) at every step, or
  the shapes the job runs, longest included, in the same order at every
  probe (``steps=len(shapes)``: the probe runs ``1 + steps`` steps, and
  the replay repeats the steps after the first in turn, so their mix's
  fragmentation is in the prediction). The worst case at every step is
  not the mix: benchmarks/fit/planner_corpus.py's workload of 8 lengths
  (64..256 tokens) planned 26 where 25 is the most that trains them three
  times, and 20 where it is 18, given the longest at every step; given its
  lengths, 25 and 18.
- The budget is memory the allocator may reserve (bytes; an int, or a size
  string such as ``"20GiB"``, as ``memalloc run --fit`` takes it): by
  default the device's free memory plus what the allocator holds now (its
  cache can be reused), under the memory fraction when one is set; never
  more than the device can give (its total memory, the host backend's
  capacity, under the memory fraction), which is refused. Memory outside the
  allocator (the CUDA context, other processes) is not in it.
- The policy is the allocator's (policy_config: expandable segments,
  max_split_size_mb, rounding, garbage collection), and the plan is for
  it: memalloc.enable() turns expandable segments on unless told
  otherwise, a ``memalloc.Allocator(backend, config)`` takes its config as
  given. The same model plans differently on the two (the wide CNN of
  tests/planner_cases on 100 MiB: 95 under enable(), 85 on
  ``Allocator("host", "host_capacity_mb:100")``), and each is the largest
  that trains on its allocator.
- Steady state: the first step at a new size, which creates the optimizer
  state after the backward pass has freed the activations, peaks lower than
  the steps after it for the usual optimizers.
- A step that leaks (keeps memory that no later step frees) never comes
  back to a state it was in: the replay runs MAX_REPEATS (64) steps after
  the recorded ones and the plan is the largest batch that runs that many
  (``plan.steady`` is False and ``print(plan)`` says for how many steps).
  A job that runs fewer steps could take a larger batch, one that runs
  more runs out of memory later: fix the leak (``memalloc run --leaks``
  names its line) rather than plan around it.
- Frees of a block still in use on another stream (``record_stream``) are
  taken as done at once.
- Tensors that only garbage cycles hold count as the memory they are (the
  planner does not run ``gc.collect()``, which takes a second in a large
  process): a ``gc.collect()`` before planning gives them back first.

A plan more than four times the largest probe takes one more probe, at half
the planned batch, and is made again with it (:func:`refinement`): sizes
are extrapolated from the two largest probes, and between small batches
they can grow otherwise than between large ones.

The probes' peaks also give the split of the question "where does the memory
go": ``fixed_bytes`` (the part of the peak that does not grow with the batch)
and ``per_sample_bytes`` (what each sample adds), and from them ``limit``,
the batch a perfect allocator would fit: (budget - fixed) / per sample. At
small batches a block is often a little larger than asked (the remainder of
a cached block too small to split off), so per sample comes out a little
high and the limit a little low: the planned batch can pass it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memalloc import _C
from memalloc.core import _hooks, _state
from memalloc.core._checks import check_int
from memalloc.core._device import DeviceLike, existing_device_index
from memalloc.core._format import fmt_bytes
from memalloc.features import replay
from memalloc.reporters.notebook import plan_html
from memalloc.reporters.plan import plan_text
from memalloc.trace import recording, tags
from memalloc.trace.sites import live_blocks

MiB = 1 << 20
# The units a budget's size string takes (memalloc.largest_batch, ``run --fit``):
# binary (k, KiB, M, MiB, G, GiB, T, TiB) and decimal (kB, MB, GB, TB), any case.
UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
BUDGET_FORMS = "bytes (an int), a number with a unit (7GiB, 7.5G, 512MiB, 500MB) or 'free'"
DEFAULT_PROBES = (2, 4, 8)
MAX_REPEATS = 64  # the most steps a replay runs after the recorded ones, looking for a steady state (_replay)
SMALL = 1 << 20  # the largest allocation of the small pool (csrc/pool/block.h: kSmallSize)
RING = 1 << 17  # records per device a probe starts with (8 MiB; run_probe takes more when they overflow)
# The allocator's policy keys that shape what a replay reserves; the rest
# (backend, capacity, recording, call sites) are the replay's own business.
POLICY_KEYS = (
    "expandable_segments",
    "garbage_collection_threshold",
    "max_split_size_mb",
    "reuse_free_pages",
    "roundup_power2_divisions",
)


class PlannerError(ValueError):
    """The planner cannot answer: a probe did not fit, the recording lost
    events, or the arguments are wrong. The message says which and what to do."""


# ---- the budget -----------------------------------------------------------------
def parse_size(text: str) -> int | None:
    """A budget's text as bytes: an int (``"1073741824"``), or a number with
    a unit (``"7GiB"``, ``"7.5G"``, ``"512MiB"``, ``"500MB"``: binary k/KiB,
    M/MiB, G/GiB, T/TiB; decimal kB, MB, GB, TB; any case, spaces allowed),
    or None for ``"free"`` (the default budget). The one parser of
    :func:`largest_batch`'s ``budget`` and ``memalloc run --fit``'s BUDGET.
    PlannerError naming the accepted forms otherwise."""
    if text.strip().lower() == "free":
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m and UNITS.get(m.group(2).lower())
    if not m or unit is None:
        raise PlannerError(f"budget {text!r} is not a size: give {BUDGET_FORMS}")
    number = m.group(1)
    return int(number) * unit if "." not in number else int(float(number) * unit)


def as_budget(budget: Any) -> int | None:
    """``budget`` as bytes: an int as it is, a string through
    :func:`parse_size`, None (and ``"free"``) as None; at least 1 MiB.
    PlannerError otherwise."""
    given = budget
    if isinstance(budget, str):
        budget = parse_size(budget)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < MiB):
        raise PlannerError(
            f"budget must be an int of bytes, at least 1 MiB, or a size string such as '7GiB', "
            f"'7.5G', '512MiB', '500MB' ('free' or None: the default), not {given!r}"
        )
    return budget


def device_limit(allocator: _C.Allocator, device: int) -> tuple[int, str]:
    """The most the allocator can ever reserve on ``device`` (bytes): the
    device's total memory (the host backend's: its simulated capacity),
    under the memory fraction when one is set; and those bytes in words."""
    _, total = allocator.mem_get_info(device)
    fraction = allocator.memory_fraction(device)
    if fraction and fraction < 1:
        limit = int(fraction * total)
        return limit, f"{fmt_bytes(limit)} (memory fraction {fraction:g} of its {fmt_bytes(total)})"
    return total, fmt_bytes(total)


def check_budget(
    allocator: _C.Allocator, device: int, budget: int, default: str = "leave it out (budget=None)"
) -> None:
    """PlannerError when ``budget`` (bytes) is more than device ``device``
    can give (:func:`device_limit`): a plan for memory the device does not
    have runs out of memory at the planned batch. ``default`` says how the
    caller asks for the default budget (the device's free memory)."""
    limit, words = device_limit(allocator, device)
    if budget > limit:
        raise PlannerError(
            f"budget {fmt_bytes(budget)} ({budget} bytes) is larger than device {device}'s {words}: "
            f"give a budget of at most {fmt_bytes(limit)} ({limit} bytes), or {default} "
            "to use what is free"
        )


# ---- one probe ------------------------------------------------------------------
Key = tuple  # (origin "live" | "alloc", call stack hash, tag path, k-th of those)


@dataclasses.dataclass(frozen=True)
class ProbeRecord:
    """What one probe batch did, as the planner needs it (sizes in bytes):
    the blocks live when recording began (``live``: (key, requested
    bytes) in address order), and the recorded steps' allocation ops in
    order (``ops``: ("alloc", key, requested bytes) or ("free", key)), with
    the peaks the recording itself gives (allocated: block sizes; reserved:
    the allocator's reserved bytes when recording began plus its segments
    since). ``step_allocs``: the number of allocations (alloc ops) made by
    the end of each recorded step, when the recorder knew where steps end
    (:func:`run_probe`); empty otherwise (the steps are then found in the
    ops: :func:`_step_starts`). ``layout``: the device's segments when
    recording began, each as (its pool, "small" or "large"; its blocks in
    address order as (the live block's key, or None for a free block; block
    bytes)), so that the replay starts from where the blocks live then
    are, the holes between them included (empty: the live blocks are
    replayed one after another)."""

    batch: int
    live: tuple[tuple[Key, int], ...]
    ops: tuple[tuple, ...]
    peak_allocated: int
    peak_reserved: int
    step_allocs: tuple[int, ...] = ()
    layout: tuple[tuple[str, tuple[tuple[Key | None, int], ...]], ...] = ()

    def to_json(self) -> dict:
        return {
            "batch": self.batch,
            "live": [[list(k), n] for k, n in self.live],
            "ops": [[op[0], list(op[1]), *op[2:]] for op in self.ops],
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "step_allocs": list(self.step_allocs),
            "layout": [
                [pool, [[None if k is None else list(k), n] for k, n in blocks]] for pool, blocks in self.layout
            ],
        }

    @staticmethod
    def from_json(d: dict) -> ProbeRecord:
        try:
            return ProbeRecord(
                int(d["batch"]),
                tuple((tuple(k), int(n)) for k, n in d["live"]),
                tuple((op[0], tuple(op[1]), *op[2:]) for op in d["ops"]),
                int(d["peak_allocated"]),
                int(d["peak_reserved"]),
                tuple(int(n) for n in d.get("step_allocs", ())),
                tuple(
                    (str(pool), tuple((None if k is None else tuple(k), int(n)) for k, n in blocks))
                    for pool, blocks in d.get("layout", ())
                ),
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PlannerError(
                f"not a probe record of memalloc's batch planner ({e!r}): write it with ProbeRecord.to_json"
            ) from None


# torch.nn.Module's call dispatch: the line of these frames says whether any
# forward hook is registered (torch's fast path calls forward from another
# line than the path that runs hooks), not where the memory is allocated.
_DISPATCH_FILE = os.path.join("torch", "nn", "modules", "module.py")
_DISPATCH = ("_call_impl", "_wrapped_call_impl")


def _dispatch_frame(f: recording.Frame) -> bool:
    """A frame of the dispatch or of a function inside it (the hook path's ``inner``)."""
    return f.filename.endswith(_DISPATCH_FILE) and any(part in _DISPATCH for part in f.name.split("."))


class _Sites:
    """A process-independent name for an allocation's origin: a short hash
    of its call stack's frames (stack ids are this process's own) and its
    tag path, looked up once per stack. The frames of torch.nn.Module's call
    dispatch (_DISPATCH) are left out: a global forward hook that comes off
    after the first forward (the memory breakdown's first-forward hook does)
    changes their lines between a probe's first step and the next ones, and
    the allocations of those steps would not match (issue 37: a wide CNN's
    plan went from 95 to 97, which runs out of memory in its second step)."""

    def __init__(self) -> None:
        self.names = _C.tag_names()
        self.cache: dict[int, str] = {}

    def stack(self, stack_id: int) -> str:
        if stack_id not in self.cache:
            frames = recording.stack(stack_id) if stack_id else ()
            text = "|".join(f"{f.filename}:{f.line}" for f in frames if not _dispatch_frame(f))
            self.cache[stack_id] = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        return self.cache[stack_id]

    def tag(self, tag_id: int) -> str:
        return self.names[tag_id] if 0 <= tag_id < len(self.names) else ""


def probe_record(
    batch: int,
    live: Sequence[tuple],
    events: Sequence[recording.Event],
    reserved_at_start: int,
    segments: Sequence[dict] = (),
) -> ProbeRecord:
    """A ProbeRecord from the blocks live when recording began (live_blocks
    tuples: addr, size, requested, stack_id, tag_id, step), the device's
    segments then (the allocator's ``segments(device)``: its layout) and
    the events recorded after (one device's, in order). A key is (origin,
    call stack, tag path, k): the k-th block of that origin from that stack
    and tag (live blocks counted by size, allocations in event order)."""
    sites = _Sites()
    counts: dict[tuple, int] = {}

    def key(origin: str, stack_id: int, tag: str) -> Key:
        site = (origin, sites.stack(stack_id), tag)
        k = counts.get(site, 0)
        counts[site] = k + 1
        return (*site, k)

    # Live blocks are numbered within their site by size, then address: their
    # addresses move between probes (gradients set to None are made anew each
    # step), their sizes keep their order as the batch grows.
    live = sorted(live)
    numbered = sorted(
        range(len(live)), key=lambda i: (sites.stack(live[i][3]), sites.tag(live[i][4]), live[i][2], live[i][0])
    )
    live_keys: list = [None] * len(live)
    for i in numbered:
        live_keys[i] = key("live", live[i][3], sites.tag(live[i][4]))
    by_addr = {b[0]: (k, b[1]) for b, k in zip(live, live_keys)}
    allocated = sum(b[1] for b in live)
    peak_allocated, reserved = allocated, reserved_at_start
    peak_reserved = reserved
    ops: list[tuple] = []
    for e in events:
        if e.action == "alloc":
            k = key("alloc", e.stack_id, e.tag)
            by_addr[e.addr] = (k, e.size)
            ops.append(("alloc", k, e.requested))
            allocated += e.size
            peak_allocated = max(peak_allocated, allocated)
        elif e.action == "free_requested" and e.addr in by_addr:
            k, size = by_addr.pop(e.addr)
            ops.append(("free", k))
            allocated -= size
        elif e.action in ("segment_alloc", "segment_map"):
            reserved += e.size
            peak_reserved = max(peak_reserved, reserved)
        elif e.action in ("segment_free", "segment_unmap"):
            reserved -= e.size
    key_at = {b[0]: k for b, k in zip(live, live_keys)}
    layout = tuple(
        (
            seg["segment_type"],
            tuple(
                (key_at.get(b["address"]) if b["state"] == "active_allocated" else None, b["size"])
                for b in sorted(seg["blocks"], key=lambda b: b["address"])
            ),
        )
        for seg in sorted(segments, key=lambda seg: seg["address"])
    )
    return ProbeRecord(
        batch,
        tuple((k, b[2]) for b, k in zip(live, live_keys)),
        tuple(ops),
        peak_allocated,
        peak_reserved,
        layout=layout,
    )


class ProbeRecording:
    """One probe of ``1 + steps`` steps at ``batch``, recorded from now: the
    blocks live and the bytes reserved at the start are noted and the event
    ring of one device (``ring`` records, Python stacks) is started; the
    caller calls :meth:`step_ended` where each step ends, which says when
    the probe has its steps; :meth:`finish` then reads the ring back, turns
    it off and gives the record. The one way a probe is taken: in-process
    by :func:`run_probe` (a step ends when ``step(batch)`` returns) and in a
    probe's own process by ``memalloc run --fit`` (memalloc/cli/fit.py: at
    each ``optimizer.step()`` or ``memalloc.step()``)."""

    def __init__(self, allocator: _C.Allocator, device: int, ring: int, batch: int, steps: int) -> None:
        if recording.history_on(device, allocator):
            raise PlannerError(
                f"device {device} is recording (memalloc.record_history): the planner needs "
                "the event ring for its probes; stop the history first "
                "(memalloc.record_history(enabled=False))"
            )
        self.allocator, self.device, self.ring, self.batch, self.steps = allocator, device, ring, batch, steps
        self.live = live_blocks(device, allocator)
        self.segments = allocator.segments(device)
        self.reserved = allocator.stats(device)["reserved_bytes"]["all"]["current"]
        self.allocs = self._allocations()
        self.step_allocs: list[int] = []
        recording.record_history(max_entries=ring, stacks="python", device=device, allocator=allocator)

    def _allocations(self) -> int:
        return self.allocator.stats(self.device)["allocation"]["all"]["allocated"]

    def step_ended(self) -> bool:
        """Notes that a step ended here (the allocations made so far), so
        the replay knows the steps it repeats; True once the
        probe's ``1 + steps`` steps have ended (then :meth:`finish`)."""
        self.step_allocs.append(self._allocations() - self.allocs)
        return len(self.step_allocs) >= 1 + self.steps

    def stop(self) -> None:
        recording.record_history(enabled=False, device=self.device, allocator=self.allocator)

    def finish(self) -> tuple[ProbeRecord | None, int]:
        """(the record, 0), or (None, events lost) when the ring overflowed;
        the ring is off afterwards either way."""
        try:
            lost = recording.dropped(self.device, allocator=self.allocator)
            events = recording.events(self.device, allocator=self.allocator) if not lost else []
        finally:
            self.stop()
        if lost:
            return None, lost
        record = probe_record(self.batch, self.live, events, self.reserved, self.segments)
        allocs = sum(op[0] == "alloc" for op in record.ops)
        if self.step_allocs and self.step_allocs[-1] == allocs:  # the counts name the recorded allocations
            record = dataclasses.replace(record, step_allocs=tuple(self.step_allocs))
        return record, 0


def run_probe(
    step: Callable[[int], Any], batch: int, allocator: _C.Allocator, device: int, steps: int, ring: int = RING
) -> ProbeRecord:
    """``1 + steps`` calls of ``step(batch)``, recorded from the first: the
    first probe's first step is the model's first (the optimizer state comes
    into being in it, between the batch's tensors, as in a fresh run). A
    ring of ``ring`` records that overflows is taken again, 8 times larger
    (up to the most a ring holds), with the steps run again."""
    rec = ProbeRecording(allocator, device, ring, batch, steps)
    try:
        done = False
        while not done:
            step(batch)
            done = rec.step_ended()
    except torch.OutOfMemoryError as e:
        rec.stop()
        raise PlannerError(
            f"the probe at batch {batch} ran out of memory already "
            f"({str(e).splitlines()[0]}): give smaller probes (probes=(1, 2, 4)) "
            "or a smaller model"
        ) from None
    except BaseException:
        rec.stop()
        raise
    record, lost = rec.finish()
    if record is not None:
        return record
    if ring < _C.max_trace_records():
        return run_probe(step, batch, allocator, device, steps, min(ring * 8, _C.max_trace_records()))
    raise PlannerError(
        f"the probe at batch {batch} recorded more than {ring} events per device and lost "
        f"{lost}: record fewer steps (steps=1) or give smaller probes"
    )


# ---- the prediction -------------------------------------------------------------
def _sizes_by_key(record: ProbeRecord) -> dict[Key, int]:
    out = {k: n for k, n in record.live}
    for op in record.ops:
        if op[0] == "alloc":
            out[op[1]] = op[2]
    return out


RESYNC = 1024  # ops either side an alignment looks past to find the two sequences in step again
CONFIRM = 4  # ops that must agree after a resync point
LOCAL = 8  # ops either side a swap of neighbours is looked for first
NEARBY = 64  # positions a second pass looks either side for an allocation that came out of order


def _growth_fits(small: int, large: int, ratio: float) -> bool:
    """Whether an allocation of ``small`` bytes at one batch can be the one
    of ``large`` bytes at a batch ``ratio`` times larger: the same size, or
    grown at most in proportion (bytes = fixed + per sample x batch, with a
    little room for rounding)."""
    return small == large or small < large <= small * ratio * 1.25 + 4096


def _align(small: ProbeRecord, large: ProbeRecord) -> dict[Key, Key]:
    """The allocations of ``small`` matched to those of ``large`` (a larger
    batch): {small's key: large's key}. Blocks live at the start match by
    key (their numbering is by size within a site) where the sizes allow it;
    allocations by order, same site and tag and a plausible growth. Where
    the two part, a swap of near neighbours is looked for first (CPU kernels
    allocate on worker threads, whose order varies from run to run), then a
    resync point up to RESYNC ops on (an allocation that one probe makes and
    the other does not: a kernel that takes a workspace at some batch sizes
    only), taken only when the CONFIRM ops after it agree too; a second pass
    (_match_nearby) matches what is left near where it belongs."""
    ratio = large.batch / small.batch
    large_live = dict(large.live)
    out = {k: k for k, n in small.live if k in large_live and _growth_fits(n, large_live[k], ratio)}
    a = [op for op in small.ops if op[0] == "alloc"]
    b = [op for op in large.ops if op[0] == "alloc"]
    ids: dict[tuple, int] = {}
    site_a = [ids.setdefault(op[1][:3], len(ids)) for op in a]
    site_b = [ids.setdefault(op[1][:3], len(ids)) for op in b]
    size_a = [op[2] for op in a]
    size_b = [op[2] for op in b]
    na, nb = len(a), len(b)

    def same(i: int, j: int) -> bool:
        return i < na and j < nb and site_a[i] == site_b[j] and _growth_fits(size_a[i], size_b[j], ratio)

    def agree(i: int, j: int) -> bool:
        return all(same(i + d, j + d) for d in range(CONFIRM) if i + d < na and j + d < nb)

    used_b: set[int] = set()
    i = j = 0
    while i < na and j < nb:
        if j in used_b:
            j += 1
            continue
        if same(i, j):
            out[a[i][1]] = b[j][1]
            used_b.add(j)
            i += 1
            j += 1
            continue
        local = next((d for d in range(1, LOCAL + 1) if j + d < nb and j + d not in used_b and same(i, j + d)), None)
        if local is not None:  # a[i] comes a little later in b: match it there, keep b[j] for what follows
            out[a[i][1]] = b[j + local][1]
            used_b.add(j + local)
            i += 1
            continue
        for d in range(1, RESYNC + 1):
            if same(i, j + d) and agree(i, j + d):
                j += d  # large makes d allocations small does not
                break
            if same(i + d, j) and agree(i + d, j):
                i += d  # small makes d allocations large does not
                break
        else:
            i += 1
            j += 1  # no resync point near: these two differ, go on
    _match_nearby(a, b, out, same)
    return out


def _match_nearby(a: list, b: list, out: dict, same: Callable[[int, int], bool]) -> None:
    """A second pass over what the first left unmatched: allocations that
    threads made in a different order, each matched to the nearest
    unmatched one of the same site and plausible growth within NEARBY
    positions of where the matched neighbours put it."""
    matched_b = set(out.values())
    where = {}  # small's index -> large's index, for the matched
    index_b = {op[1]: j for j, op in enumerate(b)}
    for i, op in enumerate(a):
        if op[1] in out:
            where[i] = index_b[out[op[1]]]
    free_b: dict[tuple, list[int]] = {}
    for j, op in enumerate(b):
        if op[1] not in matched_b:
            free_b.setdefault(op[1][:3], []).append(j)
    offset = 0
    for i, op in enumerate(a):
        if i in where:
            offset = where[i] - i
            continue
        candidates = free_b.get(op[1][:3])
        if not candidates:
            continue
        expected = i + offset
        lo, hi = bisect.bisect_left(candidates, expected - NEARBY), bisect.bisect_right(candidates, expected + NEARBY)
        near = [j for j in candidates[lo:hi] if same(i, j)]
        if near:
            j = min(near, key=lambda j: abs(j - expected))
            candidates.remove(j)
            out[op[1]] = b[j][1]


class _Scaler:
    """Each allocation of the base probe (the smallest: its recording starts
    where the model's training starts), its requested size at a batch size,
    from its sizes in the probes it was matched in (_align)."""

    def __init__(self, base: ProbeRecord, others: Sequence[ProbeRecord]):
        own = _sizes_by_key(base)
        self.keys = list(own)  # the base probe's allocations, the ones replayed
        self.points: dict[Key, list[tuple[int, int]]] = {k: [(base.batch, n)] for k, n in own.items()}
        for r in sorted(others, key=lambda r: r.batch):
            sizes = _sizes_by_key(r)
            for k_base, k_other in _align(base, r).items():
                self.points[k_base].append((r.batch, sizes[k_other]))
        self.matched = sum(len(self.points[k]) > 1 for k in own) / max(1, len(own))

    def size(self, key: Key, batch: int) -> int:
        pts = self.points[key]
        if len(pts) == 1:
            return pts[0][1]
        (b1, s1), (b2, s2) = pts[-2], pts[-1]
        slope = (s2 - s1) / (b2 - b1)
        return max(s1, s2, int(math.ceil(s2 + slope * (batch - b2))))

    def growing(self, key: Key) -> bool:
        pts = self.points[key]
        return len(pts) > 1 and pts[-1][1] > pts[0][1]


def _step_starts(record: ProbeRecord) -> list[int]:
    """Where each recorded step begins, as the number of alloc ops before
    it: from ``step_allocs`` when the recorder noted them, else found in
    the ops (:func:`_period`: the last step's length, its copies counted
    back from the end, the rest one first step). Empty when no step repeats."""
    allocs = [op[1][:3] for op in record.ops if op[0] == "alloc"]
    if len(record.step_allocs) >= 2:
        return [0, *record.step_allocs[:-1]]
    m = _period(allocs)
    if not m:
        return []
    starts = list(range(len(allocs) - m, -1, -m))[::-1]
    return starts if starts[0] == 0 else [0, *starts]


def _period(sites: list) -> int:
    """The length of the last step when the ops do not say where steps end:
    the longest tail of allocation sites that its predecessor repeats (a
    step's layers repeat within it too: the longest tail is the whole
    step); 0 when there is none."""
    for m in range(len(sites) // 2, 0, -1):
        if sites[-m:] == sites[-2 * m : -m]:
            return m
    return 0


Site = tuple  # (origin, call stack, tag path): where an allocation comes from


@dataclasses.dataclass
class _Pattern:
    """A probe's pattern with every size at one batch: ``ops``, the blocks
    live when recording began (where they were: holes made and freed) and
    the recorded steps, as replay ops (("alloc", bytes), ("free", key), the
    k-th alloc op making key k); ``steps``, per recorded step the keys it
    made, in order, and ``sites``, its allocations by (site, rank: the r-th
    from that site in the step) -> key; ``cycle``, the recorded steps after
    the first, the steps a training run goes on repeating in turn: per
    step ("alloc", bytes, site) and ("free", steps back, site, rank), a free
    of the block that the step so many steps before (0: the step itself)
    made as the rank-th from that site (empty when the record's steps are
    not known, or there is one)."""

    ops: list[tuple]
    steps: list[list[int]]
    sites: list[dict[tuple[Site, int], int]]
    cycle: list[list[tuple]]


def _pattern_at(record: ProbeRecord, scaler: _Scaler, batch: int) -> _Pattern:
    """The base probe's record at ``batch`` (see _Pattern). A step of the
    cycle frees, in every turn, what it freed when recorded, counted in
    steps back and named by site and rank within its step, so that the
    steps of a cycle may differ (sequence lengths that change from step to
    step: the shapes a job runs); frees of blocks live before recording
    began are not repeated."""
    index: dict[Key, int] = {}  # live key -> the replay's key (the k-th alloc op makes key k)
    ops: list[tuple] = []
    holes: list[int] = []
    # The blocks live at the start where they were: each segment's blocks in
    # address order, a free block (a hole the model's construction left, the
    # cache) made and freed again once every segment is built, in pieces that
    # stay in its pool (a small segment's free tail can be larger than a small
    # allocation; a hole of small size in a large segment is left out).
    for pool, blocks in record.layout:
        for k, n in blocks:
            if k is None or k in index:
                pieces = [SMALL] * (n // SMALL) + [n % SMALL] if pool == "small" else [n] if n > SMALL else []
                for piece in (p for p in pieces if p):
                    holes.append(len(index) + len(holes))
                    ops.append(("alloc", piece))
            else:
                index[k] = len(index) + len(holes)
                ops.append(("alloc", scaler.size(k, batch)))
    for k, _ in record.live:
        if k not in index:  # not in the layout (a record without one): one after another
            index[k] = len(index) + len(holes)
            ops.append(("alloc", scaler.size(k, batch)))
    allocs = len(ops)
    ops.extend(("free", h) for h in holes)
    starts = _step_starts(record)
    steps: list[list[int]] = [[] for _ in starts]
    sites: list[dict] = [{} for _ in starts]
    cycle: list[list[tuple]] = [[] for _ in starts[1:]]
    made_at: dict[Key, tuple[int, Site, int]] = {}  # a recorded allocation's (step, site, rank)
    ranks: list[dict[Site, int]] = [{} for _ in starts]  # per step, the allocations from each site so far
    # A free after a step's last allocation is the next step's (the step's locals going out of scope as
    # it returns: counted by allocations, it is where the next step begins); after the last recorded
    # step's last allocation, it is the step after it, the cycle's first in the next turn: it goes first
    # there, as many steps back (kept as the last step's own free, the turn after freed nothing of what
    # the first step had freed of the step before it, and the replay kept a step's worth more at every
    # turn)
    bounds = [*starts, record.step_allocs[-1]] if len(record.step_allocs) >= 2 else starts
    after: list[tuple] = []  # the frees after the last step, as the cycle's first step's
    freed_in: dict[Key, int] = {}  # a recorded allocation's free's step
    n = 0  # the record's allocations so far
    for op in record.ops:
        t = bisect.bisect_right(bounds, n) - 1  # the step an op is in (-1: no steps known; len(starts): after)
        if op[0] == "alloc":
            size = scaler.size(op[1], batch)
            if t >= 0:
                site = op[1][:3]
                rank = ranks[t].get(site, 0)
                ranks[t][site] = rank + 1
                made_at[op[1]] = (t, site, rank)
                sites[t][site, rank] = allocs
                steps[t].append(allocs)
                if t >= 1:
                    cycle[t - 1].append(("alloc", size, site))
            index[op[1]] = allocs
            allocs += 1
            n += 1
            ops.append(("alloc", size))
        elif op[1] in index:
            if op[1] in made_at:
                freed_in[op[1]] = t
                t0, site, rank = made_at[op[1]]
                if 1 <= t < len(starts):
                    cycle[t - 1].append(("free", t - t0, site, rank))
                elif t == len(starts) and t0 >= 1:
                    after.append(("free", t - t0, site, rank))
            ops.append(("free", index.pop(op[1])))
    if len(record.step_allocs) < 2:  # steps found in the ops (_period): only the last is sure to be one
        cycle = cycle[-1:]
    elif cycle:
        _carry_across_turns(cycle, made_at, freed_in)
        cycle[0][:0] = after
    return _Pattern(ops, steps, sites, [c for c in cycle if c] if len(starts) >= 2 else [])


def _carry_across_turns(
    cycle: list[list[tuple]], made_at: dict[Key, tuple[int, Site, int]], freed_in: dict[Key, int]
) -> None:
    """Renames, in place, the cycle's frees of blocks made before the cycle
    began (the first step's, which is not repeated) as the blocks that the
    replay's step as many steps back makes. In a turn after the first, the
    step before the cycle's first is its last, not the first recorded: the
    k-th block from a site that the first step kept for its next step (a
    gradient) is the k-th from that site that the cycle's step keeps as
    long, whose rank among all its allocations from that site can differ
    (the first step's backward makes one more from the same line: its
    ranks after it are one off, and the replay freed nothing there and kept
    a step's gradients more at every turn). ``freed_in``: the step each
    recorded block was freed in (none: still live when recording ended)."""
    steps = len(cycle)  # the cycle's templates are recorded steps 1..steps
    kept: dict[tuple[int, Site, int], list[int]] = {}  # (step, site, steps kept) -> ranks, ascending
    for key, (t, site, rank) in made_at.items():
        kept.setdefault((t, site, freed_in.get(key, steps + 1 + t) - t), []).append(rank)
    for ranks in kept.values():
        ranks.sort()
    lasting: dict[tuple[int, Site, int], list[int]] = {}  # (step, site, n) -> ranks of those kept n steps or more

    def kept_at_least(step: int, site: Site, n: int) -> list[int]:
        if (step, site, n) not in lasting:
            lasting[step, site, n] = sorted(
                r for (t, s, k), rs in kept.items() if t == step and s == site and k >= n for r in rs
            )
        return lasting[step, site, n]

    for i, template in enumerate(cycle):
        for j, op in enumerate(template):
            if op[0] != "free" or i + 1 - op[1] >= 1:
                continue
            back, site, rank = op[1], op[2], op[3]
            ranks = kept.get((i + 1 - back, site, back), [])
            pos = bisect.bisect_left(ranks, rank)
            if pos == len(ranks) or ranks[pos] != rank:
                continue
            source = (i - back) % steps + 1  # the recorded step the replay made it in, `back` steps before
            there = kept_at_least(source, site, back)  # its blocks from that site kept as long (or never freed)
            if pos < len(there):
                template[j] = ("free", back, site, there[pos])


@dataclasses.dataclass(frozen=True)
class _Run:
    fits: bool
    peak_allocated: int
    peak_reserved: int
    repeats: int
    steady: bool


def _replay(pattern: _Pattern, config: str, budget: int, max_repeats: int) -> _Run:
    """``pattern`` replayed on a fresh host allocator of ``budget`` bytes
    (whole MiB) under the policy ``config``, as the allocator runs it (an
    allocation that does not fit frees the cache and retries first), then
    its cycle of steps again and again until, at the end of a turn, the
    allocator is in a state it was in at the end of an earlier one, or
    ``max_repeats`` steps have been run. The state is every segment and
    block (address, size, free or in use) and, for a block in use, which
    allocation of which step made it, counted back from the step just ended
    (blocks that no later step frees, by their own step): from a state seen
    before, the same steps make the same states again, so no later step of
    the run reserves more or runs out of memory (``steady``). Stops at the
    first allocation that runs out of memory (not ``fits``). ``repeats``:
    the steps run after the recorded ones."""
    a = _C.Allocator(
        "host", ",".join(part for part in (config, "host_devices:1", f"host_capacity_mb:{budget // MiB}") if part)
    )
    ptrs: list[int] = []
    step_of: list[int] = []  # each key's step (-1: live before recording began) ...
    place_of: list[int] = []  # ... and its place among that step's allocations
    live: dict[int, int] = {}  # pointer -> key
    made_in: dict[int, tuple[int, int]] = {
        k: (s, j) for s, made in enumerate(pattern.steps) for j, k in enumerate(made)
    }

    def run(repeats: int, steady: bool, fits: bool = True) -> _Run:
        st = a.stats(0)
        return _Run(fits, st["allocated_bytes"]["all"]["peak"], st["reserved_bytes"]["all"]["peak"], repeats, steady)

    def alloc(size: int, step: int, place: int) -> bool:
        try:
            ptr = a.malloc(size, 0, 0)
        except torch.OutOfMemoryError:
            return False
        live[ptr] = len(ptrs)
        ptrs.append(ptr)
        step_of.append(step)
        place_of.append(place)
        return True

    def free(key: int) -> None:
        a.free(ptrs[key], 0)
        del live[ptrs[key]]

    for op in pattern.ops:
        if op[0] == "alloc":
            s, j = made_in.get(len(ptrs), (-1, len(ptrs)))
            if not alloc(op[1], s, j):
                return run(0, False, fits=False)
        else:
            free(op[1])
    if not pattern.cycle:
        return run(0, False)
    # a block made more than `reach` steps back is freed by no later step: it is kept where it is (the
    # optimizer state, made in the first step), named by its own step, not counted back
    reach = max((op[1] for step in pattern.cycle for op in step if op[0] == "free"), default=0)

    def state(steps: int) -> tuple:
        roles = {
            ptr: (steps - step_of[k], place_of[k]) if 0 <= steps - step_of[k] <= reach else (-1, k)
            for ptr, k in live.items()
        }
        return tuple(
            (
                seg["address"],
                seg["total_size"],
                tuple((b["address"], b["size"], b["state"], roles.get(b["address"])) for b in seg["blocks"]),
            )
            for seg in a.segments(0)
        )

    sites = list(pattern.sites)
    seen = {state(len(sites))}
    repeats = 0
    while True:
        for template in pattern.cycle:
            if repeats >= max_repeats:
                return run(repeats, False)
            made: dict[tuple[Site, int], int] = {}
            ranks: dict[Site, int] = {}
            sites.append(made)
            for op in template:
                if op[0] == "alloc":
                    key = len(ptrs)
                    if not alloc(op[1], len(sites) - 1, len(made)):
                        return run(repeats + 1, False, fits=False)
                    rank = ranks.get(op[2], 0)
                    ranks[op[2]] = rank + 1
                    made[op[2], rank] = key
                    continue
                back, site, rank = op[1], op[2], op[3]
                target = sites[-1 - back].get((site, rank)) if back < len(sites) else None
                if target is not None and ptrs[target] in live and live[ptrs[target]] == target:
                    free(target)
            repeats += 1
        now = state(len(sites))
        if now in seen:
            return run(repeats, True)
        seen.add(now)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the replay of one batch size gave (bytes): whether it fits, its
    peaks (up to its first allocation that ran out of memory, when one
    did), the steps it ran after the recorded ones, and whether it was then
    steady (in a state it had been in at the end of an earlier turn of the
    repeated steps: every later step repeats one already replayed)."""

    batch: int
    fits: bool
    peak_allocated: int
    peak_reserved: int
    repeats: int = 0
    steady: bool = False


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The planner's answer (sizes in bytes).

    ``batch``: the largest batch predicted to fit ``budget`` (the largest
    probe at least; the search stops at ``max_batch``); ``peak_reserved`` /
    ``peak_allocated``: the replay's peaks at that batch; ``fixed_bytes`` /
    ``per_sample_bytes``: the probes' peak allocated split into the part
    that does not grow with the batch and what each sample adds; ``limit``:
    (budget - fixed) // per sample, the batch a perfect allocator would fit
    (about: see the module's docstring); ``probes``: (batch, peak
    allocated, peak reserved) as measured; ``growing_share``: the share of
    the smallest probe's allocations (the pattern replayed) whose size grows
    with the batch; ``matched_share``: the share of them found again in
    another probe; ``predictions``: every batch the search tried;
    ``steady``: whether the replay at ``batch`` came back to a state it had
    been in (every later step repeats one replayed), after ``repeats``
    steps beyond the recorded ones; when not, the plan holds for that many
    steps (``print(plan)`` says so)."""

    batch: int
    budget: int
    peak_allocated: int
    peak_reserved: int
    fixed_bytes: int
    per_sample_bytes: int
    limit: int | None
    probes: tuple[tuple[int, int, int], ...]
    growing_share: float
    matched_share: float
    predictions: tuple[Prediction, ...]
    capped: bool = False  # the search reached max_batch
    steady: bool = True  # the replay at ``batch`` reached a steady state (Prediction.steady) ...
    repeats: int = 0  # ... after this many steps beyond the recorded ones

    def __str__(self) -> str:
        """The plan in a few lines (memalloc/reporters/plan.py renders it)."""
        return plan_text(self.to_dict())

    def __repr__(self) -> str:
        return (
            f"<memalloc BatchPlan: batch {self.batch}{' (max_batch)' if self.capped else ''} fits "
            f"{fmt_bytes(self.budget)}; predicted peak reserved {fmt_bytes(self.peak_reserved)}, "
            f"allocated {fmt_bytes(self.peak_allocated)}; {fmt_bytes(self.per_sample_bytes)} per sample>"
        )

    def _repr_html_(self) -> str:
        """What Jupyter shows (memalloc/reporters/notebook.py renders it)."""
        return plan_html(self.to_dict())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def policy_config(allocator: _C.Allocator) -> str:
    """The allocator's policy keys as config text for a replay."""
    items = [item.split(":", 1) for item in allocator.config.split(",") if ":" in item]
    return ",".join(f"{k}:{v}" for k, v in items if k in POLICY_KEYS)


def plan(
    records: Sequence[ProbeRecord],
    budget: int,
    config: str = "",
    *,
    max_batch: int = 1 << 16,
    repeats: int | None = None,
) -> BatchPlan:
    """The largest batch predicted to fit ``budget`` bytes from the probes'
    records (ascending batch sizes, at least two), replayed under the
    policy ``config`` (:func:`policy_config` of the allocator), the
    recorded steps after the first repeated in turn until the replay is
    steady, at most ``repeats`` steps (default MAX_REPEATS)."""
    records = sorted(records, key=lambda r: r.batch)
    if len(records) < 2 or len({r.batch for r in records}) != len(records):
        raise PlannerError(
            f"the planner needs probes at two or more different batch sizes, got {[r.batch for r in records]}"
        )
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MiB:
        raise PlannerError(f"budget must be an int of bytes, at least 1 MiB, not {budget!r}")
    base, largest = records[0], records[-1]
    scaler = _Scaler(base, records[1:])
    repeats = MAX_REPEATS if repeats is None else repeats
    tried: dict[int, Prediction] = {}

    def judge(batch: int) -> Prediction:
        if batch not in tried:
            r = _replay(_pattern_at(base, scaler, batch), config, budget, repeats)
            tried[batch] = Prediction(batch, r.fits, r.peak_allocated, r.peak_reserved, r.repeats, r.steady)
        return tried[batch]

    lo = largest.batch
    if not judge(lo).fits:
        raise PlannerError(
            f"the largest probe, batch {lo}, does not fit {fmt_bytes(budget)} in the replay "
            "already: give smaller probes or a larger budget"
        )
    hi = None
    while hi is None:
        nxt = min(max_batch, lo * 2)
        if nxt <= lo:
            break
        if judge(nxt).fits:
            lo = nxt
        else:
            hi = nxt
    if hi is not None:
        lo = _boundary(lambda batch: judge(batch).fits, lo, hi)
    (b1, a1), (b2, a2) = [(r.batch, r.peak_allocated) for r in records[-2:]]
    per_sample = max(0, (a2 - a1) // (b2 - b1))
    fixed = max(0, a2 - per_sample * b2)
    best = judge(lo)
    return BatchPlan(
        batch=lo,
        budget=budget,
        peak_allocated=best.peak_allocated,
        peak_reserved=best.peak_reserved,
        fixed_bytes=fixed,
        per_sample_bytes=per_sample,
        limit=(budget - fixed) // per_sample if per_sample else None,
        probes=tuple((r.batch, r.peak_allocated, r.peak_reserved) for r in records),
        growing_share=sum(scaler.growing(k) for k in scaler.keys) / max(1, len(scaler.keys)),
        matched_share=scaler.matched,
        predictions=tuple(sorted(tried.values(), key=lambda p: p.batch)),
        capped=hi is None and lo == max_batch,
        steady=best.steady,
        repeats=best.repeats,
    )


def _boundary(fits: Callable[[int], bool], good: int, bad: int) -> int:
    """The planner's one search: bisects between ``good`` (it fits) and
    ``bad`` (it does not) and returns the value that fits next to the
    boundary: the largest batch when ``good < bad`` (:func:`plan`), the
    smallest device when ``good > bad`` (:func:`smallest_device_mb`). It
    assumes fitting is monotonic between the two (where fragmentation makes
    it not, another value beyond the boundary may fit too)."""
    while abs(bad - good) > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def smallest_device_mb(source: str, config: str = "", *, step_mb: int = 8, **options: Any) -> int:
    """The smallest device that fits a recorded workload: the smallest
    capacity of the simulated device, in MiB and a multiple of ``step_mb``,
    under which :func:`memalloc.features.replay.replay_source` of ``source``
    (a trace's path or ``random:N``) under
    ``config`` makes no OOM: the smallest device the workload trains on with
    that policy (what "fit more" saves, measured on the CPU).

    The planner's search (:func:`_boundary`, as :func:`plan` bisects the
    batch) between a capacity that fails and one that fits (the unlimited
    replay's peak reserved, rounded up): it assumes that a device larger
    than one that fits fits too, and checks both ends. ``options``
    go to :func:`replay_source` (``host_capacity_mb`` is this function's).
    Raises ValueError when the unlimited replay itself has OOMs."""
    check_int("step_mb", step_mb, 1)
    if "host_capacity_mb" in options:
        raise ValueError("smallest_device_mb chooses host_capacity_mb itself")
    step = step_mb * MiB

    def fits(units: int) -> bool:
        result = replay.replay_source(source, config, host_capacity_mb=units * step_mb, **options)
        return all(d.ooms == 0 for d in result.devices)

    free = replay.replay_source(source, config, **options)
    if any(d.ooms for d in free.devices):
        raise ValueError(f"{source} has OOMs under {config or 'the default config'!r} without a capacity limit")
    hi = -(-max(d.peak_reserved for d in free.devices) // step) + 1  # fits
    lo = max(d.peak_allocated for d in free.devices) // step - 1  # fails, as a rule
    if not fits(hi):
        raise ValueError(
            f"{source}: a device of {hi * step_mb} MiB, above the unlimited replay's peak reserved, "
            "still runs out of memory"
        )
    if lo > 0 and fits(lo):
        lo = 0
    return _boundary(fits, hi, lo) * step_mb


def default_budget(allocator: _C.Allocator, device: int) -> int:
    """Bytes the allocator may reserve on ``device``: the device's free
    memory plus what the allocator reserves now, under its memory fraction
    (:func:`device_limit`)."""
    free, _ = allocator.mem_get_info(device)
    reserved = allocator.stats(device)["reserved_bytes"]["all"]["current"]
    return min(free + reserved, device_limit(allocator, device)[0])


def largest_batch(
    step: Callable[[int], Any],
    budget: int | str | None = None,
    *,
    probes: Sequence[int] = DEFAULT_PROBES,
    steps: int = 2,
    max_batch: int = 1 << 16,
    device: DeviceLike = None,
    allocator: _C.Allocator | None = None,
) -> BatchPlan:
    """The largest batch size at which ``step(batch)`` is predicted to fit
    ``budget`` bytes of this allocator's memory, from a few steps at the
    ``probes`` batch sizes (see the module's docstring for how).

    Args:
        step: runs one training step at the batch size it is given (what
            accelerate's ``find_executable_batch_size`` takes). Called
            ``1 + steps`` times per probe; its return value is dropped.
        budget: bytes the allocator may reserve: an int of bytes, or a
            size string as ``memalloc run --fit`` takes it (``"7GiB"``,
            ``"7.5G"``, ``"512MiB"``, ``"500MB"``: :func:`parse_size`); at
            least 1 MiB and at most what the device can give (its total
            memory, the host backend's capacity, under the memory fraction
            when one is set). Default (None or ``"free"``): the device's
            free memory plus what the allocator reserves now, under the
            memory fraction when one is set.
        probes: small batch sizes to run, at least two different ones (ints >= 1).
        steps: recorded steps per probe after its first. A step whose
            shapes change (sequence lengths) may run the job's shapes, in
            the same order at each probe: ``steps`` = their number; the
            replay repeats the steps after the first in turn.
        max_batch: the largest batch the search considers.
        device: the device (default: the current one).
        allocator: the allocator to plan for (default: the installed one).

    Returns a :class:`BatchPlan` (sizes in bytes); ``print(plan)`` explains
    it. Raises PlannerError (a ValueError) when a probe runs out of memory
    or the arguments are wrong (a budget that is no size, or larger than
    the device, is refused before any probe runs)."""
    if not callable(step):
        raise PlannerError(f"step must be a function of the batch size, not {type(step).__name__}")
    bad = [p for p in probes if isinstance(p, bool) or not isinstance(p, int) or p < 1]
    if bad or len(set(probes)) < 2:
        raise PlannerError(f"probes must be two or more different batch sizes (ints >= 1), not {tuple(probes)!r}")
    check_int("steps", steps, 1, note="recorded steps per probe", error=PlannerError)
    check_int("max_batch", max_batch, max(probes), note="the largest probe", error=PlannerError)
    budget = as_budget(budget)
    a = _state.allocator_or_installed(allocator)
    d = existing_device_index(device, a)
    if budget is None:
        budget = default_budget(a, d)
    else:
        check_budget(a, d, budget)
    hooked = _hooks.subscribed(_hooks.BACKWARD, tags.BACKWARD_FEATURE)
    config = policy_config(a)
    batches = sorted(set(probes))
    records: list[ProbeRecord] = []
    try:
        while True:
            # every probe from this one line: a probe's allocations are named by their Python stacks
            # (this frame's line among them), and matched across probes by those names
            for b in batches[len(records) :]:
                records.append(run_probe(step, b, a, d, steps))
            p = plan(records, budget, config, max_batch=max_batch)
            extra = refinement(p) if len(records) == len(set(probes)) else None
            if extra is None:
                return p
            batches.append(extra)
    finally:
        if not hooked:  # the probes' recording subscribed it: torch.autograd.backward goes back as it was
            _hooks.unsubscribe(_hooks.BACKWARD, tags.BACKWARD_FEATURE)


def refinement(first: BatchPlan) -> int | None:
    """The batch of the one more probe that a plan far above its probes
    takes (then planned again with it): half the first plan's batch, when
    that is more than twice the largest probe; None otherwise. Sizes are
    extrapolated from the two largest probes, and between small batches
    they do not grow as between large ones (cuBLAS and attention pick their
    kernels, and their workspaces, by shape): the H200's bf16 transformer
    of benchmarks/fit/planner_corpus grows 99.3 MiB per sample from batch 4 to
    8, 89.9 from 8 to 16 and 95-97 above; from probes 2, 4 and 8 it planned
    70 on 8 GiB where 80 trains 67 steps, and with one more at 35, 77."""
    half = first.batch // 2
    return half if half > 2 * max(b for b, _, _ in first.probes) else None


def save_records(records: Sequence[ProbeRecord], path: str) -> None:
    """Writes probe records as JSON (for ``memalloc run --fit``'s probes)."""
    with open(path, "w") as f:
        json.dump([r.to_json() for r in records], f)


def load_records(path: str) -> list[ProbeRecord]:
    """Reads what :func:`save_records` wrote."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise PlannerError(f"{path}: not a list of probe records")
    return [ProbeRecord.from_json(d) for d in data]
