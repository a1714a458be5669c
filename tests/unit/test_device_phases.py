"""benchmarks/device/tests.sh runs the GPU suite in phases (lanes, cuda,
expandable, ...), each naming its test files: a GPU test file that no phase
names never runs on the device (tests/gpu/test_cuda_callbacks.py was left
out so, the session it was written). Reads the script; needs no GPU."""

from __future__ import annotations

import re

from memtest_helpers import REPO

SCRIPT = REPO / "benchmarks" / "device" / "tests.sh"


def phases_text() -> str:
    """The script's phase table: the ``case "$phase" in`` block, without the
    ``all`` phase (which takes every file and so names none)."""
    text = SCRIPT.read_text()
    block = text[text.index('case "$phase" in') : text.index("esac\n  echo")]
    return re.sub(r"\n    all\).*?;;", "", block, flags=re.S)


def test_every_gpu_test_file_runs_in_a_phase():
    named = set(re.findall(r"tests/gpu/(test_\w+\.py)", phases_text()))
    files = {p.name for p in (REPO / "tests" / "gpu").glob("test_*.py")}
    assert files - named == set(), f"GPU test files in no phase of {SCRIPT.name}: {sorted(files - named)}"
    assert named - files == set(), f"phases name files that do not exist: {sorted(named - files)}"
