"""pytest plugin for running torch's own allocator tests (upstream files,
unmodified) natively or under memalloc: benchmarks/compat/conformance.py loads it
with ``-p benchmarks.compat.conformance_plugin`` in each child pytest.

Environment (set by the runner):
- ``MEMALLOC_CONFORMANCE_MODE``: ``native`` or ``memalloc``. ``memalloc``
  calls ``memalloc.enable()`` when the plugin loads, before pytest imports
  the test module (the module reads device properties at import).
- ``MEMALLOC_CONFORMANCE_NATIVE_SETTINGS``: native mode: allocator settings
  (``expandable_segments:True``) given to torch at load through
  ``torch.cuda.memory._set_allocator_settings``, where the tests, which read
  ``PYTORCH_CUDA_ALLOC_CONF``, do not see them.
- ``MEMALLOC_CONFORMANCE_SELECT``: ``cuda`` (the allocator tests of
  test/test_cuda.py) or ``trees`` (the pool, checkpoint and liveness tests
  of test/inductor/test_cudagraph_trees.py).
- ``MEMALLOC_CONFORMANCE_SKIP``: a file of node ids not to run again (done,
  or crashed the process, in an earlier pass of the runner).
- ``MEMALLOC_CONFORMANCE_ONLY``: a file of node ids: run only these (the
  tests an earlier run's budget left unrun); a file none of them names
  runs whole.
- ``MEMALLOC_CONFORMANCE_LOG``: a JSON-lines file: {"start": id} when a test
  starts and {"id", "outcome", "message"} when it ends, flushed at once so
  that a crash leaves the last started test behind.
- ``MEMALLOC_CONFORMANCE_LIVE``: ``1``: after each test's isolation (below)
  the log gets {"after": id, "allocated": bytes, "blocks": [...]}: what is
  still allocated between tests, with the largest live blocks of
  ``torch.cuda.memory_snapshot()`` (bytes, and their frames when history is
  on), so that a run natively and one under memalloc can be compared test by
  test. ``history``: the same, with torch's memory history recorded from the
  plugin's load (``_record_memory_history``; it changes what history tests
  see, so only for runs that look for the owner of a difference).
- ``MEMALLOC_CONFORMANCE_TEST_TIMEOUT``: seconds one test may run (0 = no
  limit): past it every thread's Python stack goes to stderr and the process
  exits (faulthandler), so the runner records the test as crashed, with
  where it hung, and goes on with the others.

The shims give torch 2.11's testing package the names newer upstream files
import (``TEST_CUDAMALLOCASYNC``, ``HAS_CUDA``, the ``expecttest`` package
that the GPU image lacks); the test files themselves are not changed.
"""

from __future__ import annotations

import ast
import faulthandler
import functools
import gc
import importlib
import json
import os
import re
import sys
import types
import unittest

MODE = os.environ.get("MEMALLOC_CONFORMANCE_MODE", "native")
SELECT = os.environ.get("MEMALLOC_CONFORMANCE_SELECT", "")
NATIVE_SETTINGS = os.environ.get("MEMALLOC_CONFORMANCE_NATIVE_SETTINGS", "")

# test/test_cuda.py: whole classes about the allocator, and TestCuda's tests
# whose names are about memory (stats, caching, record_stream, OOM, the
# fraction, graphs and their pools, snapshots, history); host (pinned)
# memory is torch's host allocator, not the one memalloc replaces.
CUDA_CLASSES = ("TestCudaMallocAsync", "TestMemPool", "TestBlockStateAbsorption", "TestFXMemoryProfiler")
CUDA_NAMES = re.compile(
    r"memory|alloc|cach|stats|record_stream|oom|fraction|graph|pool|snapshot|history|"
    r"empty_cache|expandable|workspace|segment|leak"
)
CUDA_EXCLUDE = re.compile(r"pinned|host_memory|cudart_register")
# test/inductor/test_cudagraph_trees.py (229 tests, each compiling): the
# graph-tree tests about pools, checkpoints, liveness and deallocation, and
# the basic forward/backward runs (56 names, about a quarter).
TREES_NAMES = re.compile(
    r"memory|pool|checkpoint|dealloc|live|storage|multi_dispatch|free|workspace|allocat|"
    r"cleanup|dies|persist|run_simple|forward_backward|separate_recordings|mark_step|warmup"
)


def selected(nodeid: str) -> bool:
    """Whether a test of the selection runs (by its pytest node id)."""
    parts = nodeid.split("::")
    cls, name = (parts[-2], parts[-1]) if len(parts) >= 3 else ("", parts[-1])
    if SELECT == "cuda":
        if cls.startswith(CUDA_CLASSES):
            return True
        return cls == "TestCuda" and bool(CUDA_NAMES.search(name)) and not CUDA_EXCLUDE.search(name)
    if SELECT == "trees":
        return bool(TREES_NAMES.search(name))
    return True


def _shim_testing_package() -> None:
    """Names newer upstream test files import that torch 2.11 lacks."""
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            stub = types.ModuleType("expecttest")

            class TestCase(unittest.TestCase):
                def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 - upstream's name
                    self.assertEqual(str(actual).strip(), str(expect).strip())

            stub.TestCase = TestCase
            sys.modules["expecttest"] = stub
    import torch
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        common_utils.TEST_CUDAMALLOCASYNC = (
            torch.cuda.is_available() and torch.cuda.get_allocator_backend() == "cudaMallocAsync"
        )
    if not hasattr(common_utils, "EXPANDABLE_SEGMENTS"):
        conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")  # torch's order
        common_utils.EXPANDABLE_SEGMENTS = "expandable_segments:True" in conf
    try:
        from torch.testing._internal import inductor_utils

        if not hasattr(inductor_utils, "HAS_CUDA") and hasattr(inductor_utils, "HAS_CUDA_AND_TRITON"):
            inductor_utils.HAS_CUDA = inductor_utils.HAS_CUDA_AND_TRITON
    except ImportError:
        pass


def _lacking() -> unittest.SkipTest:
    return unittest.SkipTest(
        f"this torch ({sys.modules['torch'].__version__}) lacks a name the upstream test file imports"
    )


class _Skipper:
    """What a missing decorator factory or context manager gives: the test
    it decorates, or the block it opens, is skipped."""

    def __call__(self, fn):
        @functools.wraps(fn)
        def skipped(*args, **kwargs):
            raise _lacking()

        return skipped

    def __enter__(self):
        raise _lacking()

    def __exit__(self, *exc):
        return False


class _Missing:
    """A name the upstream file imports that this torch lacks, so that the
    file imports and the tests that use the name are skipped (in both modes
    alike): called on a class (a registration at import time) it returns
    the class; called otherwise it is a decorator or context manager that
    skips."""

    def __new__(cls, *args, **kwargs):
        if args and isinstance(args[0], type):
            return args[0]
        return _Skipper()


SHIMMED: list = []


def _shim_missing_imports(path: str) -> None:
    """For each top-level ``from M import a, b`` of the upstream file whose
    module or names this torch lacks, a stand-in (_Missing), listed in
    SHIMMED and in the log, so that the file imports and every other test
    runs."""
    tree = ast.parse(open(path).read(), filename=path)
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            continue
        if not node.module.startswith("torch"):
            continue
        try:
            module = importlib.import_module(node.module)
        except ImportError:
            module = types.ModuleType(node.module)
            sys.modules[node.module] = module
            SHIMMED.append(node.module)
        for alias in node.names:
            if alias.name != "*" and not hasattr(module, alias.name):
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                except ImportError:
                    setattr(module, alias.name, _Missing)
                    SHIMMED.append(f"{node.module}.{alias.name}")


if MODE == "memalloc":
    import memalloc

    memalloc.enable(backend="cuda")
elif NATIVE_SETTINGS:
    import torch

    torch.cuda.memory._set_allocator_settings(NATIVE_SETTINGS)
if os.environ.get("MEMALLOC_CONFORMANCE_SHIMS", "1") != "0":  # "0": a stand-in file needs none (tests)
    _shim_testing_package()
if os.environ.get("MEMALLOC_CONFORMANCE_FILE"):
    _shim_missing_imports(os.environ["MEMALLOC_CONFORMANCE_FILE"])

_log = open(os.environ["MEMALLOC_CONFORMANCE_LOG"], "a") if os.environ.get("MEMALLOC_CONFORMANCE_LOG") else None


def _write(entry: dict) -> None:
    if _log is not None:
        _log.write(json.dumps(entry) + "\n")
        _log.flush()
        os.fsync(_log.fileno())


if SHIMMED:
    _write({"shims": SHIMMED})
# What the run's allocator was set to, as the results' meta shows it: under
# memalloc its installed config (canonical text: expandable segments when
# its default holds), natively what torch was given (torch 2.11's settings
# getter answers '' whatever was set, so the settings are recorded as given).
if MODE == "memalloc":
    _write({"allocator_config": memalloc.installed_allocator().config})
else:
    _write(
        {
            "allocator_config": {
                "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF", ""),
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "_set_allocator_settings": NATIVE_SETTINGS,
            }
        }
    )


def pytest_collection_modifyitems(config, items) -> None:
    skip = set()
    path = os.environ.get("MEMALLOC_CONFORMANCE_SKIP")
    if path and os.path.exists(path):
        skip = {line.strip() for line in open(path) if line.strip()}

    def in_file(nodeid: str) -> str:  # "Class::test", whatever the path before it
        return nodeid.split(".py::", 1)[-1]

    only = None
    if os.environ.get("MEMALLOC_CONFORMANCE_ONLY"):
        lines = [line.strip() for line in open(os.environ["MEMALLOC_CONFORMANCE_ONLY"]) if line.strip()]
        this_file = os.path.basename(os.environ.get("MEMALLOC_CONFORMANCE_FILE", ""))
        mine = [l for l in lines if ".py::" not in l or os.path.basename(l.split(".py::", 1)[0] + ".py") == this_file]
        only = {in_file(l) for l in mine} if mine else None  # a list naming no test of this file leaves it whole
    keep = [
        it
        for it in items
        if selected(it.nodeid) and it.nodeid not in skip and (only is None or in_file(it.nodeid) in only)
    ]
    dropped = [it for it in items if it not in keep]
    items[:] = keep
    config.hook.pytest_deselected(items=dropped)


TEST_TIMEOUT = float(os.environ.get("MEMALLOC_CONFORMANCE_TEST_TIMEOUT", "0") or 0)
# The process's own stderr, taken before pytest captures fd 2: the dump must
# reach the runner's log, not a capture file that dies with the process.
_DUMP_TO = os.fdopen(os.dup(2), "w") if TEST_TIMEOUT > 0 else None


def pytest_runtest_logstart(nodeid, location) -> None:
    _write({"start": nodeid})
    if TEST_TIMEOUT > 0:
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=_DUMP_TO)


def pytest_runtest_logfinish(nodeid, location) -> None:
    if TEST_TIMEOUT > 0:
        faulthandler.cancel_dump_traceback_later()


def pytest_runtest_teardown(item, nextitem) -> None:
    """Isolation between tests, the same in both modes: upstream tests that
    fail before their own cleanup leave a memory fraction (and cached
    blocks) that fail the tests after them; each test starts from fraction
    1.0 and an empty cache."""
    torch = sys.modules.get("torch")  # a file that never imported torch has nothing to reset
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        for d in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(1.0, d)
        torch.cuda.empty_cache()
        if LIVE:
            _write({"after": item.nodeid, "allocated": torch.cuda.memory_allocated(), "blocks": _live_blocks(torch)})


LIVE = os.environ.get("MEMALLOC_CONFORMANCE_LIVE", "")


def _live_blocks(torch, most: int = 40) -> list:
    """The largest blocks still allocated (bytes, and the frames of their
    allocation where history is recorded), for MEMALLOC_CONFORMANCE_LIVE."""
    if torch.cuda.memory_allocated() == 0:
        return []
    blocks = []
    for seg in torch.cuda.memory_snapshot():
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                frames = [f"{f['filename']}:{f['line']} {f['name']}" for f in (b.get("frames") or [])[:8]]
                blocks.append({"bytes": b["size"], "pool": str(seg.get("segment_pool_id")), "frames": frames})
    blocks.sort(key=lambda b: -b["bytes"])
    return blocks[:most]


if LIVE == "history":
    import torch as _torch

    _torch.cuda.memory._record_memory_history(max_entries=200000)


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        message = ""
        if report.outcome == "failed":
            message = str(report.longrepr)[-4000:]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])[:300]
        _write({"id": report.nodeid, "outcome": report.outcome, "message": message})
    elif report.when == "teardown" and report.outcome == "failed":
        _write({"id": report.nodeid, "outcome": "failed", "message": "teardown: " + str(report.longrepr)[-4000:]})
