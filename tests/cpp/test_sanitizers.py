"""The C++ core under sanitizers: tests/cpp/stress.cpp (8 threads hammering
one CachingAllocator on two simulated devices; see its header) is built with
the core, standalone (g++ -std=c++17, no torch, no Python), once per flavor:

  asan_ubsan      -fsanitize=address,undefined -fno-sanitize-recover=all
  tsan            -fsanitize=thread
  plain           -O2, the reference

Operations checked per flavor (threads x operations per thread):
  asan_ubsan, plain: 8 x 1,000,000 = 8,000,000
  tsan:              8 x   300,000 = 2,400,000
TSan runs fewer because it is ~18x slower here (ASan ~9x; 2 cores); the whole file
stays under ~3 minutes. Each run must exit 0 (stress.cpp checks every counter
exactly at the end) with no sanitizer report on stderr. A flavor is skipped
only when the compiler cannot link that sanitizer's runtime (probed with a
hello-world)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

pytestmark = pytest.mark.slow  # CI runs it; `pytest -m 'not slow'` skips it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.cpu import core_build  # noqa: E402  (the one builder of the standalone core)

STRESS = os.path.join(REPO, "tests", "cpp", "stress.cpp")
COMMON = ["-std=c++17", "-g", "-pthread"]

SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1",
}
# Any of these on stderr is a sanitizer report, whatever the exit code.
REPORT_MARKERS = ["ERROR: AddressSanitizer", "runtime error:", "WARNING: ThreadSanitizer", "LeakSanitizer"]

TSAN_OPS = 300_000  # per thread; the others run 1,000,000
ASAN_UBSAN = ["-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]


@dataclass(frozen=True)
class Flavor:
    name: str
    flags: list = field(default_factory=list)  # compile and link flags (besides COMMON)
    threads: int = 8
    ops: int = 1_000_000  # per thread
    runtime: str = ""  # the -fsanitize= value to probe; "" = none needed


FLAVORS = {
    f.name: f
    for f in [
        Flavor("asan_ubsan", ASAN_UBSAN, runtime="address,undefined"),
        Flavor("tsan", ["-O1", "-fsanitize=thread", "-fno-omit-frame-pointer"], ops=TSAN_OPS, runtime="thread"),
        Flavor("plain", ["-O2"]),
    ]
}


class Builder:
    """Builds stress.cpp + the core once per flavor, on first use, with
    benchmarks/cpu/core_build.py (each translation unit in parallel)."""

    def __init__(self, root):
        self.root = root
        self.binaries = {}  # flavor -> (path,) or the reason to skip
        self.seconds = {}

    def get(self, name):
        if name in self.binaries:
            return self.binaries[name]
        flavor = FLAVORS[name]
        if flavor.runtime:
            output = core_build.probe([*COMMON, "-fsanitize=" + flavor.runtime], self.root)
            if output is not None:
                why = (
                    f"{core_build.find_compiler()} cannot build with -fsanitize={flavor.runtime} (sanitizer "
                    f"runtime missing? on Debian: apt-get install libasan8 libubsan1 libtsan2): "
                    f"{output.strip()[-400:]}"
                )
                self.binaries[name] = why
                return why
        # Raises core_build.BuildError, with the compiler's output, unless it builds.
        built = core_build.build_executable(name, [STRESS], self.root, [*COMMON, *flavor.flags])
        self.binaries[name] = (str(built.binary),)
        self.seconds[name] = built.seconds
        return self.binaries[name]


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    return Builder(str(tmp_path_factory.mktemp("sanitizers")))


def run_stress(builder, name):
    built = builder.get(name)
    if isinstance(built, str):
        pytest.skip(built)
    flavor = FLAVORS[name]
    env = dict(os.environ, **SANITIZER_ENV)
    t0 = time.monotonic()
    proc = subprocess.run(
        [built[0], f"--threads={flavor.threads}", f"--ops={flavor.ops}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.monotonic() - t0
    print(
        f"\n[{name}] build {builder.seconds.get(name, 0):.1f} s, run {seconds:.1f} s, "
        f"{flavor.threads} threads x {flavor.ops} ops\n{proc.stdout}"
    )
    return proc


def check(proc, flavor):
    reports = [m for m in REPORT_MARKERS if m in proc.stderr]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-8000:]}"
    assert not reports, f"sanitizer report ({', '.join(reports)}):\n{proc.stderr[-8000:]}"
    values = dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)
    assert proc.stdout.rstrip().endswith("OK"), proc.stdout
    assert int(values["threads"]) == flavor.threads
    assert int(values["ops"]) == flavor.threads * flavor.ops
    assert int(values["mallocs"]) == int(values["frees"]) > 0
    # Every kind of operation happened (the program checks their effect).
    for key in ("ooms", "record_streams", "syncs", "empty_caches", "reader_iterations", "device_allocs"):
        assert int(values[key]) > 0, key


@pytest.mark.parametrize("name", ["asan_ubsan", "tsan", "plain"])
def test_stress_under_sanitizer(builder, name):
    check(run_stress(builder, name), FLAVORS[name])
