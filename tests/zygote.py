"""A fork server for the tests' fresh interpreters (tests/conftest.py's
FreshPython.run): one process per test worker imports torch once, and every
"fresh interpreter" is a fork of it that then runs ``python <args>`` as the
command line would.

Importing torch is 2 of the 2.3 s a fresh interpreter costs, and a test
suite that needs fifty of them per worker spends most of its time there. A
fork after ``import torch`` is what torch's own DataLoader workers are, and
the forked child has never imported memalloc, never enabled it, and reads its
environment, working directory and arguments afresh: what a new process
would. Each child gets its own stdout and stderr files, its own exit code
(``-N`` when a signal ends it, as subprocess reports), and the timeout kills
it.

Only the server's own import of torch is shared; anything a test's code
imports, enables or patches happens in its child alone.

Protocol: one JSON request per line on the server's stdin,
``{"args", "cwd", "env", "out", "err", "timeout"}``; one line back on its
stdout, ``{"rc": int}`` or ``{"timeout": true}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

SERVER = r"""
import json, os, runpy, signal, sys, threading, traceback, types
sys.path.insert(0, sys.argv[1])  # this folder, for exit_code; a child's sys.path starts without it
from zygote import exit_code
sys.path.pop(0)
import torch  # the one thing every child shares
requests, replies = sys.stdin, os.fdopen(os.dup(1), "w")


def child(req):
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    replies.close()  # the server's reply pipe is no business of the child's
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # nor its request pipe (a grandchild reading stdin must not take requests)
    os.close(null)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(os.devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    args = req["args"]
    rc = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[:0] = ["", *extra]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:0] = [os.getcwd(), *extra]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[:0] = [os.path.dirname(os.path.abspath(args[0])), *extra]
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        rc = exit_code(e)
    except BaseException:
        traceback.print_exc()
        rc = 1
    try:  # what the interpreter does at its end: wait for threads, run atexit, flush
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc & 0xFF)


while True:
    line = requests.readline()
    if not line:
        break
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(req)
        finally:
            os._exit(1)
    timed_out = []
    def kill(signum, frame, pid=pid):
        timed_out.append(True)
        os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGALRM, kill)
    signal.setitimer(signal.ITIMER_REAL, req["timeout"])
    _, status = os.waitpid(pid, 0)  # the timer's kill ends it past the timeout
    signal.setitimer(signal.ITIMER_REAL, 0)
    if timed_out:
        reply = {"timeout": True}
    else:
        reply = {"rc": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


def exit_code(e: SystemExit) -> int:
    """The exit status the interpreter gives a program that raised ``e``,
    printing a message code to stderr as it does."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


class Zygote:
    """The fork server of one test process; started on first use."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._n = 0

    def _server(self, env: dict) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(Path(__file__).parent)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        return self._proc

    def run(self, args: Sequence[str], *, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        """``python <args>`` as a fork of the server: a CompletedProcess with
        text stdout/stderr; raises subprocess.TimeoutExpired past ``timeout``."""
        with self._lock:
            self._n += 1
            out, err = self._scratch / f"{self._n}.out", self._scratch / f"{self._n}.err"
            proc = self._server(env)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(
                json.dumps(
                    {
                        "args": list(args),
                        "cwd": str(cwd),
                        "env": env,
                        "out": str(out),
                        "err": str(err),
                        "timeout": timeout,
                    }
                )
                + "\n"
            )
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the tests' fork server ended; run with MEMALLOC_TEST_FORK=0 to compare")
        reply = json.loads(line)
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        out.unlink()
        err.unlink()
        cmd = [sys.executable, *args]
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
        return subprocess.CompletedProcess(cmd, reply["rc"], stdout, stderr)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
