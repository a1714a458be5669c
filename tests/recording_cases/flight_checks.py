"""The flight recorder's end-to-end checks, shared by the host suite
(tests/integration/test_flight_recorder.py, backend "host") and the GPU
suite (tests/gpu/test_cuda_flight.py, backend "cuda"), so that both run the
same programs and assert the same things: a killed loop's file read back
by ``postmortem`` (the keeping line first) and as a memory_viz snapshot
that torch's own viewer reads; ``top --once`` against a live process; and
``torchrun`` with two ranks merged by ``report DIR --html``.

Every check computes its truth from the program it ran (the lines marked in
its source, what the live process says it holds), never from figures
written here.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

from memalloc.trace import flight_files as ff
from memalloc.trace.flight_report import live_sites

REPO = Path(__file__).resolve().parents[2]
LOOP = REPO / "tests" / "recording_cases" / "flight_loop.py"
TWO_RANKS = REPO / "tests" / "recording_cases" / "two_ranks.py"
KEEP_LINE = next(i for i, l in enumerate(LOOP.read_text().splitlines(), 1) if l.rstrip().endswith("# KEEP-LINE"))


def env() -> dict:
    """The environment of every child: this checkout importable, no MEMALLOC_CONF of the caller's."""
    e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    e.pop("MEMALLOC_CONF", None)
    return e


def run_loop(
    mode: str, directory, records: int = 4096, backend: str = "host", timeout: int = 120
) -> subprocess.CompletedProcess:
    """tests/recording_cases/flight_loop.py MODE DIR RECORDS BACKEND."""
    return subprocess.run(
        [sys.executable, str(LOOP), mode, str(directory), str(records), backend],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def memalloc_cli(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "memalloc", *args], env=env(), capture_output=True, text=True, timeout=timeout
    )


def memalloc_run(*args: str, ranks: int = 1, timeout: int, cwd=None) -> subprocess.CompletedProcess:
    """``python -m memalloc run ARGS...`` in one process, or with ``ranks`` > 1
    under ``torchrun --standalone --nproc_per_node RANKS`` (torch.distributed.run,
    the module behind the torchrun script) as a job of that many ranks; the
    children get env(). Returns the finished process, its output captured."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else []
    return subprocess.run(
        [sys.executable, *launcher, "-m", "memalloc", "run", *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def check_postmortem(killed_dir) -> str:
    """postmortem of the loop killed after step 20: no clean exit, last step
    21, and the keeping line first among live memory (21 kept tensors of
    16 KiB). Returns its text."""
    p = memalloc_cli("postmortem", str(killed_dir), "--events", "3")
    assert p.returncode == 0, p.stderr
    assert "no clean exit" in p.stdout and "last step: 21" in p.stdout, p.stdout
    first_site = p.stdout.split("live memory at the end by line")[1].splitlines()[1]
    assert f"{LOOP}:{KEEP_LINE} in <module>" in first_site and "336.00 KiB in 21 blocks" in first_site, p.stdout
    check_split_line(p.stdout, "  breakdown at the last finished step: ", killed_dir)
    return p.stdout


SPLIT_ENTRY = re.compile(r"(\w+) ([\d.]+ [KMGT]?i?B) \((\d+)%\)")


def check_split_line(text: str, prefix: str, directory) -> None:
    """The breakdown line (postmortem, top): every category the file's last
    checkpoint holds bytes in, as memalloc.core._format.fmt_bytes writes them,
    largest first, with shares that add up to 100% (to rounding)."""
    from memalloc.core._format import fmt_bytes

    (line,) = [l for l in text.splitlines() if l.startswith(prefix)]
    entries = SPLIT_ENTRY.findall(line[len(prefix) :])
    (path,) = ff.files_in(directory)
    (dev,) = ff.read(path).checkpoint["devices"]
    split = {c: b for c, b in dev["breakdown"]["split"].items() if b}
    assert [(c, t) for c, t, _ in entries] == [
        (c, fmt_bytes(b)) for c, b in sorted(split.items(), key=lambda kv: -kv[1])
    ]
    assert abs(sum(int(pct) for _, _, pct in entries) - 100) <= len(entries), line


def check_snapshot(killed_dir) -> None:
    """postmortem --snapshot writes a pickle that torch's _memory_viz reads:
    its trace is the ring's, the keeping line's 21 allocations are in it,
    and its live blocks are the ones postmortem lists as live."""
    from torch.cuda import _memory_viz as mv

    p = memalloc_cli("postmortem", str(killed_dir), "--snapshot")
    assert p.returncode == 0, p.stderr
    (path,) = ff.files_in(killed_dir)
    snap = pickle.loads(open(path + ".pickle", "rb").read())
    f = ff.read(path)
    (trace,) = snap["device_traces"]
    assert [e["action"] for e in trace] == [e.action for e in f.rings[0]]
    keeps = [
        e
        for e in trace
        if e["action"] == "alloc"
        and e["frames"]
        and (e["frames"][0]["filename"], e["frames"][0]["line"]) == (str(LOOP), KEEP_LINE)
    ]
    assert len(keeps) == 21
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert live == sum(b for _, b, _ in live_sites(f, 0))
    text = mv.segments(snap, format_flamegraph=lambda x: x)  # torch's own viewer code reads it
    assert f"flight_loop.py:{KEEP_LINE}" in text


# A live process for top --once: 7 steps, each keeping one more 32 KiB
# tensor (the HOLDER line) and doing a step's work; it prints what it holds
# (memalloc.memory.memory_allocated, bytes) and waits until the test has looked.
LIVE = """
import sys, torch, memalloc
backend = {backend!r}
memalloc.enable(backend=backend, config="host_capacity_mb:64,flight_recorder:{d}")
if backend == "host":
    memalloc.host.use_for_cpu_tensors()
device = "cpu" if backend == "host" else "cuda"
kept = []
w = torch.randn(384, 384, device=device)
for step in range(7):
    kept.append(torch.ones(8192, device=device))  # HOLDER
    for _ in range(8):
        w = torch.tanh(w @ w)  # a step's work: the call sites are named again within 0.5% of it
    memalloc.step()
if device == "cuda":
    torch.cuda.synchronize()
print("ready", memalloc.memory.memory_allocated(0), flush=True)
sys.stdin.readline()  # stays alive until the test has looked
"""


def check_top(directory, backend: str = "host") -> None:
    """top --once, by PID, by DIR and across the machine, against a live
    process: its step, what it holds (as the process itself says), and the
    holder line's tensors; a process that has ended is named as gone."""
    from memalloc.core._format import fmt_bytes

    child = subprocess.Popen(
        [sys.executable, "-c", LIVE.format(d=directory, backend=backend)],
        env=env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = child.stdout.readline().split()
        assert ready[:1] == ["ready"], child.stderr.read()
        allocated = int(ready[1])
        if backend == "host":  # the kept tensors and w, as the script makes them (CUDA adds cuBLAS's workspace)
            assert allocated == 7 * 8192 * 4 + 384 * 384 * 4, allocated
        holder = next(i for i, l in enumerate(LIVE.splitlines(), 1) if l.endswith("# HOLDER"))
        for target in (str(child.pid), str(directory)):
            p = memalloc_cli("top", "--once", target)
            assert p.returncode == 0, p.stderr
            assert f"pid {child.pid} (rank 0/1, {backend}) step 7" in p.stdout, p.stdout
            assert f"allocated {fmt_bytes(allocated)}" in p.stdout, (allocated, p.stdout)
            # the call sites are those of the last step, or of the step the view names when they are
            # named again less often (0.5% of the run's time): one more 32 KiB tensor per step
            stale = re.search(r"call sites as of step (\d+)", p.stdout)
            n = int(stale.group(1)) if stale else 7
            assert f"{32 * n:.2f} KiB in {n} tensors  <string>:{holder} in <module>" in p.stdout, p.stdout
            check_split_line(p.stdout, "    by category: ", directory)
        p = memalloc_cli("top", "--once")
        assert f"pid {child.pid} " in p.stdout  # found among every process of the machine
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    p = memalloc_cli("top", "--once", str(child.pid))
    assert p.returncode != 0 and f"no process {child.pid}" in p.stderr


def run_job(out: Path, backend: str = "host", timeout: int = 300, device: str | None = None):
    """torchrun --nproc_per_node 2 -m memalloc run on two_ranks.py (its
    tensors on the CPU for the host backend, on the one GPU for cuda, or
    ``device`` as two_ranks.py takes it: cuda_per_rank), then ``python -m
    memalloc report DIR --html``: (text, page path, script, its marked
    lines)."""
    src = TWO_RANKS.read_text().splitlines()
    lines = {m: next(i for i, l in enumerate(src, 1) if l.endswith(f"# {m}")) for m in ("HOLD-LINE", "LEAK-LINE")}
    device = device or ("cpu" if backend == "host" else "cuda")
    p = memalloc_run(
        "--backend",
        backend,
        "--steps",
        "--config",
        "flight_recorder_keep:True",
        "--out",
        str(out),
        str(TWO_RANKS),
        device,
        ranks=2,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    files = [ff.read(f) for f in ff.files_in(out / "flight")]
    assert sorted((f.rank, f.world_size, f.backend) for f in files) == [(0, 2, backend), (1, 2, backend)]
    page = out / "job.html"
    r = memalloc_cli("report", str(out / "flight"), "--html", str(page))
    assert r.returncode == 0, r.stderr
    return r.stdout, page, TWO_RANKS, lines


def check_job(text: str, page: Path, script: Path, lines: dict) -> None:
    """The merged report names rank 1 as standing out (1 MiB held more, at
    its line) and rank 0's leak (16 KiB per step, at its line); the HTML page
    has a row and a series per rank."""
    assert "2 rank(s)" in text and "rank 0 (pid" in text and "rank 1 (pid" in text, text
    stands = text.split("rank 1 stands out")[1].splitlines()
    assert f"{script}:{lines['HOLD-LINE']} in <module>" in stands[1] and "+1.00 MiB" in stands[1], text
    assert f"rank 0 leaks: {script}:{lines['LEAK-LINE']} in <module> grows by 16.00 KiB per step" in text, text
    assert "rank 1 leaks" not in text, text
    html_text = page.read_text()
    assert 'polyline class="series rank-0"' in html_text and 'polyline class="series rank-1"' in html_text
    assert '<tr data-rank="1"' in html_text and 'id="outliers"' in html_text
