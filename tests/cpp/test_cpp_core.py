"""The C++ core on its own: compiled with g++ -std=c++17, without torch or
Python, it runs a repeating allocation pattern and proves that the steady
state makes no host allocation (operator new is counted); and the C++ unit
tests of its parts (tests/cpp/*_test.cpp, each part on its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # CI runs it; `pytest -m 'not slow'` skips it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.cpu import core_build  # noqa: E402  (the one builder of the standalone core)

FLAGS = [
    "-std=c++17",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-pthread",
    "-Wno-mismatched-new-delete",
]  # steady_state.cpp replaces new/delete as a pair


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    # Raises core_build.BuildError, with the compiler's output, unless it builds.
    built = core_build.build_executable(
        "steady_state", [os.path.join(REPO, "tests", "cpp", "steady_state.cpp")], tmp_path_factory.mktemp("cpp"), FLAGS
    )
    assert "warning" not in built.warnings, built.warnings[-4000:]
    return str(built.binary)


def test_core_is_plain_cxx17_and_steady_state_makes_no_host_allocation(binary):
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=120)
    values = dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(values["steady_state_operator_new_calls"]) == 0
    assert int(values["rounds"]) == 20000
    # 10 allocations a round, plus the warm-up rounds; all but a few come
    # from the cache.
    assert int(values["allocations"]) == 10 * (20000 + 3)
    assert int(values["device_allocs"]) < 20


# Every tests/cpp/<part>_test.cpp is one part's unit tests: it prints
# "failures=N" and exits 0 only when N is 0.
PARTS = sorted(p.name[: -len("_test.cpp")] for p in (Path(REPO) / "tests" / "cpp").glob("*_test.cpp"))


def test_every_part_has_unit_tests():
    assert "stream_events" in PARTS, PARTS


@pytest.mark.parametrize("part", PARTS)
def test_part_unit_tests(part, tmp_path_factory):
    built = core_build.build_executable(
        f"{part}_test", [os.path.join(REPO, "tests", "cpp", f"{part}_test.cpp")], tmp_path_factory.mktemp(part), FLAGS
    )
    assert "warning" not in built.warnings, built.warnings[-4000:]
    proc = subprocess.run([str(built.binary)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "failures=0" in proc.stdout, proc.stdout + proc.stderr
