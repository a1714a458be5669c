"""The flight recorder: the allocator's event rings in a file that outlives
the process (layout and reader: memalloc/trace/flight_files.py).

``MEMALLOC_CONF=flight_recorder:DIR`` (or :func:`start`) makes one file per
process in DIR, ``memalloc-<host>-<pid>-<start ns>.flight``, and points every
device's event ring into it: from then on the C++ core writes each record
there as it happens (csrc/profiler/recorder.h: no allocation, lock or system
call more than recording into memory). At each step boundary
(``memalloc.step()``; until the code calls it, ``optimizer.step()``: the
recorder watches steps as ``leak_check`` does) this
module appends the stacks and tags interned since the last step, updates the
heartbeat (time and step) and writes a checkpoint (counters per device, the
breakdown, and the top call sites of live memory, named again as often as
0.5% of the run's time allows), so the file stays useful after the ring has
wrapped. A clean exit removes the file, unless
``flight_recorder_keep:True`` (then it is marked exited); an uncaught
exception leaves it marked raised; SIGKILL, a segfault or an abort leave
it as it was, for ``python -m memalloc postmortem DIR``.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import struct
import sys
import threading
import time

from memalloc import _C
from memalloc.core import _state, iteration
from memalloc.core._checks import check_int
from memalloc.features.oom import top_holders
from memalloc.trace import flight_files as ff
from memalloc.trace import recording, sites

DEFAULT_RECORDS = 65_536  # per device: 4.5 MiB of ring with its sequence numbers
STACKS_BYTES = 8 << 20
CHECKPOINT_BYTES = 256 << 10
HISTORY_BYTES = 4 << 20  # 43,690 rows of 96 bytes: steps x devices
# The top call sites walk every live block (~0.5 ms per 1,000 on the host): a
# checkpoint names them again once this many times their last cost has passed
# (at most 0.5% of the run's time: every step for a small process, every few
# steps for a model of hundreds of tensors with 30 ms steps); counters, the
# breakdown and the history row are written at every step (~0.05 ms with 600
# live blocks). The start's checkpoint (before the program has allocated)
# names none, so the first step's always does, whatever the walk costs.
TOP_COST_SHARE = 200


class FlightRecorder:
    """One process's flight recorder file, written while the process runs
    (sizes in bytes). Made by :func:`start`."""

    def __init__(self, allocator: _C.Allocator, directory: str, records: int, keep: bool) -> None:
        self.allocator = allocator
        self.keep = keep
        self.records = records
        n = allocator.device_count
        stride = records * (ff.RECORD_BYTES + ff.SEQ_BYTES)
        stride += -stride % 4096
        ring_offset = ff.HEADER_BYTES
        stacks_offset = ring_offset + n * stride
        cp_offset = stacks_offset + STACKS_BYTES
        history_offset = cp_offset + CHECKPOINT_BYTES
        file_bytes = history_offset + HISTORY_BYTES
        start_ns = time.time_ns()
        host = socket.gethostname()
        name = f"memalloc-{host}-{os.getpid()}-{start_ns}{ff.SUFFIX}"
        os.makedirs(directory, exist_ok=True)
        self.map = _C.FlightMap(os.path.join(os.path.abspath(directory), name), file_bytes)
        self.path = self.map.path
        self.buf = self.map.buffer()
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        ff.HEADER.pack_into(
            self.buf,
            0,
            ff.MAGIC,
            ff.VERSION,
            ff.HEADER_BYTES,
            file_bytes,
            os.getpid(),
            start_ns,
            rank,
            world,
            n,
            ff.RECORD_BYTES,
            ring_offset,
            records,
            stride,
            stacks_offset,
            STACKS_BYTES,
            cp_offset,
            CHECKPOINT_BYTES,
            history_offset,
            HISTORY_BYTES,
        )
        self.buf[ff.HOST_AT : ff.HOST_AT + len(host.encode()[: ff.HOST_BYTES])] = host.encode()[: ff.HOST_BYTES]
        backend = allocator.backend_name.encode()[: ff.BACKEND_BYTES]
        self.buf[ff.BACKEND_AT : ff.BACKEND_AT + len(backend)] = backend
        meta = json.dumps(
            {
                "config": _state.installed_config() if _C.installed() is allocator else "",
                "argv": list(sys.argv),
                "local_rank": os.environ.get("LOCAL_RANK"),
            }
        ).encode()
        meta = meta[: ff.HEADER_BYTES - ff.META_AT - 4]
        struct.pack_into("<I", self.buf, ff.META_AT, len(meta))
        self.buf[ff.META_AT + 4 : ff.META_AT + 4 + len(meta)] = meta
        self._stacks_at = stacks_offset
        self._stacks_used = 0
        self._stacks_written = 0  # stack ids 1..this are in the file
        self._tags_written = 0
        self._checkpoints = 0
        self._cp_offset = cp_offset
        self._history_at = history_offset
        self._history_rows = 0
        self._top: dict[int, list] = {d: [] for d in range(self.allocator.device_count)}
        self._top_at = (-1, 0, 0)  # (step, monotonic ns, cost ns) of the last top call sites; step -1: none yet
        self._lock = threading.Lock()
        self._ring_at = (ring_offset, stride)
        self.attach()
        self._append_live()
        self.heartbeat(0, name_lines=False)

    def _append_live(self) -> None:
        """The blocks live now, which the rings (just attached) never saw
        allocated: a recorder started after the model was built (the
        framework callbacks') still counts its parameters at the peak."""
        for d in range(self.allocator.device_count):
            blocks = [[addr, size, stack_id] for addr, size, _, stack_id, _, _ in sites.live_blocks(d, self.allocator)]
            if blocks:
                self._append({"live": d, "blocks": blocks})

    def attach(self) -> None:
        """Points every device's event ring into the file (the constructor
        does; after :meth:`detach`, the rings start again from empty). While
        attached, the file owns the rings: memalloc.record_history
        borrows them and gives them back (recording.set_ring_owner)."""
        for d in range(self.allocator.device_count):
            self._attach_device(d)
        recording.set_ring_owner(self.allocator, self._attach_device)

    def _attach_device(self, device: int) -> None:
        ring_offset, stride = self._ring_at
        self.allocator.record_to_file(self.map, ring_offset + device * stride, self.records, device=device)
        if _C.stack_mode() == 0:
            _C.set_stack_mode(2)  # the file names lines (call_sites:False leaves them off otherwise)

    def detach(self) -> None:
        """Stops recording into the file (the rings go off; the file stays
        as it is, for :meth:`attach` or :meth:`close`)."""
        recording.set_ring_owner(self.allocator, None)
        for d in range(self.allocator.device_count):
            self.allocator.set_recording(0, device=d)

    # ---- at each step (under the GIL, not on the malloc path) ----------------
    def heartbeat(self, step: int, name_lines: bool = True) -> None:
        """New stacks and tags, the heartbeat and a checkpoint, for ``step``
        (``name_lines`` False: the checkpoint keeps the top call sites it has)."""
        with self._lock:
            self._append_interned()
            self._write_checkpoint(step, name_lines)
            self._write_heartbeat(step, ff.RUNNING)

    def sync(self) -> None:
        """Writes the stacks and tags interned since the last step, and the
        heartbeat that says how far they go: a reader of the file now
        (``run``'s sites.json and run page) names every record's stack."""
        with self._lock:
            self._append_interned()
            self._write_heartbeat(_C.step(), ff.RUNNING)

    def _write_heartbeat(self, step: int, state: int) -> None:
        ff.HEARTBEAT.pack_into(
            self.buf, ff.HEARTBEAT_AT, time.time_ns(), step, state, 0, self._stacks_used, self._history_rows
        )

    def _append(self, entry: dict) -> bool:
        data = json.dumps(entry, separators=(",", ":")).encode()
        if self._stacks_used + 4 + len(data) > STACKS_BYTES:
            return False  # region full: later stacks stay unnamed in the file
        at = self._stacks_at + self._stacks_used
        struct.pack_into("<I", self.buf, at, len(data))
        self.buf[at + 4 : at + 4 + len(data)] = data
        self._stacks_used += 4 + len(data)
        return True

    def _append_interned(self) -> None:
        for sid in range(self._stacks_written + 1, _C.stack_count() + 1):
            frames = [[f.filename, f.line, f.name] for f in recording.stack(sid)]
            if not self._append({"stack": sid, "frames": frames}):
                break
            self._stacks_written = sid
        names = _C.tag_names()
        for tid in range(max(1, self._tags_written + 1), len(names)):
            if not self._append({"tag": tid, "name": names[tid]}):
                break
            self._tags_written = tid

    def _write_checkpoint(self, step: int, name_lines: bool = True) -> None:
        started = time.monotonic_ns()
        if name_lines and (self._top_at[0] < 0 or started - self._top_at[1] >= TOP_COST_SHARE * self._top_at[2]):
            self._top = {d: top_holders(d, 10, allocator=self.allocator) for d in range(self.allocator.device_count)}
            self._top_at = (step, started, time.monotonic_ns() - started)
        devices = []
        for d in range(self.allocator.device_count):
            s = self.allocator.stats(d)
            devices.append(
                {
                    "device": d,
                    "allocated": s["allocated_bytes"]["all"]["current"],
                    "reserved": s["reserved_bytes"]["all"]["current"],
                    "peak_allocated": s["allocated_bytes"]["all"]["peak"],
                    "peak_reserved": s["reserved_bytes"]["all"]["peak"],
                    "top": self._top[d],
                    "top_step": self._top_at[0],
                    "breakdown": self.allocator.breakdown(d)["last"],
                }
            )
        now = time.time_ns()
        for dev in devices:
            # the step's row: its peak (the breakdown's last finished window) and the counters at its end
            last = dev["breakdown"] or {"split": {}, "total": dev["allocated"]}
            if (self._history_rows + 1) * ff.HISTORY_ROW.size <= HISTORY_BYTES:
                ff.HISTORY_ROW.pack_into(
                    self.buf,
                    self._history_at + self._history_rows * ff.HISTORY_ROW.size,
                    step,
                    now,
                    dev["device"],
                    0,
                    last["total"],
                    dev["allocated"],
                    dev["reserved"],
                    *(last["split"].get(c, 0) for c in ff.CATEGORIES),
                )
                self._history_rows += 1
        data = json.dumps({"step": step, "time_ns": now, "devices": devices}, default=str).encode()
        half = CHECKPOINT_BYTES // 2
        if len(data) > half - ff.SLOT_HEAD.size:
            return
        self._checkpoints += 1
        at = self._cp_offset + (self._checkpoints % 2) * half
        ff.SLOT_HEAD.pack_into(self.buf, at, 0, 0)  # being written
        self.buf[at + ff.SLOT_HEAD.size : at + ff.SLOT_HEAD.size + len(data)] = data
        ff.SLOT_HEAD.pack_into(self.buf, at, self._checkpoints, len(data))

    # ---- the end ---------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        """The end: the rings go back to memory; a clean end removes the
        file unless ``keep``, an end on an uncaught exception (``clean``
        False) leaves it, marked so."""
        with self._lock:
            if self.keep or not clean:
                # (the last step's checkpoint stays: by now the program's objects may be gone)
                self._append_interned()
                self._write_heartbeat(_C.step(), ff.EXITED if clean else ff.RAISED)
            self.detach()
            if clean and not self.keep:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


_recorder: FlightRecorder | None = None


def start(
    directory: str, *, records: int = DEFAULT_RECORDS, keep: bool = False, allocator: _C.Allocator | None = None
) -> FlightRecorder:
    """Starts the flight recorder of this process in ``directory`` (made if
    missing): every device's event ring of ``allocator`` (default: the
    installed one) moves into the file, ``records`` 64-byte records per
    device. ``keep``: leave the file at a clean exit too. One per process."""
    global _recorder
    check_int("records", records, 1, _C.max_trace_records(), note="per device")
    if _recorder is not None:
        raise RuntimeError(f"the flight recorder is already writing {_recorder.path}: one per process")
    a = _state.allocator_or_installed(allocator)
    _recorder = FlightRecorder(a, os.fspath(directory), records, keep)
    # A watcher of steps (as leak_check and StepTracker are): until the code
    # calls memalloc.step(), optimizer.step() marks the boundaries, so a
    # training loop that never names its steps still gets a heartbeat, a
    # checkpoint and its holding lines at every step.
    iteration.want_boundaries()
    iteration.add_step_listener(_on_step)
    atexit.unregister(stop)  # once, however often the recorder was started
    atexit.register(stop)
    return _recorder


def stop(clean: bool | None = None) -> None:
    """Ends the flight recorder: cleanly (the file is removed unless kept),
    or with ``clean=False`` after a failure (the file stays, marked raised).
    At interpreter exit (None), the end is clean unless an uncaught
    exception ended the program (Python then sets ``sys.last_value``)."""
    global _recorder
    r, _recorder = _recorder, None
    if r is None:
        return
    if clean is None:
        clean = getattr(sys, "last_value", None) is None
    iteration.remove_step_listener(_on_step)
    iteration.release_boundaries()
    r.close(clean)


def current() -> FlightRecorder | None:
    """The running flight recorder, or None."""
    return _recorder


def _on_step(step: int) -> None:
    r = _recorder
    if r is not None:
        r.heartbeat(step)


__all__ = ["DEFAULT_RECORDS", "FlightRecorder", "current", "start", "stop"]
