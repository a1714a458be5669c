"""A clean training loop under torch.compile on a real model reports no leak
(issue 23): GPT-2 from a small config, sequence lengths drawn per step (so
dynamo recompiles for dynamic shapes), compiled with the "aot_eager" backend
(AOTAutograd's joint graph and its saved tensors, without inductor's C++
compile, which takes minutes on 2 cores), on the host backend with torch's CPU
tensors allocated by memalloc. Slow tier: compiling takes ~25 s here. The GPU
suite runs the same loop under inductor (tests/gpu/test_cuda_leaks_real_models.py).
"""

from __future__ import annotations

import gc
import sys

import pytest
from memtest_helpers import REPO

import memalloc

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO / "tests" / "leak_cases"))
import real_models  # noqa: E402  (tests/leak_cases, put on the path above)


@pytest.mark.parametrize("case", [fn.__name__ for fn in real_models.COMPILED])
def test_compiled_clean_loop_reports_no_leak(case):
    a = memalloc.Allocator("host", "host_capacity_mb:2048")
    with memalloc.host.cpu_tensors_from(a):
        check, _ = getattr(real_models, case)(allocator=a)
        report = check.report
        # the loop ran: every step sampled, and the compiled model allocated through memalloc
        d = report.to_dict()
        assert d["steps"][-1] - d["steps"][0] == real_models.STEPS - 1, report.to_text()
        assert min(d["allocated"]) > 0, report.to_text()
        assert report.leaks == [], report.to_text()
        del check
    gc.collect()
    a.validate()
