"""benchmarks/speed/lockstep.py without a GPU: two real worker processes whose
step is CPU work of a known size (python -m benchmarks lockstep --work N),
driven in lockstep. The ratio the driver reports must follow the work each
worker was given; a worker that dies or breaks the protocol is an error that
names it."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from benchmarks.speed import lockstep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(*args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.speed.lockstep", *args]


def run(workers: dict, steps: int) -> dict:
    return lockstep.lockstep(workers, steps=steps, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))


def test_the_ratio_follows_the_work_each_worker_does():
    r = run({"one": worker("--work", "10"), "three": worker("--work", "30")}, steps=15)
    assert 2.3 < r["ratio"] < 3.9, r["ratios"]  # three times the work per step
    assert len(r["ratios"]) == 15 and len(r["ms"]["one"]) == len(r["ms"]["three"]) == 15
    assert r["results"]["one"]["steps"] == r["results"]["three"]["steps"] == 15
    assert r["results"]["one"]["pid"] != r["results"]["three"]["pid"]  # two live processes
    assert r["median_ms"]["three"] > r["median_ms"]["one"]


def test_equal_work_gives_a_ratio_near_one():
    r = run({"a": worker("--work", "10"), "b": worker("--work", "10")}, steps=15)
    assert 0.75 < r["ratio"] < 1.33, r["ratios"]


def test_a_worker_that_dies_is_named():
    dies = [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.readline(); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"worker broken ended early \(exit 3\)"):
        run({"fine": worker("--work", "1"), "broken": dies}, steps=3)


def test_a_worker_that_does_not_say_ready_is_named():
    chatty = [sys.executable, "-c", "print('hello', flush=True)"]
    with pytest.raises(RuntimeError, match="worker chatty said 'hello' before 'ready'"):
        run({"fine": worker("--work", "1"), "chatty": chatty}, steps=3)


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="exactly two workers, got 1"):
        lockstep.lockstep({"a": worker("--work", "1")}, steps=3)
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        lockstep.lockstep({"a": worker("--work", "1"), "b": worker("--work", "1")}, steps=0)


def test_serve_times_one_step_per_command_and_stops():
    calls = []
    out = io.StringIO()
    n = lockstep.serve(lambda: calls.append(1), warmup=2, out=out, inp=io.StringIO("step\nstep\nstop\nstep\n"))
    lines = out.getvalue().split()
    assert n == 2 and len(calls) == 4  # 2 warm-up + 2 timed; nothing after stop
    assert lines[0] == "ready" and all(float(x) >= 0 for x in lines[1:]) and len(lines) == 3
    # ready() runs once, after the warm-up steps and before the first timed one
    # and after() once after each timed step, outside its time
    seen = []
    lockstep.serve(
        lambda: seen.append("step"),
        warmup=2,
        out=io.StringIO(),
        inp=io.StringIO("step\nstep\nstop\n"),
        ready=lambda: seen.append("ready"),
        after=lambda: seen.append("after"),
    )
    assert seen == ["step", "step", "ready", "step", "after", "step", "after"]
    with pytest.raises(SystemExit, match="unknown command 'go'"):
        lockstep.serve(lambda: None, warmup=0, out=io.StringIO(), inp=io.StringIO("go\n"))


def test_pooled_runs_fresh_pairs_and_takes_the_median_of_every_step_pair():
    r = lockstep.pooled(
        {"one": worker("--work", "10"), "three": worker("--work", "30")},
        process_pairs=2,
        steps=15,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert r["process_pairs"] == 2 and r["step_pairs"] == 30 and len(r["runs"]) == 2
    pids = {run["results"]["one"]["pid"] for run in r["runs"]}
    assert len(pids) == 2  # a fresh pair of processes each time
    assert 2.3 < r["median_ratio"] < 3.9 and all(2 < x < 4.5 for x in r["per_process_pair"])


# A worker that appends its pid to a file at each step: the order in which
# the driver stepped the processes.
ORDER_WORKER = """
import json, os, sys
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "stop":
        break
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    print("1.0", flush=True)
print(json.dumps({"pid": os.getpid()}))
"""


def test_a_crowd_steps_every_process_once_per_round_pair_by_pair_in_abba_order(tmp_path):
    log = tmp_path / "order"
    w = [sys.executable, "-c", ORDER_WORKER, str(log)]
    pairs = lockstep.crowd({"a": w, "b": w}, steps=4, alive=3)
    assert len(pairs) == 3
    forward = [p["results"][label]["pid"] for p in pairs for label in ("a", "b")]
    assert len(set(forward)) == 6  # six processes, alive at once
    stepped = [int(x) for x in log.read_text().split()]
    assert stepped == forward + forward[::-1] + forward + forward[::-1]
    assert all(p["ratios"] == [1.0] * 4 and p["steps"] == 4 for p in pairs)


@pytest.mark.slow  # crowds of worker processes (~5 s)
def test_pooled_crowds_give_each_pair_its_own_ratio():
    r = lockstep.pooled(
        {"one": worker("--work", "20"), "three": worker("--work", "60")},
        process_pairs=5,
        steps=9,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        alive=2,
    )
    assert r["process_pairs"] == 5 and len(r["runs"]) == 5 and r["step_pairs"] == 45 and r["alive"] == 2
    pids = {run["results"][k]["pid"] for run in r["runs"] for k in ("one", "three")}
    assert len(pids) == 10  # 2 + 2 + 1 pairs, all fresh
    # three times the work: the median over all 45 step pairs; every pair's own (9 steps, on a loaded
    # machine) at least shows the slower side
    assert 2.3 < r["median_ratio"] < 3.9 and all(x > 1.5 for x in r["per_process_pair"]), r["per_process_pair"]
    with pytest.raises(ValueError, match="alive .* must be at least 1, got 0"):
        lockstep.crowd({"one": worker("--work", "1"), "three": worker("--work", "1")}, steps=1, alive=0)


def test_a_worker_pins_every_thread_it_has_then_and_later():
    """worker.pin_to (a lockstep worker takes its cores once warmed up,
    when its threads exist already): run in a child so this process keeps
    its cores."""
    code = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from benchmarks.speed.worker import pin_to
cores = sorted(os.sched_getaffinity(0))
done = threading.Event()
before = threading.Thread(target=done.wait); before.start()
pin_to(str(cores[0]))
after = threading.Thread(target=done.wait); after.start()
seen = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
done.set(); before.join(); after.join()
print(len(seen), set(map(tuple, seen.values())) == {(cores[0],)})
"""
    out = subprocess.run([sys.executable, "-c", code, REPO], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "True"]  # the main thread, one made before and one after: all on the one core
