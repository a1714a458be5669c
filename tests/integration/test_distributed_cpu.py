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

import json
import subprocess
import sys

import pytest

from memtest_helpers import REPO

SCRIPT = REPO / "tests" / "libraries" / "dist_cases.py"
MODES = ("native", "memalloc", "memalloc_expandable")


@pytest.fixture(scope="module")
def jobs(fresh_python, tmp_path_factory) -> dict:
    out = {}
    for mode in MODES:
        d = tmp_path_factory.mktemp(mode)
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            str(SCRIPT), mode, str(d)], cwd=REPO, env=fresh_python.env(), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"{mode}: rc {p.returncode}\n{p.stderr[-3000:]}"
        out[mode] = [json.loads((d / f"rank{r}.json").read_text()) for r in range(2)]
    return out


@pytest.mark.parametrize("case", ["ddp", "fsdp2"])
@pytest.mark.parametrize("mode", MODES[1:])
def test_same_losses_and_parameters_as_native(jobs, mode, case):
    for rank in range(2):
        got, want = jobs[mode][rank][case], jobs["native"][rank][case]
        assert "error" not in got, got.get("error")
        assert "error" not in want, want.get("error")
        assert (got["losses"], got["param_sum"]) == (want["losses"], want["param_sum"])
    # the ranks trained on their own data and ended with the same parameters
    ranks = jobs["native"]
    assert ranks[0][case]["losses"] != ranks[1][case]["losses"]
    assert ranks[0][case]["param_sum"] == ranks[1][case]["param_sum"]


@pytest.mark.parametrize("mode", MODES[1:])
def test_memalloc_held_the_memory_of_every_rank(jobs, mode):
    for rank, r in enumerate(jobs[mode]):
        assert (r["rank"], r["world_size"]) == (rank, 2)
        m = r["memalloc"]
        assert m["allocations"] > 100 and m["peak_allocated"] > 0, m
        assert m["hook_failures"] == {} and m["validate"] == "passed", m
        assert m["expandable"] == (mode == "memalloc_expandable"), m
