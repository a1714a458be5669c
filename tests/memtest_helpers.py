"""Native size rules and test utilities shared by the host-backend tests.

The size rules mirror c10/cuda/CUDACachingAllocator.cpp (docs/architecture.md);
the utilities wrap and inspect a host-backend ``_C.Allocator``. Test files
import what they need: ``from memtest_helpers import ...`` (pytest puts tests/
on sys.path, as tests/ has no __init__.py).
"""

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from memalloc import _C

REPO = Path(__file__).resolve().parents[1]

KiB = 1 << 10
MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB

POOLS = ("all", "small_pool", "large_pool")
STAT_KEYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
SCALAR_KEYS = (
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_gc_releases",
    "num_device_free_failures",
)
# The keys MEMALLOC_CONF accepts, in documentation order.
CONFIG_KEYS = [
    "backend",
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "graph_capture_record_stream_reuse",
    "reuse_free_pages",
    "empty_cache_every_n_steps",
    "patch_torch",
    "record_history",
    "record_stacks",
    "call_sites",
    "flight_recorder",
    "flight_recorder_keep",
    "host_capacity_mb",
    "host_devices",
]


# ------------------------------------------------------------ size rules ----
def rnd(size):
    """Native round_size without roundup_power2_divisions: the block size the
    allocator hands out for a request of ``size`` bytes."""
    if size < 512:
        return 512
    return -(-size // 512) * 512


def rnd_pow2(size, divisions):
    """Native round_size with roundup_power2_divisions (c10 formula)."""
    if size < 512:
        return 512
    if divisions > 1 and size > 512 * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        low = size & ~(step - 1)
        return size if low == size else low + step
    return rnd(size)


def segment_size(rounded):
    """Size of the segment a fresh block of ``rounded`` bytes is carved from."""
    if rounded <= MiB:
        return SMALL_SEGMENT
    if rounded < 10 * MiB:
        return LARGE_SEGMENT
    return -(-rounded // (2 * MiB)) * (2 * MiB)


def pool_of(size):
    """The pool ("small_pool" / "large_pool") a request of ``size`` bytes uses."""
    return "small_pool" if rnd(size) <= MiB else "large_pool"


# ------------------------------------------------------- test utilities ----
class Checked:
    """Proxy of an Allocator that validates every device after each call.
    ``.a`` is the allocator itself: what memalloc._C._testing's hooks take.
    A name the Allocator lacks is looked up in memalloc._C._testing: its
    types as they are, its hooks (the private-pool calls among them) as
    methods, the allocator passed first."""

    def __init__(self, conf="host_capacity_mb:64"):
        self.a = _C.Allocator("host", conf)

    def __getattr__(self, name):
        if hasattr(self.a, name):
            attr = getattr(self.a, name)
        else:
            attr = getattr(_C._testing, name)
            if isinstance(attr, type):
                return attr
            attr = functools.partial(attr, self.a)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            finally:
                for d in range(self.a.device_count):
                    self.a.validate(d)

        return call


def cur(a, key, pool="all", device=0):
    return a.stats(device)[key][pool]["current"]


def stat(a, key, pool="all", field="current", device=0):
    return a.stats(device)[key][pool][field]


def segment_of(a, ptr, device=0):
    for seg in a.segments(device):
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg
    raise AssertionError(f"{ptr:#x} lies in no segment")


def block_of(a, ptr, device=0):
    for blk in segment_of(a, ptr, device)["blocks"]:
        if blk["address"] == ptr:
            return blk
    raise AssertionError(f"no block starts at {ptr:#x}")


def live_block_bytes(a, device=0):
    return sum(b["size"] for s in a.segments(device) for b in s["blocks"] if b["state"] == "active_allocated")


def require_library(name: str) -> None:
    """Skips the calling test when the library ``name`` (transformers,
    lightning, accelerate) is not installed, or fails it where
    ``MEMALLOC_REQUIRE_LIBRARIES=1`` (CI, which installs them)."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec(name) is not None:
        return
    if os.environ.get("MEMALLOC_REQUIRE_LIBRARIES") == "1":
        pytest.fail(f"MEMALLOC_REQUIRE_LIBRARIES=1 but {name} is not installed: pip install {name}")
    pytest.skip(f"not installed: {name}")


# ---- case scripts in a child process (the GPU tests: FreshPython hides the GPU) ----


def _run_child(argv: list[str], cwd: str | Path, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGV...`` in ``cwd``, with this checkout importable and no
    MEMALLOC_CONF of the caller's, the GPU visible."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MEMALLOC_CONF", None)
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_case(script: str | Path, *args: str, cwd: str | Path, timeout: float = 600) -> dict:
    """``python SCRIPT ARGS...`` in ``cwd`` (as _run_child): the dict of the
    one ``RESULT <json>`` line it prints. Asserts it exited 0 and printed that
    line once (the output's tail otherwise)."""
    p = _run_child([str(script), *args], cwd, timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    assert p.returncode == 0 and len(lines) == 1, f"rc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[0][len("RESULT ") :])


def run_memalloc(*args: str, cwd: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m memalloc ARGS...`` in ``cwd`` (as _run_child), for the
    commands that run a script on the GPU. Asserts it exited 0 (the output's
    tail otherwise)."""
    p = _run_child(["-m", "memalloc", *args], cwd, timeout)
    assert p.returncode == 0, (args, p.stdout[-3000:], p.stderr[-5000:])
    return p


# ---- the run page of the framework callbacks (tests/integration/test_callbacks.py, tests/gpu/) ----


def check_run_page(r: dict, folder: str, script: str, state: str = "exited") -> dict:
    """The run page a framework callback wrote in the logger's folder
    (memalloc/trace/run_page.py), for a callback case's result ``r``
    (tests/callback_cases/, its truths per step): its
    steps end with the truths' allocated and peak bytes, step by step (the
    monitor's boundary comes after the truth's reading, before the peaks'
    reset); its flame graph's peak holds the model's parameters, allocated
    before training started (in the module's constructor, or in Module.to
    where the model was built on the CPU), and is at least every step's
    peak; the flight file the monitor started is gone after a clean end,
    kept after an error."""
    page = open(os.path.join(folder, "index.html")).read()
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S).group(1))
    assert data["process"]["state"] == state and data["title"] in ("MemoryMonitor", "MemoryCallback")
    truth = [r["truth"][k] for k in sorted(r["truth"], key=int)]
    rows = data["steps"][-len(truth) :] if truth else []
    assert [s["peak_allocated"] for s in rows] == [t["peak_allocated"] for t in truth], (rows, truth)
    assert [s["allocated"] for s in rows] == [t["allocated"] for t in truth], (rows, truth)
    flame = data["flame"]
    assert flame["total"] >= max([t["peak_allocated"] for t in truth] + [1])
    frames = _frame_names(flame["tree"])
    assert any(os.path.basename(f) == script for f, _ in frames), frames  # the script's own lines
    # the parameters: made on the device (host backend) or moved there by Module.to (CUDA; its `convert`)
    assert any(n.rsplit(".", 1)[-1] in ("__init__", "reset_parameters", "convert") for _, n in frames), frames
    flight_dir = os.path.join(folder, "memalloc-flight")
    if state == "raised":
        assert len(os.listdir(flight_dir)) == 1  # for postmortem
    else:
        assert not os.path.exists(flight_dir)
    return data


def _frame_names(node: dict) -> set[tuple[str, str]]:
    return {(node["file"], node["name"])} | {x for c in node["children"] for x in _frame_names(c)}
