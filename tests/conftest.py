"""Fixtures shared by the test files.

``fresh_python`` is the one way a test starts a fresh interpreter. Tests use
it only where a process must be new: ``memalloc.enable()`` (once per
process), the torch patch it installs, MEMALLOC_CONF read at enable(), and
the CLI commands that enable memalloc or look for a GPU (run, demo, info).
The commands that do neither (report, replay) run in this process
(``memalloc_cli_here``), as does everything else (leak rules, reports, the
step tracker, recording) on an allocator the test owns (``host_allocator``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from memtest_helpers import REPO
from zygote import Zygote, exit_code

from memalloc import _C

# What every fresh-interpreter scenario of FreshPython.code starts with: R
# collects the result, err(f) returns [type name, MRO names, message] of what
# f raised, or None.
CHILD_PRELUDE = """
import json, sys
import torch
import memalloc
from memalloc import host
MiB = 1 << 20
R = {}
def err(f):
    try:
        f()
    except BaseException as e:
        return [type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)]
    return None
"""


class FreshPython:
    """Runs Python in a new interpreter as on a machine without a GPU: any
    GPU is hidden (backend "auto" means the host backend, on the device
    machine too), MEMALLOC_CONF is set only to ``conf``, and the repository
    is importable from any ``cwd``.

    ``run`` forks each new interpreter from a server that has imported torch
    once (tests/zygote.py: the child has never imported memalloc and reads
    its environment, directory and arguments afresh), which saves the 2 s of
    importing torch per interpreter; MEMALLOC_TEST_FORK=0 starts real ones.
    ``start`` (children side by side) always starts real ones."""

    def __init__(self, scratch: Path | None = None) -> None:
        use_fork = scratch is not None and hasattr(os, "fork") and os.environ.get("MEMALLOC_TEST_FORK", "1") != "0"
        self._zygote = Zygote(scratch) if use_fork else None

    def close(self) -> None:
        if self._zygote is not None:
            self._zygote.close()

    def env(self, conf: str | None = None, **extra: str) -> dict:
        """The child's environment (os.environ with the above applied, then ``extra``)."""
        env = dict(os.environ)
        env.pop("MEMALLOC_CONF", None)
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if conf is not None:
            env["MEMALLOC_CONF"] = conf
        env.update(extra)
        return env

    def run(
        self,
        args: Sequence[str],
        *,
        cwd: Path | None = None,
        conf: str | None = None,
        env: dict | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        """``python <args>`` (e.g. ``["-m", "memalloc", "run", ...]`` or
        ``["-c", code]``) in ``cwd`` (default: the repository); ``env``
        replaces the environment ``self.env(conf)`` builds. Returns the
        finished process (text output captured), whatever its exit code."""
        if self._zygote is not None:
            return self._zygote.run(args, cwd=Path(cwd or REPO), env=env or self.env(conf), timeout=timeout)
        return subprocess.run(
            [sys.executable, *args],
            cwd=cwd or REPO,
            env=env or self.env(conf),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, args: Sequence[str], *, cwd: Path | None = None, conf: str | None = None) -> subprocess.Popen:
        """``python <args>`` started, not awaited (for children run side by
        side); text stdout and stderr are pipes."""
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=cwd or REPO,
            env=self.env(conf),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def code(
        self, prelude: str, code: str, conf: str | None = None, env: dict | None = None, timeout: float = 120
    ) -> tuple[subprocess.CompletedProcess, dict, str]:
        """``CHILD_PRELUDE + prelude + code``; the child ends by printing
        ``RESULT <json of R>``. Asserts that it exited 0 and printed that line
        once, within ``timeout`` seconds. ``env`` replaces the environment, as in :meth:`run`. Returns
        (process, that dict, the source run)."""
        src = CHILD_PRELUDE + textwrap.dedent(prelude) + textwrap.dedent(code) + '\nprint("RESULT", json.dumps(R))\n'
        p = self.run(["-c", src], conf=conf, env=env, timeout=timeout)
        assert p.returncode == 0, f"child failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}"
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        assert len(lines) == 1, p.stdout
        return p, json.loads(lines[0][len("RESULT ") :]), src


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory):
    """See FreshPython: a new interpreter, for enable(), the patch, MEMALLOC_CONF and the CLI."""
    fp = FreshPython(tmp_path_factory.mktemp("fresh"))
    yield fp
    fp.close()


def cli_here(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m memalloc <args>`` run by memalloc.__main__.main in this
    interpreter, for the commands that neither enable memalloc nor look for a
    GPU (report, replay): the same exit code, stdout and stderr as the fresh
    process would give, without its 2 s of importing torch. An exception the
    command does not handle fails the test (a process would print it)."""
    from memalloc.__main__ import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(cwd or REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:  # as the interpreter ends
                rc = exit_code(e)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["python", "-m", "memalloc", *args], rc, out.getvalue(), err.getvalue())


@pytest.fixture
def memalloc_cli_here():
    """See cli_here."""
    return cli_here


@pytest.fixture
def host_allocator():
    """A fresh host-backend allocator (64 MiB), not installed; validated after
    the test once its tensors are collected."""
    a = _C.Allocator("host", "host_capacity_mb:64")
    yield a
    gc.collect()
    a.validate()


@pytest.fixture(autouse=True)
def _torch_hooks_left_as_found(request):
    """A hook memalloc installs into torch must never outlive what installed
    it: every test leaves torch.autograd.backward and the optimizer's global
    hooks as it found them (a test that leaks one fails here, named, instead
    of breaking a later test that counts them, as tests/unit/test_hooks.py does)."""
    import torch
    from torch.optim import optimizer as torch_optimizer

    def state():
        return (
            torch.autograd.backward,
            len(torch_optimizer._global_optimizer_pre_hooks),
            len(torch_optimizer._global_optimizer_post_hooks),
        )

    before = state()
    yield
    after = state()
    if after != before:
        pytest.fail(
            f"{request.node.nodeid} left torch's hooks changed: backward "
            f"{'wrapped' if hasattr(after[0], '__wrapped__') else 'unwrapped'} (was "
            f"{'wrapped' if hasattr(before[0], '__wrapped__') else 'unwrapped'}), optimizer pre/post hooks "
            f"{before[1]}/{before[2]} -> {after[1]}/{after[2]}"
        )
