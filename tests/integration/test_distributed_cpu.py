"""DDP and FSDP2 under memalloc on the CPU: two ranks over gloo (torchrun),
each mode in its own job (tests/libraries/dist_cases.py): torch's CPU
allocator, memalloc's host backend, and the host backend with expandable
segments. The same CPU kernels on the same data: every rank's losses and
its full-parameter checksum equal native's, bit for bit, in both memalloc
modes; memalloc held the models' memory (its allocation count), no hook
failed, and each rank's allocator validates. The two-GPU runs of the same
libraries over NCCL (issue 26) wait for a two-GPU machine
(tests/gpu/compat_cases.py: fsdp2, nccl).
"""

from __future__ import annotations

import sys

import pytest
from memtest_helpers import REPO

# the slow tier (CI runs it, `-m slow`): three torchrun jobs of two ranks (~40 s), over the README's fast-tier budget of
# 180 s on CI's 2 cores
pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "libraries" / "dist_cases.py"
sys.path.insert(0, str(SCRIPT.parent))
from dist_cases import MODES, check_memalloc_held_the_memory, check_same_as_native, run_jobs  # noqa: E402


@pytest.fixture(scope="module")
def jobs(fresh_python, tmp_path_factory) -> dict:
    return run_jobs(tmp_path_factory.mktemp, fresh_python.env())


@pytest.mark.parametrize("case", ["ddp", "fsdp2"])
@pytest.mark.parametrize("mode", MODES[1:])
def test_same_losses_and_parameters_as_native(jobs, mode, case):
    check_same_as_native(jobs, mode, case)  # the same CPU kernels: bit for bit


@pytest.mark.parametrize("mode", MODES[1:])
def test_memalloc_held_the_memory_of_every_rank(jobs, mode):
    check_memalloc_held_the_memory(jobs, mode)
