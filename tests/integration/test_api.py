"""The top-level API: enable(), is_enabled(), memory_allocated(),
memory_reserved(), empty_cache(), mem_get_info(), and the error types.

memalloc.enable() installs a process-wide allocator once, so every test that
enables runs a fresh interpreter (``python -c``) that prints one
``RESULT <json>`` line; the assertions are made here, on its exit code and
output. This machine has no GPU and a CPU-only torch: "auto" means "host".

Expected sizes follow the allocator's rules: requests round up to a multiple
of 512 bytes (minimum 512); rounded sizes <= 1 MiB come from 2 MiB segments;
1-10 MiB requests get 20 MiB segments.
"""

from __future__ import annotations

import gc

import pytest
from memtest_helpers import CONFIG_KEYS, LARGE_SEGMENT, SMALL_SEGMENT, MiB, rnd

import memalloc

PRELUDE = ""  # tests/conftest.py CHILD_PRELUDE has all these scenarios need


@pytest.fixture
def run_child(fresh_python):
    """run_child(code, conf=None): PRELUDE + code in a fresh interpreter (tests/conftest.py);
    returns the process and its RESULT dict."""
    return lambda code, conf=None: fresh_python.code(PRELUDE, code, conf)[:2]


def test_enable_auto_picks_host_is_idempotent_and_refuses_a_different_config(run_child):
    p, r = run_child(
        """
        R["before"] = [memalloc.is_enabled(), memalloc.enabled_backend()]
        R["installed_before"] = err(memalloc.installed_allocator)
        R["allocated_before"] = err(memalloc.memory.memory_allocated)
        R["first"] = memalloc.enable(verbose=True)
        R["after"] = [memalloc.is_enabled(), memalloc.enabled_backend()]
        a = memalloc.installed_allocator()
        R["installed_backend"] = a.backend_name
        R["installed_config"] = a.config
        R["expected_config"] = memalloc._C.parse_config(
            "expandable_segments:True," + memalloc.core._config.config_text()
        )
        R["again"] = memalloc.enable()
        R["again_host"] = memalloc.enable(backend="host")
        R["again_mapping"] = memalloc.enable(config={})
        R["different"] = err(lambda: memalloc.enable(config="host_capacity_mb:64"))
        R["different_cuda"] = err(lambda: memalloc.enable(backend="cuda"))
        R["config_after"] = memalloc.installed_allocator().config
        R["still"] = [memalloc.is_enabled(), memalloc.enabled_backend()]
        """
    )
    assert r["before"] == [False, None]
    assert r["installed_before"][0] == "RuntimeError"
    assert "not enabled" in r["installed_before"][2]
    assert r["allocated_before"][0] == "RuntimeError"
    assert r["first"] == "host"
    assert "enabled on the host backend" in p.stdout
    # verbose says why CUDA was not chosen: a CPU-only torch here, no visible
    # device on a GPU machine (CUDA_VISIBLE_DEVICES is emptied for children),
    # or a CUDA torch on a machine without a driver (issue 42: common in CI),
    # where the message names the fix.
    why = ("CPU-only", "CUDA error 100", "no device", "no CUDA driver")
    assert any(w in p.stdout for w in why), p.stdout
    if "no CUDA driver" in p.stdout:
        assert "install the NVIDIA driver" in p.stdout and "backend='host'" in p.stdout, p.stdout
    assert r["after"] == [True, "host"]
    assert r["installed_backend"] == "host"
    assert r["installed_config"] == r["expected_config"]
    # Same backend and config again: a no-op returning the backend.
    assert r["again"] == r["again_host"] == r["again_mapping"] == "host"
    # A different config or backend: RuntimeError, allocator unchanged.
    for key in ("different", "different_cuda"):
        name, mro, msg = r[key]
        assert "RuntimeError" in mro, r[key]
        assert "already enabled" in msg
    assert r["config_after"] == r["expected_config"]
    assert r["still"] == [True, "host"]


def test_enable_rejects_cuda_and_unknown_backends_without_enabling(run_child):
    p, r = run_child(
        """
        R["usable"] = list(memalloc.core._state.cuda_usable())
        R["cuda"] = err(lambda: memalloc.enable(backend="cuda"))
        R["after_cuda"] = memalloc.is_enabled()
        R["conf_cuda"] = err(lambda: memalloc.enable(config="backend:cuda"))
        R["bogus"] = err(lambda: memalloc.enable(backend="bogus"))
        R["bad_key"] = err(lambda: memalloc.enable(config="no_such_key:1"))
        R["bad_type"] = err(lambda: memalloc.enable(config=123))
        R["after_all"] = [memalloc.is_enabled(), memalloc.enabled_backend()]
        R["installed"] = memalloc._C.installed() is None
        R["finally"] = memalloc.enable(backend="host")
        R["enabled"] = memalloc.is_enabled()
        """
    )
    assert r["usable"][0] is False and r["usable"][1]
    name, mro, msg = r["cuda"]
    assert name == "RuntimeError"
    assert "CUDA is not usable" in msg
    assert r["usable"][1] in msg  # the reason is passed on
    assert r["after_cuda"] is False
    # backend "auto" defers to the config's backend key.
    assert r["conf_cuda"][0] == "RuntimeError" and "CUDA is not usable" in r["conf_cuda"][2]
    name, mro, msg = r["bogus"]
    assert name == "ValueError"
    assert "bogus" in msg
    for b in ("auto", "cuda", "host"):
        assert b in msg
    assert "ValueError" in r["bad_key"][1] and "no_such_key" in r["bad_key"][2]
    assert r["bad_type"][0] == "TypeError"
    # None of the failures installed anything; enabling still works after them.
    assert r["after_all"] == [False, None]
    assert r["installed"] is True
    assert r["finally"] == "host"
    assert r["enabled"] is True


LAYER_PROBE = """
    memalloc.enable(backend="host"%s)
    R["config"] = memalloc.installed_allocator().config
    t = host.empty((3, 1 << 20), torch.uint8)   # 3 MiB: a large-pool request
    R["reserved"] = memalloc.memory.memory_reserved()
    R["expandable"] = [s["is_expandable"] for s in memalloc.snapshot()["segments"]]
    """


@pytest.mark.parametrize(
    "layers",
    [
        {},  # memalloc's default (core/_config.PRODUCT_DEFAULTS): expandable
        # each layer of the user's config turns them off: the plain policy is one key away
        {"MEMALLOC_CONF": "expandable_segments:False"},
        {"config": "expandable_segments:False"},
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
        # a later layer turns back on what an earlier one turned off, and off
        # again: the layers are parsed at once, so a False (the engine's own
        # default, which canonical text leaves out) still wins over a True
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "MEMALLOC_CONF": "expandable_segments:True"},
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "MEMALLOC_CONF": "expandable_segments:False"},
        {"MEMALLOC_CONF": "expandable_segments:True", "config": "expandable_segments:False"},
    ],
    ids=[
        "none",
        "MEMALLOC_CONF",
        "config",
        "torch",
        "torch_then_MEMALLOC_CONF_on",
        "torch_then_MEMALLOC_CONF_off",
        "MEMALLOC_CONF_then_config",
    ],
)
def test_expandable_by_default_and_each_config_layer_sets_them_the_later_one_winning(layers, fresh_python):
    env = fresh_python.env(
        layers.get("MEMALLOC_CONF"),
        **(
            {"PYTORCH_CUDA_ALLOC_CONF": layers["PYTORCH_CUDA_ALLOC_CONF"]}
            if "PYTORCH_CUDA_ALLOC_CONF" in layers
            else {}
        ),
    )
    code = LAYER_PROBE % (f", config={layers['config']!r}" if "config" in layers else "")
    _, r = fresh_python.code(PRELUDE, code, env=env)[:2]
    last = ([v for k, v in layers.items()] or ["expandable_segments:True"])[-1]
    if last.endswith("True"):
        assert "expandable_segments:True" in r["config"]
        assert r["expandable"] == [True]
        assert r["reserved"] == 4 << 20  # the 2 MiB pages the 3 MiB request spans
    else:
        assert "expandable_segments" not in r["config"]
        assert r["expandable"] == [False]
        assert r["reserved"] == 20 << 20  # native's 20 MiB segment for a 1-10 MiB request


def test_memory_functions_track_host_tensors_exactly(run_child):
    _, r = run_child(
        """
        memalloc.enable(config="expandable_segments:False")  # whole segments, as the reserved figures below
        R["start"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        t1 = host.empty(1000, torch.float32)            # 4000 B
        R["t1"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        R["devices"] = [memalloc.memory.memory_allocated(0), memalloc.memory.memory_allocated("cuda:0"),
                        memalloc.memory.memory_allocated("cuda"),
                        memalloc.memory.memory_allocated(torch.device("cuda", 0)),
                        memalloc.memory.memory_reserved(0), memalloc.memory.memory_reserved("cuda:0")]
        t2 = host.empty(300, torch.float16)             # 600 B
        R["t2"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        big = host.empty((1024, 1024), torch.float32)   # 4 MiB
        R["big"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        raw = memalloc.memory.memory_stats_raw()
        R["raw"] = [raw["allocated_bytes"]["large_pool"]["current"], raw["segment"]["all"]["current"]]
        del big
        R["big_freed"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        R["released"] = memalloc.memory.empty_cache()
        R["after_empty"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        del t1, t2
        R["all_freed"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        R["released2"] = memalloc.memory.empty_cache(0)
        R["end"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        R["released3"] = memalloc.memory.empty_cache()
        R["bad"] = [err(lambda: memalloc.memory.memory_allocated(1)), err(lambda: memalloc.memory.memory_reserved(-1)),
                    err(lambda: memalloc.memory.memory_allocated("cuda:3")),
                    err(lambda: memalloc.memory.empty_cache(2)),
                    err(lambda: memalloc.memory.mem_get_info(5))]
        R["bad_type"] = err(lambda: memalloc.memory.memory_allocated(1.5))
        memalloc.installed_allocator().validate()
        """
    )
    b1, b2, big = rnd(4000), rnd(600), 4 * MiB
    assert r["start"] == [0, 0]
    assert r["t1"] == [b1, SMALL_SEGMENT]
    assert r["devices"] == [b1, b1, b1, b1, SMALL_SEGMENT, SMALL_SEGMENT]
    assert r["t2"] == [b1 + b2, SMALL_SEGMENT]
    assert r["big"] == [b1 + b2 + big, SMALL_SEGMENT + LARGE_SEGMENT]
    assert r["raw"] == [big, 2]
    assert r["big_freed"] == [b1 + b2, SMALL_SEGMENT + LARGE_SEGMENT]
    # The 20 MiB segment is fully free and goes back; the small one is in use.
    assert r["released"] == LARGE_SEGMENT
    assert r["after_empty"] == [b1 + b2, SMALL_SEGMENT]
    assert r["all_freed"] == [0, SMALL_SEGMENT]
    assert r["released2"] == SMALL_SEGMENT
    assert r["end"] == [0, 0]
    assert r["released3"] == 0
    for e in r["bad"]:
        assert e is not None and "ValueError" in e[1], e
        assert "does not exist" in e[2]
    assert r["bad_type"][0] == "TypeError"


def test_mem_get_info_reports_the_configured_capacity(run_child):
    _, r = run_child(
        """
        memalloc.enable()
        R["empty"] = list(memalloc.memory.mem_get_info())
        t = host.empty(100, torch.uint8)
        R["one"] = list(memalloc.memory.mem_get_info(0))
        R["str"] = list(memalloc.memory.mem_get_info("cuda:0"))
        R["types"] = [type(x).__name__ for x in memalloc.memory.mem_get_info()]
        """,
        conf="host_capacity_mb:48",
    )
    total = 48 * MiB
    assert r["empty"] == [total, total]
    assert r["one"] == [total - SMALL_SEGMENT, total]
    assert r["str"] == r["one"]
    assert r["types"] == ["int", "int"]


def test_capacity_from_env_raises_torch_oom_and_recovers(run_child):
    _, r = run_child(
        """
        memalloc.enable()
        R["total"] = memalloc.memory.mem_get_info()[1]
        keep = host.empty(1000, torch.float32)
        keep.fill_(2.0)
        R["before"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        try:
            host.empty(32 << 20, torch.uint8)
        except torch.OutOfMemoryError as e:
            R["oom"] = [type(e).__name__, isinstance(e, RuntimeError), str(e)]
        else:
            R["oom"] = None
        R["after"] = [memalloc.memory.memory_allocated(), memalloc.memory.memory_reserved()]
        R["num_ooms"] = memalloc.memory.memory_stats_raw()["num_ooms"]
        later = host.empty(12 << 20, torch.uint8)   # >= 10 MiB: own 12 MiB segment, fits in 16
        later[0] = 1; later[-1] = 3
        R["later"] = [int(later[0]), int(later[-1]), memalloc.memory.memory_allocated()]
        R["keep"] = float(keep.sum())
        memalloc.installed_allocator().validate()
        """,
        conf="host_capacity_mb:16",
    )
    assert r["total"] == 16 * MiB
    b = rnd(4000)
    assert r["before"] == [b, SMALL_SEGMENT]
    assert r["oom"] is not None, "a 32 MiB tensor fit in a 16 MiB device"
    name, is_runtime, msg = r["oom"]
    assert name == "OutOfMemoryError" and is_runtime
    assert "Tried to allocate 32.00 MiB" in msg
    assert "16.00 MiB" in msg  # the capacity
    assert r["after"][0] == b
    assert r["num_ooms"] == 1
    assert r["later"] == [1, 3, b + 12 * MiB]
    assert r["keep"] == 2.0 * 1000


def test_enable_config_overrides_env(run_child):
    _, r = run_child(
        """
        R["backend"] = memalloc.enable(config="host_capacity_mb:32")
        a = memalloc.installed_allocator()
        R["total"] = memalloc.memory.mem_get_info()[1]
        R["config"] = a.config
        R["oom"] = err(lambda: host.empty(40 << 20, torch.uint8))
        """,
        conf="host_capacity_mb:16,max_split_size_mb:64",
    )
    assert r["backend"] == "host"
    assert r["total"] == 32 * MiB
    assert "host_capacity_mb:32" in r["config"]
    assert "max_split_size_mb:64" in r["config"]  # env keys not overridden stay
    assert r["oom"][0] == "OutOfMemoryError"


def test_free_of_unknown_pointer_and_double_free_raise_invalid_pointer_error():
    assert issubclass(memalloc.errors.InvalidPointerError, ValueError)
    assert issubclass(memalloc.errors.InvalidArgumentError, ValueError)
    assert issubclass(memalloc.MemallocError, RuntimeError)
    assert issubclass(memalloc.errors.DriverError, memalloc.MemallocError)

    a = memalloc.Allocator("host")
    p = a.malloc(1000)
    assert a.stats()["allocated_bytes"]["all"]["current"] == rnd(1000)
    before = a.stats()

    with pytest.raises(memalloc.errors.InvalidPointerError, match="unknown pointer"):
        a.free(12345)
    with pytest.raises(ValueError):
        a.free(12345)
    # Inside a segment but not the start of a live block.
    with pytest.raises(memalloc.errors.InvalidPointerError, match="double free"):
        a.free(p + 512)
    assert a.stats() == before
    a.validate()

    a.free(p)
    freed = a.stats()
    assert freed["allocated_bytes"]["all"]["current"] == 0
    assert freed["allocation"]["all"]["freed"] == 1

    with pytest.raises(memalloc.errors.InvalidPointerError, match="double free"):
        a.free(p)
    assert a.stats() == freed
    a.validate()
    # Freeing on another (nonexistent) device is an argument error.
    q = a.malloc(10)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        a.free(q, 1)
    a.free(q)
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_allocator_object_basics():
    a = memalloc.Allocator("host", "host_capacity_mb:64,host_devices:3")
    assert a.backend_name == "host"
    assert a.device_count == 3
    assert a.config == memalloc.core._config.config_text("host_capacity_mb:64,host_devices:3", use_env=False)
    assert a.mem_get_info(2) == (64 * MiB, 64 * MiB)
    assert a.malloc(0) == 0  # zero bytes: no allocation
    assert a.stats(0)["allocation"]["all"]["allocated"] == 0
    with pytest.raises(ValueError, match="unknown backend"):
        memalloc.Allocator("gpu")
    with pytest.raises(ValueError, match="host_capacity_mb"):
        memalloc.Allocator("host", "host_capacity_mb:x")


def test_public_names_exist():
    for name in memalloc.__all__:
        assert hasattr(memalloc, name), name
    assert memalloc.config_keys() == CONFIG_KEYS
    gc.collect()
