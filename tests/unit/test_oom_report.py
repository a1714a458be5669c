"""The out-of-memory report (memalloc/features/oom.py, csrc/boundary/torch/oom_report.cpp)
on the host backend: torch.OutOfMemoryError's message names the call sites
holding the most memory; report files are written for the first N OOMs;
a failing report never hides the OOM. A fresh interpreter per scenario
(tests/conftest.py fresh_python): the message comes from the hook enable()
installs. The holders themselves are tested in-process in
test_leaks_inprocess.py (top_holders on an allocator the test owns)."""

from __future__ import annotations

import pickle

PRELUDE = """
import os, pickle
memalloc.enable(backend="host", config="host_capacity_mb:64")
host.use_for_cpu_tensors()
def oom():
    try:
        torch.empty(100 << 20, dtype=torch.uint8)  # more than the device
    except torch.OutOfMemoryError as e:
        return str(e)
    return None
"""


def line_of(src: str, marker: str) -> int:
    return next(i for i, l in enumerate(src.splitlines(), 1) if l.rstrip().endswith(marker))


def test_message_names_the_biggest_holders_and_files_are_written_once(tmp_path, fresh_python):
    _, r, src = fresh_python.code(
        PRELUDE,
        f"""
memalloc.record_history(max_entries=1000, stacks="python")
memalloc.set_oom_report(directory={str(tmp_path)!r}, max_reports=1, top=2)
big = [torch.empty(8 << 20, dtype=torch.uint8) for _ in range(3)]  # HOLDER-BIG
mid = torch.empty(4 << 20, dtype=torch.uint8)  # HOLDER-MID
tiny = torch.ones(10)  # HOLDER-TINY
R["first"], R["second"] = oom(), oom()
R["files"] = sorted(os.listdir({str(tmp_path)!r}))
R["pid"] = os.getpid()
R["ooms"] = memalloc.memory.memory_stats()["num_ooms"]
""",
    )
    first = r["first"]
    assert first.startswith("Device out of memory. Tried to allocate 100.00 MiB")
    lines = first.splitlines()
    i = lines.index("Live allocations holding the most memory (memalloc):")
    # largest first; the child's source is "<string>", so no code line follows; the
    # comprehension is its own function before Python 3.12 (PEP 709 inlines it)
    big = f"24.00 MiB in     3 allocations  <string>:{line_of(src, '# HOLDER-BIG')} in "
    assert lines[i + 1].endswith((big + "<listcomp>", big + "<module>")), lines[i + 1]
    assert lines[i + 2].endswith(f"4.00 MiB in     1 allocations  <string>:{line_of(src, '# HOLDER-MID')} in <module>")
    assert "HOLDER-TINY" not in first  # top=2
    base = f"oom-{r['pid']}-1"
    assert f"OOM report written to {tmp_path}/{base}.txt" in first
    assert "OOM report written" not in r["second"]  # max_reports=1
    assert r["files"] == [base + ".pickle", base + ".txt"]
    with open(tmp_path / (base + ".pickle"), "rb") as f:
        snap = pickle.load(f)
    assert set(snap) == {"segments", "device_traces"} and snap["device_traces"][0][-1]["action"] == "oom"
    text = (tmp_path / (base + ".txt")).read_text()
    assert "Live allocations holding the most memory" in text and "memory summary" in text
    assert r["ooms"] == 2


def test_without_call_sites_holders_are_grouped_by_tag_and_the_fix_is_named(fresh_python):
    _, r, _ = fresh_python.code(
        PRELUDE,
        """
R["mode"] = memalloc._C.stack_mode()
memalloc.record_history(max_entries=1000, stacks="tags")
with memalloc.tag("weights"):
    w = torch.empty(8 << 20, dtype=torch.uint8)
R["msg"] = oom()
""",
        conf="call_sites:False",
    )
    assert r["mode"] == 0  # call_sites:False: no stacks from enable()
    assert "in     1 allocations  tag 'weights'" in r["msg"]
    assert "(call sites are off: remove call_sites:False from MEMALLOC_CONF" in r["msg"]


def test_report_off_and_a_failing_report_keep_the_oom(fresh_python):
    _, r, _ = fresh_python.code(
        PRELUDE,
        """
memalloc.set_oom_report(False)
R["off"] = oom()
memalloc.set_oom_report(True)
def broken(*a, **k):
    raise RuntimeError("boom")
memalloc.features.oom.top_holders = broken
R["broken"] = oom()
R["bad"] = [err(lambda: memalloc.set_oom_report(max_reports=-1)), err(lambda: memalloc.set_oom_report(top=0)),
            err(lambda: memalloc.set_oom_report("yes"))]
""",
    )
    assert r["off"].startswith("Device out of memory") and "Live allocations" not in r["off"]
    assert r["broken"].startswith("Device out of memory")
    assert "(memalloc could not build the OOM report: RuntimeError: boom)" in r["broken"]
    assert [b[0] for b in r["bad"]] == ["ValueError", "ValueError", "TypeError"]
    assert "max_reports must be an int >= 0" in r["bad"][0][2]
