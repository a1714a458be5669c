"""``python -m benchmarks driver-costs --out FILE`` (GPU): what each CUDA
driver call of virtual memory costs, the calls memalloc's and native's
expandable segments make to grow (issue 38): cuMemCreate, cuMemMap,
cuMemSetAccess, cuMemUnmap and cuMemRelease, per handle, for 1 GiB in 2 MiB
handles (memalloc's page below 256 MiB) and in 20 MiB handles (native's
large-pool page), with handles exportable as POSIX descriptors (as both
create them, for CUDA IPC) and not, and cuMemCreate from 1, 4 and 8 threads
at once (whether the driver creates handles in parallel); one 1 GiB handle
mapped as many small mappings at offsets (whether create and set-access
cost per handle or per mapping); kernel launches on one thread while
another maps pages (whether mapping could run off the training thread).

The driver is called through ctypes on torch's primary context, so this
measures the driver alone: no allocator is involved. Each figure is the
median over --repeats rounds of the whole 1 GiB.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import threading
import time

GiB = 1 << 30
MiB = 1 << 20
POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
PROT_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


class Driver:
    def __init__(self, device: int) -> None:
        import torch

        torch.cuda.init()
        torch.zeros(1, device=f"cuda:{device}")  # the primary context, current on this thread
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.ctx = ctypes.c_void_p()
        self.call("cuCtxGetCurrent", ctypes.byref(self.ctx))
        self.device = device

    def call(self, name: str, *args) -> None:
        r = getattr(self.lib, name)(*args)
        if r != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(r, ctypes.byref(text))
            raise RuntimeError(f"{name} returned CUDA error {r} ({(text.value or b'?').decode()})")

    def prop(self, exportable: bool) -> Prop:
        p = Prop()
        p.type = PINNED
        p.location = Location(LOCATION_DEVICE, self.device)
        p.requestedHandleTypes = POSIX_FD if exportable else 0
        return p

    def create(self, n: int, size: int, exportable: bool) -> list[int]:
        prop = self.prop(exportable)
        out = []
        for _ in range(n):
            h = ctypes.c_ulonglong()
            self.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
            out.append(h.value)
        return out


def round_of(d: Driver, size: int, exportable: bool) -> dict:
    """One round: 1 GiB in handles of `size` bytes, each call timed."""
    n = GiB // size
    base = ctypes.c_ulonglong()
    d.call(
        "cuMemAddressReserve",
        ctypes.byref(base),
        ctypes.c_size_t(GiB),
        ctypes.c_size_t(0),
        ctypes.c_ulonglong(0),
        ctypes.c_ulonglong(0),
    )
    t0 = time.perf_counter()
    handles = d.create(n, size, exportable)
    t1 = time.perf_counter()
    for i, h in enumerate(handles):
        d.call(
            "cuMemMap",
            ctypes.c_ulonglong(base.value + i * size),
            ctypes.c_size_t(size),
            ctypes.c_size_t(0),
            ctypes.c_ulonglong(h),
            ctypes.c_ulonglong(0),
        )
    t2 = time.perf_counter()
    # Access per handle, as a growing segment grants it to the pages it
    # has just mapped (one call for the whole 1 GiB failed with
    # CUDA_ERROR_INVALID_VALUE through ctypes on the H100 of 2026-12-05).
    access = Access(Location(LOCATION_DEVICE, d.device), PROT_READWRITE)
    for i in range(n):
        d.call(
            "cuMemSetAccess",
            ctypes.c_ulonglong(base.value + i * size),
            ctypes.c_size_t(size),
            ctypes.byref(access),
            ctypes.c_size_t(1),
        )
    t3 = time.perf_counter()
    for i in range(n):
        d.call("cuMemUnmap", ctypes.c_ulonglong(base.value + i * size), ctypes.c_size_t(size))
    t4 = time.perf_counter()
    for h in handles:
        d.call("cuMemRelease", ctypes.c_ulonglong(h))
    t5 = time.perf_counter()
    d.call("cuMemAddressFree", ctypes.c_ulonglong(base.value), ctypes.c_size_t(GiB))
    us = 1e6 / n
    return {
        "create_us": (t1 - t0) * us,
        "map_us": (t2 - t1) * us,
        "set_access_us": (t3 - t2) * us,
        "unmap_us": (t4 - t3) * us,
        "release_us": (t5 - t4) * us,
        "grow_ms": (t3 - t0) * 1e3,
    }


def pieces_round(d: Driver, piece: int) -> dict:
    """One round: ONE exportable handle of 1 GiB mapped as 1 GiB / `piece`
    separate mappings at offsets 0, piece, 2 x piece, ... (cuMemMap's
    offset: older drivers took only 0), access granted per mapping, then
    one piece moved to another reservation (unmapped and mapped there at
    its offset) and everything unmapped per piece. Whether the driver's
    per-handle costs (create, set-access) are per handle or per mapping
    decides whether large physical allocations can be mapped and moved in
    small pages (issue 38)."""
    n = GiB // piece
    base, other = ctypes.c_ulonglong(), ctypes.c_ulonglong()
    for b, size in ((base, GiB), (other, piece)):
        d.call("cuMemAddressReserve", ctypes.byref(b), ctypes.c_size_t(size), ctypes.c_size_t(0),
               ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))  # fmt: skip
    access = Access(Location(LOCATION_DEVICE, d.device), PROT_READWRITE)
    t0 = time.perf_counter()
    (h,) = d.create(1, GiB, True)
    t1 = time.perf_counter()
    for i in range(n):
        d.call("cuMemMap", ctypes.c_ulonglong(base.value + i * piece), ctypes.c_size_t(piece),
               ctypes.c_size_t(i * piece), ctypes.c_ulonglong(h), ctypes.c_ulonglong(0))  # fmt: skip
    t2 = time.perf_counter()
    for i in range(n):
        d.call("cuMemSetAccess", ctypes.c_ulonglong(base.value + i * piece), ctypes.c_size_t(piece),
               ctypes.byref(access), ctypes.c_size_t(1))  # fmt: skip
    t3 = time.perf_counter()
    last = base.value + (n - 1) * piece  # the last piece moves to `other`
    d.call("cuMemUnmap", ctypes.c_ulonglong(last), ctypes.c_size_t(piece))
    d.call("cuMemMap", ctypes.c_ulonglong(other.value), ctypes.c_size_t(piece), ctypes.c_size_t((n - 1) * piece),
           ctypes.c_ulonglong(h), ctypes.c_ulonglong(0))  # fmt: skip
    d.call("cuMemSetAccess", ctypes.c_ulonglong(other.value), ctypes.c_size_t(piece), ctypes.byref(access),
           ctypes.c_size_t(1))  # fmt: skip
    t4 = time.perf_counter()
    for i in range(n - 1):
        d.call("cuMemUnmap", ctypes.c_ulonglong(base.value + i * piece), ctypes.c_size_t(piece))
    d.call("cuMemUnmap", ctypes.c_ulonglong(other.value), ctypes.c_size_t(piece))
    t5 = time.perf_counter()
    d.call("cuMemRelease", ctypes.c_ulonglong(h))
    t6 = time.perf_counter()
    for b, size in ((base, GiB), (other, piece)):
        d.call("cuMemAddressFree", ctypes.c_ulonglong(b.value), ctypes.c_size_t(size))
    us = 1e6 / n
    return {
        "create_ms": (t1 - t0) * 1e3,
        "map_us": (t2 - t1) * us,
        "set_access_us": (t3 - t2) * us,
        "move_one_us": (t4 - t3) * 1e6,
        "unmap_us": (t5 - t4) * us,
        "release_ms": (t6 - t5) * 1e3,
        "grow_ms": (t3 - t0) * 1e3,
    }


def launches_beside_mapping(d: Driver, seconds: float = 0.5) -> dict:
    """Whether mapping on one thread holds up kernel launches on another
    (issue 38: could a helper thread map pages ahead of the frontier off
    the training thread's path?). The launching thread queues small torch
    kernels for `seconds`, alone and while a second thread creates, maps
    and grants access to 2 MiB pages one after another (in a ring of 1
    GiB, unmapping a slot before mapping it again, so the driver is busy
    the whole time); launches per second both times, and the pages the
    mapper mapped meanwhile. Both are
    Python threads: ctypes lets the GIL go during each driver call, but the
    loops between calls share it, so the figure is pessimistic for a C++
    helper thread."""
    import torch

    x = torch.zeros(1024, device=f"cuda:{d.device}")

    def launch_rate() -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                x.add_(1.0)
            n += 100
        rate = n / (time.perf_counter() - t0)
        torch.cuda.synchronize(d.device)
        return rate

    launch_rate()  # warm-up
    alone = launch_rate()
    stop = threading.Event()
    page, n = 2 * MiB, 512  # a ring of 1 GiB: a slot mapped again is unmapped and released first
    held: list[int] = [0] * n
    made = [0]
    base = ctypes.c_ulonglong()
    d.call("cuMemAddressReserve", ctypes.byref(base), ctypes.c_size_t(n * page), ctypes.c_size_t(0),
           ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))  # fmt: skip
    access = Access(Location(LOCATION_DEVICE, d.device), PROT_READWRITE)

    def unmap(i: int) -> None:
        d.call("cuMemUnmap", ctypes.c_ulonglong(base.value + i * page), ctypes.c_size_t(page))
        d.call("cuMemRelease", ctypes.c_ulonglong(held[i]))
        held[i] = 0

    errors: list[str] = []

    def mapper() -> None:  # keeps the driver mapping for the whole measurement
        try:
            map_until_stopped()
        except RuntimeError as e:  # reported with the figures: they then say nothing
            errors.append(str(e))

    def map_until_stopped() -> None:
        d.call("cuCtxSetCurrent", d.ctx)
        while not stop.is_set():
            i = made[0] % n
            if held[i]:
                unmap(i)
            (held[i],) = d.create(1, page, True)
            at = base.value + i * page
            d.call("cuMemMap", ctypes.c_ulonglong(at), ctypes.c_size_t(page), ctypes.c_size_t(0),
                   ctypes.c_ulonglong(held[i]), ctypes.c_ulonglong(0))  # fmt: skip
            d.call("cuMemSetAccess", ctypes.c_ulonglong(at), ctypes.c_size_t(page), ctypes.byref(access),
                   ctypes.c_size_t(1))  # fmt: skip
            made[0] += 1

    t = threading.Thread(target=mapper)
    t.start()
    beside = launch_rate()
    stop.set()
    t.join()
    for i in range(n):
        if held[i]:
            unmap(i)
    d.call("cuMemAddressFree", ctypes.c_ulonglong(base.value), ctypes.c_size_t(n * page))
    if errors:
        raise RuntimeError("the mapping thread failed: " + errors[0])
    return {"launches_per_s_alone": alone, "launches_per_s_beside_mapping": beside, "pages_mapped_meanwhile": made[0]}


def threaded_create(d: Driver, size: int, threads: int) -> float:
    """Wall time (ms) to create 1 GiB of exportable handles of `size`
    bytes from `threads` threads at once; the handles are released after."""
    n = GiB // size
    out: list = [None] * threads
    errors: list = []

    def work(k: int) -> None:
        try:
            d.call("cuCtxSetCurrent", d.ctx)
            out[k] = d.create(n // threads + (1 if k < n % threads else 0), size, True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = (time.perf_counter() - t0) * 1e3
    if errors:
        raise errors[0]
    for hs in out:
        for h in hs:
            d.call("cuMemRelease", ctypes.c_ulonglong(h))
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    d = Driver(args.device)
    doc: dict = {
        "command": "python -m benchmarks driver-costs --out FILE",
        "per_handle": {},
        "threaded_create_ms": {},
    }
    for size in (2 * MiB, 20 * MiB):
        for exportable in (True, False):
            key = f"{size // MiB}MiB{'_exportable' if exportable else ''}"
            try:  # a driver error is recorded with its name, and the other figures still measured
                rounds = [round_of(d, size, exportable) for _ in range(args.repeats + 1)][1:]  # the first warms up
                doc["per_handle"][key] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            except RuntimeError as e:
                doc["per_handle"][key] = {"error": str(e)}
        for threads in (1, 4, 8):
            key = f"{size // MiB}MiB_x{threads}"
            try:
                doc["threaded_create_ms"][key] = statistics.median(
                    threaded_create(d, size, threads) for _ in range(args.repeats)
                )
            except RuntimeError as e:
                doc["threaded_create_ms"][key] = {"error": str(e)}
    for piece in (2 * MiB, 20 * MiB):
        key = f"1GiB_handle_in_{piece // MiB}MiB_mappings"
        try:
            rounds = [pieces_round(d, piece) for _ in range(args.repeats + 1)][1:]
            doc.setdefault("one_handle_many_mappings", {})[key] = {
                k: statistics.median(r[k] for r in rounds) for k in rounds[0]
            }
        except RuntimeError as e:
            doc.setdefault("one_handle_many_mappings", {})[key] = {"error": str(e)}
    try:
        doc["launches_beside_mapping"] = launches_beside_mapping(d)
    except RuntimeError as e:
        doc["launches_beside_mapping"] = {"error": str(e)}
    import torch

    doc["machine"] = {
        "gpu": torch.cuda.get_device_name(args.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
