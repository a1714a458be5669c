"""torch.cuda's memory queries answered from memalloc (host backend), and
their undoing. (On CUDA nothing is patched: torch's own functions answer
through memalloc's subclass of CUDAPluggableAllocator; tests/gpu/.)

memalloc.enable() is once per process, so every enabling scenario runs in a
fresh interpreter (``python -c``) that prints one ``RESULT <json>`` line; the
assertions are made here. CUDA_VISIBLE_DEVICES is emptied so that "auto" is
the host backend on any machine.

Expected numbers follow the size rules: a request rounds up to a multiple of
512 B; rounded sizes <= 1 MiB come from 2 MiB segments, 1-10 MiB requests from
20 MiB segments (split, as more than 1 MiB remains), >= 10 MiB requests get
their own segment rounded up to 2 MiB.
"""

from __future__ import annotations

import pytest
from memtest_helpers import LARGE_SEGMENT, POOLS, SMALL_SEGMENT, STAT_KEYS, MiB, rnd

# Every torch.cuda function memalloc answers on the host backend.
PATCHED = (
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_summary",
    "get_per_process_memory_fraction",
    "set_per_process_memory_fraction",
    "mem_get_info",
    "empty_cache",
)
TORCH_SCALARS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
FIELDS = ("current", "peak", "allocated", "freed")


def expected_keys():
    keys = [f"{name}.{pool}.{field}" for name in STAT_KEYS for pool in POOLS for field in FIELDS]
    keys += [f"{name}.{field}" for name in ("oversize_allocations", "oversize_segments") for field in FIELDS]
    keys += list(TORCH_SCALARS) + ["max_split_size"]
    return sorted(keys)


PRELUDE = """
PATCHED = %r
def fns():
    return {n: (getattr(torch.cuda, n), getattr(torch.cuda.memory, n)) for n in PATCHED}
def same_as(saved):
    now = fns()
    return {n: [now[n][0] is saved[n][0], now[n][1] is saved[n][1]] for n in PATCHED}
def snap():
    c = torch.cuda
    return {"torch": [c.memory_allocated(), c.max_memory_allocated(), c.memory_reserved(),
                      c.max_memory_reserved(), c.memory_cached(), c.max_memory_cached(), list(c.mem_get_info())],
            "memalloc": [memalloc.memory.memory_allocated(), memalloc.memory.max_memory_allocated(),
                         memalloc.memory.memory_reserved(),
                         memalloc.memory.max_memory_reserved(), memalloc.memory.memory_reserved(),
                         memalloc.memory.max_memory_reserved(),
                         list(memalloc.memory.mem_get_info())]}
""" % (PATCHED,)


@pytest.fixture
def run_child(fresh_python):
    """run_child(code, conf=None): PRELUDE + code in a fresh interpreter (tests/conftest.py);
    returns the process and its RESULT dict."""
    return lambda code, conf=None: fresh_python.code(PRELUDE, code, conf)[:2]


def fmt_size(sz: int, pref: int) -> str:
    """torch's memory_summary size cell: divide by 1024 while the reference
    value is >= 768 KiB of the current unit."""
    units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    unit = 0
    while unit + 1 < len(units) and pref >= 768 * 1024:
        sz //= 1024
        pref /= 1024
        unit += 1
    return f"{sz:6d} {units[unit]}"


def flat_from_raw(raw: dict, max_split: int) -> dict:
    """What torch.cuda.memory_stats must hold, derived from _C.Allocator.stats()."""
    out = {}
    for name in STAT_KEYS:
        for pool in POOLS:
            for field in FIELDS:
                out[f"{name}.{pool}.{field}"] = raw[name][pool][field]
    for name in ("oversize_allocations", "oversize_segments"):
        for field in FIELDS:
            out[f"{name}.{field}"] = raw[name][field]
    for name in TORCH_SCALARS:
        out[name] = raw[name]
    out["max_split_size"] = max_split
    return out


def check_table(summary: str, stats: dict, footer: str, abbreviated: bool = False):
    lines = summary.rstrip("\n").split("\n")
    end = max(i for i, l in enumerate(lines) if l.startswith("|")) + 1
    table, between, tail = lines[:end], lines[end:-1], lines[-1]
    assert tail == footer
    # memalloc's bytes by category (memory_breakdown) sit between the table and the footer
    assert between[0].startswith("memory by category, device 0") and between[-1].startswith("  total"), between
    assert all(l.startswith("|") and l.endswith("|") for l in table), table
    assert "PyTorch CUDA memory summary, device ID 0" in table[1]
    assert f"CUDA OOMs: {stats['num_ooms']} " in table[3]
    assert f"cudaMalloc retries: {stats['num_alloc_retries']} " in table[3]
    rows = {}
    for l in table:
        cells = [c.strip() for c in l.strip("|").split("|")]
        if len(cells) == 5:
            rows.setdefault(cells[0], cells[1:])
    for name in (
        "Allocated memory",
        "Active memory",
        "Requested memory",
        "GPU reserved memory",
        "Non-releasable memory",
        "Allocations",
        "Active allocs",
        "GPU reserved segments",
        "Non-releasable allocs",
        "Oversize allocations",
        "Oversize GPU segments",
    ):
        assert name in rows, name
    assert ("from large pool" in rows) != abbreviated
    want = [fmt_size(stats[f"allocated_bytes.all.{f}"], stats[f"allocated_bytes.all.{f}"]).strip() for f in FIELDS]
    assert rows["Allocated memory"] == want
    assert rows["Allocations"] == [str(stats[f"allocation.all.{f}"]) for f in FIELDS]
    assert rows["GPU reserved segments"] == [str(stats[f"segment.all.{f}"]) for f in FIELDS]
    assert rows["Oversize GPU segments"] == [str(stats[f"oversize_segments.{f}"]) for f in FIELDS]


def test_fmt_size_matches_known_cells():
    # The helper above against cells torch prints (checked by hand).
    assert fmt_size(3149824, 3149824) == "  3076 KiB"
    assert fmt_size(0, 0) == "     0 B  "
    assert fmt_size(22 * MiB, 22 * MiB) == " 22528 KiB"
    assert fmt_size(800 * MiB, 800 * MiB) == "   800 MiB"
    assert fmt_size(700 * 1024, 700 * 1024) == "716800 B  "  # below 768 KiB: still bytes


def test_torch_memory_queries_answer_from_memalloc(run_child):
    _, r = run_child(
        """
        before = fns()
        R["enable"] = memalloc.enable(backend="host", config="host_capacity_mb:64,expandable_segments:False")
        a = memalloc.installed_allocator()
        R["patched"] = memalloc.install._torch_patch.is_patched()
        R["replaced"] = same_as(before)
        R["start"] = snap()
        t1 = host.empty(1000, torch.float32)              # 4000 B -> 4096, small segment
        t2 = host.empty((3, MiB), torch.uint8)            # 3 MiB -> 20 MiB large segment
        R["live"] = snap()
        st = torch.cuda.memory_stats()
        R["stats_type"] = type(st).__name__
        R["stats_keys"] = list(st)
        R["stats"] = dict(st)
        R["stats_by_device"] = [dict(torch.cuda.memory_stats(0)) == dict(st),
                                dict(torch.cuda.memory_stats("cuda:0")) == dict(st),
                                dict(torch.cuda.memory_stats(device=torch.device("cuda", 0))) == dict(st)]
        R["memalloc_stats"] = dict(memalloc.memory.memory_stats())
        R["raw"] = a.stats()
        R["nested"] = torch.cuda.memory_stats_as_nested_dict()
        R["summary_live"] = torch.cuda.memory_summary()
        R["summary_memalloc"] = memalloc.memory.memory_summary()
        R["summary_abbrev"] = torch.cuda.memory_summary(abbreviated=True)
        del t2
        R["freed"] = snap()
        R["stats_freed"] = dict(torch.cuda.memory_stats())
        R["empty"] = torch.cuda.empty_cache()
        R["emptied"] = snap()
        torch.cuda.reset_peak_memory_stats()
        R["reset_peak"] = snap()
        R["stats_reset_peak"] = dict(torch.cuda.memory_stats())
        torch.cuda.reset_accumulated_memory_stats()
        R["stats_reset_acc"] = dict(torch.cuda.memory_stats())
        R["frac0"] = [torch.cuda.get_per_process_memory_fraction(), a.memory_fraction()]
        torch.cuda.set_per_process_memory_fraction(0.5)
        R["frac1"] = [torch.cuda.get_per_process_memory_fraction(), memalloc.memory.get_per_process_memory_fraction(),
                      a.memory_fraction()]
        R["oom"] = err(lambda: host.empty(31 * MiB, torch.uint8))  # 32 MiB segment: 2 + 32 > 32 MiB
        t3 = host.empty(29 * MiB + 1, torch.uint8)                 # 30 MiB segment: 2 + 30 == 32 MiB
        R["limited"] = snap()
        R["stats_limited"] = dict(torch.cuda.memory_stats())
        R["summary_limited"] = torch.cuda.memory_summary()
        a.validate()
        """
    )
    assert r["enable"] == "host"
    assert r["patched"] is True
    for name in PATCHED:
        assert r["replaced"][name] == [False, False], name
    b1, b2 = rnd(4000), 3 * MiB
    total = 64 * MiB

    def mem(allocated, max_allocated, reserved, max_reserved):
        return [allocated, max_allocated, reserved, max_reserved, reserved, max_reserved, [total - reserved, total]]

    for key in ("start", "live", "freed", "emptied", "reset_peak", "limited"):
        assert r[key]["torch"] == r[key]["memalloc"], key
    assert r["start"]["torch"] == mem(0, 0, 0, 0)
    assert r["live"]["torch"] == mem(b1 + b2, b1 + b2, SMALL_SEGMENT + LARGE_SEGMENT, SMALL_SEGMENT + LARGE_SEGMENT)
    assert r["freed"]["torch"] == mem(b1, b1 + b2, SMALL_SEGMENT + LARGE_SEGMENT, SMALL_SEGMENT + LARGE_SEGMENT)
    assert r["empty"] is None  # torch's empty_cache returns nothing
    assert r["emptied"]["torch"] == mem(b1, b1 + b2, SMALL_SEGMENT, SMALL_SEGMENT + LARGE_SEGMENT)
    assert r["reset_peak"]["torch"] == mem(b1, b1, SMALL_SEGMENT, SMALL_SEGMENT)

    # memory_stats: torch's key set, sorted, nothing memalloc-only; values from the allocator.
    assert r["stats_type"] == "OrderedDict"
    assert r["stats_keys"] == expected_keys()
    assert "num_gc_releases" not in r["stats"] and "num_device_free_failures" not in r["stats"]
    assert all(r["stats_by_device"])
    assert r["stats"] == r["memalloc_stats"] == flat_from_raw(r["raw"], -1)
    st = r["stats"]
    assert st["allocated_bytes.all.current"] == b1 + b2
    assert st["allocated_bytes.small_pool.current"] == b1
    assert st["allocated_bytes.large_pool.current"] == b2
    assert st["requested_bytes.all.current"] == 4000 + 3 * MiB
    assert st["inactive_split_bytes.all.current"] == (SMALL_SEGMENT - b1) + (LARGE_SEGMENT - b2)
    assert st["segment.all.current"] == 2 and st["num_device_alloc"] == 2
    assert st["max_split_size"] == -1
    nested = dict(r["raw"])
    del nested["num_gc_releases"], nested["num_device_free_failures"]  # memalloc-only counters
    nested["max_split_size"] = -1
    assert r["nested"] == nested

    # After del + empty_cache: the 20 MiB segment went back; peaks/totals remember it.
    sf = r["stats_freed"]
    assert sf["allocation.all.current"] == 1 and sf["allocation.all.freed"] == 1
    sp = r["stats_reset_peak"]
    assert sp["num_device_free"] == 1 and sp["num_sync_all_streams"] == 1
    assert sp["reserved_bytes.all.peak"] == SMALL_SEGMENT and sp["reserved_bytes.large_pool.peak"] == 0
    assert sp["reserved_bytes.all.allocated"] == SMALL_SEGMENT + LARGE_SEGMENT
    assert sp["allocated_bytes.all.peak"] == b1
    sa = r["stats_reset_acc"]
    for k, v in sa.items():
        if k.endswith((".allocated", ".freed")) or k in TORCH_SCALARS:
            assert v == 0, k
    assert sa["allocated_bytes.all.current"] == b1 and sa["allocated_bytes.all.peak"] == b1
    assert sa["reserved_bytes.all.current"] == SMALL_SEGMENT
    assert sa["max_split_size"] == -1

    # Memory fraction: 0.5 of 64 MiB caps reserved bytes at 32 MiB.
    assert r["frac0"] == [1.0, 1.0]  # none set: the whole device, as torch
    assert r["frac1"] == [0.5, 0.5, 0.5]
    name, mro, msg = r["oom"]
    assert name == "OutOfMemoryError" and "RuntimeError" in mro
    assert "Tried to allocate 31.00 MiB" in msg and "memory fraction" in msg
    # 29 MiB + 512 leaves 1 MiB - 512 of its 30 MiB segment: not split, the block is 30 MiB.
    assert r["limited"]["torch"] == mem(b1 + 30 * MiB, b1 + 30 * MiB, 32 * MiB, 32 * MiB)
    sl = r["stats_limited"]
    assert sl["num_ooms"] == 1 and sl["num_alloc_retries"] == 1 and sl["num_sync_all_streams"] == 1

    # memory_summary: torch's table from memalloc's stats, then the footer.
    footer = "memalloc: host backend, device 0; max_split_size unlimited; empty-cache policy: manual + on-OOM"
    check_table(r["summary_live"], r["stats"], footer)
    assert r["summary_memalloc"] == r["summary_live"]
    check_table(r["summary_abbrev"], r["stats"], footer, abbreviated=True)
    check_table(r["summary_limited"], r["stats_limited"], footer)
    assert "CUDA OOMs: 1 " in r["summary_limited"]


def test_unpatch_restores_torch_and_memalloc_summary_still_works(run_child):
    _, r = run_child(
        """
        before = fns()
        memalloc.enable(backend="host", config="max_split_size_mb:40,host_capacity_mb:128,expandable_segments:False")
        R["patched"] = [memalloc.install._torch_patch.is_patched(), same_as(before)]
        t = host.empty(45 * MiB, torch.uint8)   # 46 MiB segment >= 40 MiB: oversize block and segment
        R["torch_alloc_patched"] = torch.cuda.memory_allocated()
        memalloc.unpatch_torch()
        R["unpatched"] = [memalloc.install._torch_patch.is_patched(), same_as(before)]
        R["summary"] = memalloc.memory.memory_summary()
        R["stats"] = dict(memalloc.memory.memory_stats())
        R["allocated"] = memalloc.memory.memory_allocated()
        memalloc.unpatch_torch()              # twice: still torch's own
        R["unpatched_again"] = same_as(before)
        memalloc.patch_torch()
        R["repatched"] = [memalloc.install._torch_patch.is_patched(), same_as(before),
                          torch.cuda.memory_allocated(),
                          torch.cuda.memory_stats()["max_split_size"]]
        """
    )
    assert r["patched"][0] is True
    assert all(v == [False, False] for v in r["patched"][1].values())
    assert r["torch_alloc_patched"] == 46 * MiB  # >= max_split: not split, the whole segment
    assert r["unpatched"][0] is False
    for name in PATCHED:
        assert r["unpatched"][1][name] == [True, True], name
        assert r["unpatched_again"][name] == [True, True], name
    st = r["stats"]
    assert st["max_split_size"] == 40 * MiB
    assert st["oversize_allocations.current"] == 1 and st["oversize_segments.current"] == 1
    assert r["allocated"] == 46 * MiB
    footer = "memalloc: host backend, device 0; max_split_size 41943040 B; empty-cache policy: manual + on-OOM"
    check_table(r["summary"], st, footer)
    assert r["summary"].split("\n")[-2] == footer
    assert r["repatched"][0] is True
    assert all(v == [False, False] for v in r["repatched"][1].values())
    assert r["repatched"][2:] == [46 * MiB, 40 * MiB]


@pytest.mark.parametrize("how", ["argument", "env_False", "env_0"])
def test_patch_torch_false_leaves_torch_untouched(how, run_child):
    code = """
        before = fns()
        memalloc.enable(backend="host"%s)
        R["patched"] = memalloc.install._torch_patch.is_patched()
        R["same"] = same_as(before)
        t = host.empty(1000, torch.float32)
        R["allocated"] = memalloc.memory.memory_allocated()
        R["summary_ok"] = "PyTorch CUDA memory summary" in memalloc.memory.memory_summary()
        R["still_same"] = same_as(before)
    """ % (", patch_torch=False" if how == "argument" else "")
    conf = {"argument": None, "env_False": "patch_torch:False", "env_0": "patch_torch:0"}[how]
    _, r = run_child(code, conf=conf)
    assert r["patched"] is False
    for name in PATCHED:
        assert r["same"][name] == [True, True], name
        assert r["still_same"][name] == [True, True], name
    assert r["allocated"] == rnd(4000)
    assert r["summary_ok"] is True


def test_patch_torch_true_argument_overrides_the_env(run_child):
    _, r = run_child(
        """
        before = fns()
        memalloc.enable(backend="host", patch_torch=True)
        R["patched"] = memalloc.install._torch_patch.is_patched()
        R["same"] = same_as(before)
        """,
        conf="patch_torch:False",
    )
    assert r["patched"] is True
    assert all(v == [False, False] for v in r["same"].values())
