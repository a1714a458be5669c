"""Runs several ``python -m memalloc run ...`` command lines, each in a
process of its own, forked from this one after it has imported what every
variant imports and memalloc does not touch (torch, torch._dynamo, which
the first optimizer imports: 5 s on two busy cores, and optionally a
library such as lightning). Each child has never imported memalloc nor
enabled it, as a fresh ``python -m memalloc run`` would not have: it
imports memalloc, enables it and runs its script there.

    python forks.py JOBS.json [MODULE ...]

JOBS.json: a list of {"argv": [...], "cwd": DIR, "out": FILE, "err": FILE,
"timeout": seconds (default 300)}; each job's exit code is written back into
it as "rc" (a signal: -N; SIGALRM past its timeout)."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys

import torch  # noqa: F401
import torch._dynamo  # noqa: F401

for name in sys.argv[2:]:
    importlib.import_module(name)
assert "memalloc" not in sys.modules


def child(job: dict) -> None:
    signal.alarm(int(job.get("timeout", 300)))  # its default action ends the child
    for fd, path in ((1, job["out"]), (2, job["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.chdir(job["cwd"])
    sys.argv = ["memalloc", *job["argv"]]
    rc = 0
    try:
        runpy.run_module("memalloc", run_name="__main__", alter_sys=True)
    except SystemExit as e:  # as the interpreter ends: a message is printed, exit status 1
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc & 0xFF)


jobs = json.load(open(sys.argv[1]))
for job in jobs:
    pid = os.fork()
    if pid == 0:
        try:
            child(job)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    job["rc"] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
json.dump(jobs, open(sys.argv[1], "w"))
