"""torch's allocator settings applied to memalloc (memalloc/core/_settings.py):
``PYTORCH_CUDA_ALLOC_CONF`` at enable(), ``_set_allocator_settings`` and
``torch._C._accelerator_setAllocatorSettings`` at run time, with torch's
rules. Checked on the host backend against rounding the test computes with
torch's formula (the one upstream test_cuda.py's test_allocator_settings
uses); on CUDA the same code runs under torch's own test.
"""

from __future__ import annotations

from memalloc.core import _settings

MiB = 1 << 20


def power2_div(size: int, div: int) -> int:
    """torch's roundup_power2_divisions, as upstream test_cuda.py states it."""
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div
    ret = pow2 / 2
    while ret < size:
        ret += step
    return int(ret)


def test_entries_keep_bracketed_lists_whole():
    assert _settings.entries("a:1, roundup_power2_divisions:[64:8,>:1],b:x") == [
        ("a", "1"),
        ("roundup_power2_divisions", "[64:8,>:1]"),
        ("b", "x"),
    ]
    assert _settings.entries("") == []
    # empty entries skipped, an entry without ':' kept with value '' (torch then names the bad key)
    assert _settings.entries(" , a : 1 ,,flag, ") == [("a", "1"), ("flag", "")]


def test_split_sorts_shared_torch_only_and_unsupported_keys():
    shared, fraction, unsupported = _settings.split(
        "max_split_size_mb:64,pinned_use_cuda_host_register:True,backend:cudaMallocAsync,"
        "per_process_memory_fraction:0.25,release_lock_on_cudamalloc:True,expandable_segments:True"
    )
    assert shared == "max_split_size_mb:64,expandable_segments:True"
    assert fraction == 0.25
    assert unsupported == ["backend:cudaMallocAsync", "release_lock_on_cudamalloc:True"]


STARTUP = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    memalloc.enable(backend="host", config="host_capacity_mb:2048")
a = memalloc.installed_allocator()
R["warnings"] = [str(w.message) for w in caught if "have no effect" in str(w.message)]
R["settings"] = a.settings()
R["fraction"] = torch.cuda.get_per_process_memory_fraction()
def grows(n):
    before = memalloc.memory.memory_stats()["active_bytes.all.allocated"]
    keep.append(host.empty(n, torch.uint8))
    return memalloc.memory.memory_stats()["active_bytes.all.allocated"] - before
keep = []
R["startup_84mib"] = grows(84 * MiB)   # [64:8,...]: 8 divisions for 64..128 MiB
R["startup_400mib"] = grows(400 * MiB)  # 2 divisions for 256..512 MiB
"""


def test_pytorch_cuda_alloc_conf_applies_its_shared_keys_at_enable(fresh_python):
    conf = (
        "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1],garbage_collection_threshold:0.5,"
        "per_process_memory_fraction:0.75,release_lock_on_cudamalloc:True,pinned_num_register_threads:4"
    )
    _, r, _ = fresh_python.code(STARTUP, "", env=fresh_python.env(PYTORCH_CUDA_ALLOC_CONF=conf))
    assert r["startup_84mib"] == power2_div(84 * MiB, 8)
    assert r["startup_400mib"] == power2_div(400 * MiB, 2)
    assert "garbage_collection_threshold:0.5" in r["settings"]
    assert r["fraction"] == 0.75
    assert len(r["warnings"]) == 1 and "release_lock_on_cudamalloc:True" in r["warnings"][0]
    assert "pinned_num_register_threads" not in r["warnings"][0]  # torch's host allocator applies those


def test_pytorch_alloc_conf_is_honoured_and_read_first(fresh_python):
    """torch's new name for the variable (PYTORCH_ALLOC_CONF) applies as the
    old one does, and wins when both are set, as torch reads them (issue 42)."""
    env = fresh_python.env(
        PYTORCH_ALLOC_CONF="garbage_collection_threshold:0.5,max_split_size_mb:256",
        PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.7",
    )
    _, r, _ = fresh_python.code(
        "memalloc.enable(backend='host')\n", "R['s'] = memalloc.installed_allocator().settings()", env=env
    )
    assert "garbage_collection_threshold:0.5" in r["s"] and "max_split_size_mb:256" in r["s"], r["s"]


def test_memalloc_conf_overrides_torchs_variable_key_by_key(fresh_python):
    env = fresh_python.env(
        conf="max_split_size_mb:64", PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:256,garbage_collection_threshold:0.6"
    )
    _, r, _ = fresh_python.code(
        "memalloc.enable(backend='host')\n", "R['s'] = memalloc.installed_allocator().settings()", env=env
    )
    s = r["s"]
    assert "max_split_size_mb:64" in s and "garbage_collection_threshold:0.6" in s


RUNTIME = """
import warnings
warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 deprecates the Python entry point itself
memalloc.enable(backend="host", config="host_capacity_mb:2048")
a = memalloc.installed_allocator()
keep = []
def grows(n):
    before = memalloc.memory.memory_stats()["active_bytes.all.allocated"]
    keep.append(host.empty(n, torch.uint8))
    return memalloc.memory.memory_stats()["active_bytes.all.allocated"] - before
R["plain"] = grows(84 * MiB)
torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
R["div4"] = grows(84 * MiB)
torch._C._accelerator_setAllocatorSettings("garbage_collection_threshold:0.5,max_split_size_mb:40")
R["reset"] = grows(84 * MiB)  # roundup back to its default: torch's rule
R["after_reset"] = a.settings()
R["max_split"] = a.max_split_size
R["bad"] = err(lambda: torch._C._accelerator_setAllocatorSettings("garbage_collection_threshold:1.2"))
R["after_bad"] = a.settings()
torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
R["expandable"] = a.settings()
keep.clear(); memalloc.memory.empty_cache()
t = host.empty(30 * MiB, torch.uint8)
R["expandable_segment"] = memalloc.memory.memory_stats()["reserved_bytes.all.current"]
torch._C._accelerator_setAllocatorSettings("max_split_size_mb:64")  # expandable_segments is kept
R["kept"] = a.settings()
torch._C._accelerator_setAllocatorSettings("graph_capture_record_stream_reuse:True")
torch._C._accelerator_setAllocatorSettings("max_split_size_mb:64")
R["reuse_kept"] = a.settings()
torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
R["reuse_off"] = a.settings()
del t
a.validate()
"""


def test_set_allocator_settings_at_run_time_follows_torchs_rules(fresh_python):
    _, r, _ = fresh_python.code(RUNTIME, "")
    assert r["plain"] == 84 * MiB
    assert r["div4"] == power2_div(84 * MiB, 4)
    assert r["reset"] == 84 * MiB
    assert "max_split_size_mb:40" in r["after_reset"] and "roundup" not in r["after_reset"]
    assert r["max_split"] == 40 * MiB
    assert r["bad"][0] == "ValueError"  # torch's own check, before memalloc applies anything
    assert r["after_bad"] == r["after_reset"]
    assert "expandable_segments:True" in r["expandable"]
    assert r["expandable_segment"] < 32 * MiB  # pages, not a 30 MiB+ plain segment rounded to 2 MiB multiples
    assert "expandable_segments:True" in r["kept"] and "max_split_size_mb:64" in r["kept"]
    assert "graph_capture_record_stream_reuse:True" in r["reuse_kept"]  # kept unless given, as expandable
    assert "graph_capture_record_stream_reuse" not in r["reuse_off"]
