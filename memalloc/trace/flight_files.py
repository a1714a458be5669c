"""The flight recorder's file: its layout, and reading it back after the
process that wrote it is gone (or while it runs).

One file per process, ``memalloc-<host>-<pid>-<start ns>.flight``, written
by memalloc/features/flight.py: the process's event rings live in it (the
C++ core writes each record there, csrc/profiler/recorder.h), and at every
``memalloc.step()`` the writer adds the stacks and tags interned since the
last step, a heartbeat and a checkpoint of the counters. A ``MAP_SHARED``
file sits in the kernel's page cache, so SIGKILL, a segfault or an abort of
the writer leave it whole (a host crash or power loss does not).

Layout (version 1, little-endian; offsets in bytes)::

    0     header (HEADER, 4096 bytes): magic, version, what wrote it (pid,
          host, rank, world size, backend, config as JSON), where the regions are
    128   heartbeat (HEARTBEAT): unix time (ns) and step of the last
          memalloc.step(), state (RUNNING / EXITED / RAISED), bytes used of the
          stacks region
    4096  rings, one per device: ``capacity`` 64-byte records, then their
          8-byte sequence numbers (0: being written; else the record's
          1-based position in the device's stream)
    ...   stacks: appended entries, each a 4-byte length then JSON
          ({"stack": id, "frames": [[file, line, function], ...]} or
          {"tag": id, "name": ...}, or {"live": device, "blocks": [[address,
          bytes, stack id], ...]}: the blocks live when the recorder started,
          which the ring never saw allocated); the heartbeat's
          ``stacks_used`` says how far they are complete
    ...   checkpoint: two slots of ``checkpoint_bytes / 2``, each an 8-byte
          sequence number (0 while written), a 4-byte length, then JSON
          (step, counters per device, top holders, breakdown); the valid
          slot with the higher number is the last checkpoint
    ...   history: a HISTORY_ROW per step and device (the step's peak
          allocated, allocated and reserved at its end, the peak's split by
          category), appended until the region is full; the heartbeat's
          ``history_rows`` says how many are complete

A record is read as committed when its sequence number reads the same,
non-zero, before and after the record (a torn one, written when the process
died, has 0), and a ring's records are the committed ones in sequence order.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import mmap
import os
import struct
from collections.abc import Sequence
from typing import Any, Union

from memalloc.core._usercode import is_internal
from memalloc.trace.recording import RECORD_FORMAT, Event, decode_records

PathLike = Union[str, "os.PathLike[str]"]

MAGIC = b"MEMAFLT\x00"
VERSION = 1
SUFFIX = ".flight"
HEADER_BYTES = 4096
RECORD_BYTES = struct.calcsize(RECORD_FORMAT)  # 64
SEQ_BYTES = 8
# magic, version, header bytes, file bytes, pid, start (unix ns), rank, world size,
# rings, record bytes, ring offset, ring capacity (records), ring stride (bytes),
# stacks offset, stacks bytes, checkpoint offset, checkpoint bytes, history offset, history bytes
HEADER = struct.Struct("<8sIIQqqiiIIQQQQQQQQQ")
HEARTBEAT_AT = 128
# heartbeat unix ns, step, state, (pad), stacks bytes used, history rows written
HEARTBEAT = struct.Struct("<qqIIQQ")
HOST_AT, HOST_BYTES = 256, 64
BACKEND_AT, BACKEND_BYTES = 320, 16
META_AT = 336  # 4-byte length, then JSON, up to the header's end
RUNNING, EXITED, RAISED = (
    0,
    1,
    2,
)  # the writer's state: running (or ended otherwise), exited cleanly, exited on an uncaught exception
SLOT_HEAD = struct.Struct("<QI")
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
# one row per step and device: step, unix ns, device, (pad), the step's peak allocated, allocated and
# reserved at its end, then the split of the peak by CATEGORIES
HISTORY_ROW = struct.Struct("<qqIIQQQ6Q")


class FlightFileError(ValueError):
    """A file that is not a readable flight recorder file (its path and why)."""


@dataclasses.dataclass
class FlightFile:
    """One process's flight recorder file, read back (sizes in bytes)."""

    path: str
    pid: int
    host: str
    rank: int
    world_size: int
    backend: str
    start_ns: int
    meta: dict
    state: str  # "running" (no exit seen: alive, or killed), "exited" or "raised" (an uncaught exception)
    heartbeat_ns: int  # unix ns of the last memalloc.step() (0: none yet)
    step: int  # memalloc.step() count at the last heartbeat
    rings: list[list[Event]]  # per device, the committed records, oldest first
    raw: list[bytes]  # per device, those records as the 64-byte wire format (recording.RECORD_FORMAT)
    sequences: list[list[int]]  # per device, their sequence numbers (1-based positions)
    torn: list[int]  # per device, records whose sequence number was 0 or changed while read
    stacks: dict[int, list[list]]  # stack id -> [[file, line, function], ...] innermost first
    tags: dict[int, str]
    checkpoint: dict | None
    history: list[dict]  # per step and device: step, time_ns, device, peak_allocated, allocated, reserved, split
    # per device, the blocks live when the recorder started: address -> (bytes, stack id)
    live_at_start: dict[int, dict[int, tuple[int, int]]] = dataclasses.field(default_factory=dict)
    missing: int = 0  # bytes cut off the file's end (0: whole); what lies before the cut is read

    def user_frame(self, stack_id: int) -> tuple | None:
        """(file, line, function) of the innermost user-code frame of an
        interned stack, from the file's own stacks; None when there is none."""
        return next((tuple(fr) for fr in self.stacks.get(stack_id, []) if not is_internal(fr[0])), None)

    def site(self, stack_id: int) -> tuple:
        """The line an event is counted at (:func:`site_of` of its stack)."""
        return site_of(self.stacks.get(stack_id, []))


def site_of(frames: Sequence[Sequence]) -> tuple:
    """The line a stack (frames innermost first, each (file, line, function))
    is counted at, the one rule of the postmortem, the job report and diff:
    the innermost user-code frame, else the innermost frame (all of it
    library code), else ("<no stack>", 0, "") for a record without one."""
    tuples = [tuple(f) for f in frames]
    return next((t for t in tuples if not is_internal(t[0])), tuples[0] if tuples else ("<no stack>", 0, ""))


def replay(live: dict[int, Event], e: Event) -> Event | None:
    """Replays one event of a ring onto ``live`` (address -> the alloc event
    of every block the ring saw allocated and not yet freed): an alloc adds
    its block, a free_requested removes it. Returns the alloc event of the
    block it ended, else None. The one replay of a ring's blocks, for the
    postmortem's live sites, the job report's leaks and the snapshot."""
    if e.action == "alloc":
        live[e.addr] = e
    elif e.action == "free_requested":
        return live.pop(e.addr, None)
    return None


def live_at_end(
    ring: list[Event], start: dict[int, tuple[int, int]] | None = None, device: int = 0
) -> dict[int, Event]:
    """The blocks live after a ring's last record (address -> their alloc
    events): those it saw allocated and not freed, and of ``start`` (the
    blocks live when the recorder started, address -> (bytes, stack id):
    :attr:`FlightFile.live_at_start`) those it did not free, as alloc events
    of step 0 on ``device``. Blocks older than the ring and not in ``start``
    are unknown."""
    live: dict[int, Event] = {
        addr: Event(0, "alloc", device, 0, addr, size, size, stack_id, "", 0, 0, "")
        for addr, (size, stack_id) in (start or {}).items()
    }
    for e in ring:
        replay(live, e)
    return live


def peak_live(start: dict[int, tuple[int, Any]], events: Sequence[tuple]) -> tuple[int, dict[Any, int], int]:
    """(live bytes at the peak, bytes by key then, index of the event that
    made the peak, -1 for the start) replaying ``events`` (action, address,
    bytes, key: a call site for diff, a stack id for the run page) over
    ``start`` (address -> (bytes, key) of the blocks live before them). The
    one replay to a peak; :func:`replay` is the one of a ring's blocks."""
    live = dict(start)
    total = sum(s for s, _ in live.values())
    best, best_at = total, -1
    for i, (action, addr, size, site) in enumerate(events):
        if action == "alloc":
            old = live.get(addr)
            total += size - (old[0] if old else 0)
            live[addr] = (size, site)
        else:
            old = live.pop(addr, None)
            total -= old[0] if old else 0
        if total > best:
            best, best_at = total, i
    live = dict(start)  # again, to the peak's event
    for action, addr, size, site in events[: best_at + 1]:
        if action == "alloc":
            live[addr] = (size, site)
        else:
            live.pop(addr, None)
    by_site: dict[Any, int] = collections.defaultdict(int)
    for size, site in live.values():
        by_site[site] += size
    return best, dict(by_site), best_at


def read(path: PathLike) -> FlightFile:
    """Reads one flight recorder file (FlightFileError naming the file and
    the problem when it is not one or is of another format version). A file
    cut short keeps what lies before the cut: the records whose slot and
    sequence number are whole, the stacks, checkpoint and history rows
    before it; ``missing`` says how many bytes were cut."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:
                raise FlightFileError(f"{path}: not a memalloc flight recorder file ({size} bytes, no header)")
            # mapped, not copied: a live writer's records are checked as they are read
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(path, data)
    except OSError as e:
        raise FlightFileError(f"{path}: cannot read it: {e.strerror}") from None


def opened(source: PathLike | FlightFile) -> FlightFile:
    """``source`` itself when it is a flight file already read, else
    read(source): for readers that take either (the run page, diff), so a
    file read once is not read again."""
    return source if isinstance(source, FlightFile) else read(source)


def _parse(path: str, data) -> FlightFile:
    if data[:8] != MAGIC:
        raise FlightFileError(f"{path}: not a memalloc flight recorder file (no {MAGIC[:7].decode()} header)")
    (
        _,
        version,
        header_bytes,
        file_bytes,
        pid,
        start_ns,
        rank,
        world,
        n_rings,
        record_bytes,
        ring_offset,
        capacity,
        stride,
        stacks_offset,
        stacks_bytes,
        cp_offset,
        cp_bytes,
        history_offset,
        history_bytes,
    ) = HEADER.unpack_from(data, 0)
    if version != VERSION:
        raise FlightFileError(
            f"{path}: flight recorder format version {version}; this memalloc reads version "
            f"{VERSION} (read it with the memalloc that wrote it)"
        )
    # A file cut short (a full disk, a copy that stopped): what lies before
    # the cut is read, every region clipped to it; what lies after is lost.
    missing = max(0, file_bytes - len(data))
    if record_bytes != RECORD_BYTES or header_bytes != HEADER_BYTES:
        raise FlightFileError(
            f"{path}: records of {record_bytes} bytes, header of {header_bytes}: not version {VERSION}'s layout"
        )
    hb_ns, step, state, _, stacks_used, history_rows = HEARTBEAT.unpack_from(data, HEARTBEAT_AT)
    host = data[HOST_AT : HOST_AT + HOST_BYTES].rstrip(b"\0").decode("utf-8", "replace")
    backend = data[BACKEND_AT : BACKEND_AT + BACKEND_BYTES].rstrip(b"\0").decode("utf-8", "replace")
    (meta_len,) = struct.unpack_from("<I", data, META_AT)
    meta = json.loads(data[META_AT + 4 : META_AT + 4 + meta_len] or b"{}")
    stacks, tags, live = _interned(bytes(data[stacks_offset : stacks_offset + min(stacks_used, stacks_bytes)]))
    tag_names = [f"<tag {i}>" for i in range(max(tags, default=0) + 1)]
    tag_names[0] = ""
    for i, name in tags.items():
        tag_names[i] = name
    rings, raws, sequences, torn = [], [], [], []
    for r in range(n_rings):
        raw, seqs, bad = _ring(data, ring_offset + r * stride, capacity)
        rings.append(decode_records(raw, tag_names))
        raws.append(raw)
        sequences.append(seqs)
        torn.append(bad)
    return FlightFile(
        path=path,
        pid=pid,
        host=host,
        rank=rank,
        world_size=world,
        backend=backend,
        start_ns=start_ns,
        meta=meta,
        state={EXITED: "exited", RAISED: "raised"}.get(state, "running"),
        heartbeat_ns=hb_ns,
        step=step,
        rings=rings,
        raw=raws,
        sequences=sequences,
        torn=torn,
        stacks=stacks,
        tags=tags,
        live_at_start=live,
        checkpoint=_checkpoint(data, cp_offset, cp_bytes),
        history=_history(data, history_offset, min(history_rows, history_bytes // HISTORY_ROW.size)),
        missing=missing,
    )


def _ring(data, offset: int, capacity: int) -> tuple[bytes, list[int], int]:
    """A ring's committed records in sequence order (raw), their numbers, and how
    many slots hold a torn record (written in part when the writer died, or
    being written while a live writer is read). A slot's record counts when
    its number, read before and after the record, is the same, not 0, and
    the slot's own (position - 1 modulo capacity)."""
    seq_at = offset + capacity * RECORD_BYTES
    slots = []
    empty_written = 0
    for i in range(capacity):
        if seq_at + (i + 1) * SEQ_BYTES > len(data):  # cut off: the slot's number is lost, so is its record
            break
        (seq,) = struct.unpack_from("<Q", data, seq_at + i * SEQ_BYTES)
        raw = bytes(data[offset + i * RECORD_BYTES : offset + (i + 1) * RECORD_BYTES])
        (again,) = struct.unpack_from("<Q", data, seq_at + i * SEQ_BYTES)
        if seq == 0 or again != seq or (seq - 1) % capacity != i:
            empty_written += seq != 0 or again != 0 or any(raw)
            continue
        slots.append((seq, raw))
    slots.sort()
    return b"".join(raw for _, raw in slots), [s for s, _ in slots], empty_written


def _interned(
    region: bytes,
) -> tuple[dict[int, list[list]], dict[int, str], dict[int, dict[int, tuple[int, int]]]]:
    """The stacks region's entries: stacks, tags, the blocks live at the
    start per device (an entry of a kind this reader does not know is skipped)."""
    stacks: dict[int, list[list]] = {}
    tags: dict[int, str] = {}
    live: dict[int, dict[int, tuple[int, int]]] = {}
    at = 0
    while at + 4 <= len(region):
        (n,) = struct.unpack_from("<I", region, at)
        if n == 0 or at + 4 + n > len(region):
            break
        entry = json.loads(region[at + 4 : at + 4 + n])
        if "stack" in entry:
            stacks[int(entry["stack"])] = entry["frames"]
        elif "tag" in entry:
            tags[int(entry["tag"])] = entry["name"]
        elif "live" in entry:
            live.setdefault(int(entry["live"]), {}).update((a, (b, sid)) for a, b, sid in entry["blocks"])
        at += 4 + n
    return stacks, tags, live


def _checkpoint(data: bytes, offset: int, nbytes: int) -> dict | None:
    best: tuple[int, dict | None] = (0, None)
    half = nbytes // 2
    for slot in (0, 1):
        at = offset + slot * half
        if at + SLOT_HEAD.size > len(data):  # cut off
            continue
        seq, n = SLOT_HEAD.unpack_from(data, at)
        if seq == 0 or n > half - SLOT_HEAD.size or seq <= best[0] or at + SLOT_HEAD.size + n > len(data):
            continue
        try:
            best = (seq, json.loads(data[at + SLOT_HEAD.size : at + SLOT_HEAD.size + n]))
        except ValueError:
            continue
    return best[1]


def _history(data, offset: int, rows: int) -> list[dict]:
    out = []
    rows = max(0, min(rows, (len(data) - offset) // HISTORY_ROW.size))  # those before a cut
    for i in range(rows):
        step, t, device, _, peak, allocated, reserved, *split = HISTORY_ROW.unpack_from(
            data, offset + i * HISTORY_ROW.size
        )
        out.append(
            {
                "step": step,
                "time_ns": t,
                "device": device,
                "peak_allocated": peak,
                "allocated": allocated,
                "reserved": reserved,
                "split": dict(zip(CATEGORIES, split)),
            }
        )
    return out


def files_in(directory: PathLike) -> list[str]:
    """The flight recorder files of ``directory``, by name: its own, or,
    for the ``--out`` folder of ``python -m memalloc run``, those of its
    ``flight`` folder. The one way ``report``, ``postmortem`` and ``top``
    find a job's files. FlightFileError when it is not a directory or holds
    none, saying why none may be there and naming the leak reports found
    under it (``python -m memalloc report`` renders those)."""
    given = os.fspath(directory)
    if not os.path.isdir(given):
        raise FlightFileError(f"{given}: not a directory (give the flight_recorder:DIR directory)")
    found = _flight_names(given)
    sub = os.path.join(given, "flight")
    if not found and os.path.isdir(sub):
        found = _flight_names(sub)
    if not found:
        raise FlightFileError(_none_found(given, sub if os.path.isdir(sub) else given))
    return found


def _flight_names(directory: str) -> list[str]:
    try:
        return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(SUFFIX))
    except OSError:
        return []


def _none_found(given: str, directory: str) -> str:
    """Why ``directory`` (from the argument ``given``) holds no flight files,
    as far as can be known, and the leak reports under ``given``."""
    where = f"{given} (nor {directory})" if directory != given else given
    text = (
        f"{where}: no flight recorder files (*{SUFFIX}). `python -m memalloc run` removes a process's file "
        "when the script ends cleanly in a single process (a job of several ranks keeps them, as does "
        "--config flight_recorder_keep:True), writes none with --no-flight-recorder, and keeps one after "
        "an exception, a kill or a crash; outside `memalloc run`, MEMALLOC_CONF=flight_recorder:DIR "
        "writes them in DIR"
    )
    reports = sorted(os.path.join(root, n) for root, _, names in os.walk(given) for n in names if n == "leaks.json")
    if reports:
        text += (
            "; the leak report"
            + ("s" * (len(reports) > 1))
            + " here: "
            + ", ".join(f"python -m memalloc report {r}" for r in reports[:8])
        )
    return text


__all__ = [
    "CATEGORIES",
    "HISTORY_ROW",
    "EXITED",
    "RAISED",
    "FlightFile",
    "FlightFileError",
    "HEADER",
    "HEADER_BYTES",
    "HEARTBEAT",
    "HEARTBEAT_AT",
    "MAGIC",
    "RECORD_BYTES",
    "RUNNING",
    "SEQ_BYTES",
    "SUFFIX",
    "VERSION",
    "files_in",
    "live_at_end",
    "read",
    "replay",
]
