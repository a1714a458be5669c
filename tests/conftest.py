"""Fixtures shared by the test files.

``fresh_python`` is the one way a test starts a fresh interpreter. Tests use
it only where a process must be new: ``memalloc.enable()`` (once per
process), the torch patch it installs, MEMALLOC_CONF read at enable(), and
the CLI. Everything else (leak rules, reports, the step tracker, recording)
runs in this process on an allocator the test owns (``host_allocator``).
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional, Sequence

import pytest

from memalloc import _C
from memtest_helpers import REPO

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
    is importable from any ``cwd``."""

    def env(self, conf: Optional[str] = None, **extra: str) -> dict:
        """The child's environment (os.environ with the above applied, then ``extra``)."""
        env = dict(os.environ)
        env.pop("MEMALLOC_CONF", None)
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if conf is not None:
            env["MEMALLOC_CONF"] = conf
        env.update(extra)
        return env

    def run(self, args: Sequence[str], *, cwd: Optional[Path] = None, conf: Optional[str] = None,
            env: Optional[dict] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """``python <args>`` (e.g. ``["-m", "memalloc", "run", ...]`` or
        ``["-c", code]``) in ``cwd`` (default: the repository); ``env``
        replaces the environment ``self.env(conf)`` builds. Returns the
        finished process (text output captured), whatever its exit code."""
        return subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=env or self.env(conf),
                              capture_output=True, text=True, timeout=timeout)

    def start(self, args: Sequence[str], *, cwd: Optional[Path] = None,
              conf: Optional[str] = None) -> subprocess.Popen:
        """``python <args>`` started, not awaited (for children run side by
        side); text stdout and stderr are pipes."""
        return subprocess.Popen([sys.executable, *args], cwd=cwd or REPO, env=self.env(conf),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def code(self, prelude: str, code: str, conf: Optional[str] = None, env: Optional[dict] = None
             ) -> tuple[subprocess.CompletedProcess, dict, str]:
        """``CHILD_PRELUDE + prelude + code``; the child ends by printing
        ``RESULT <json of R>``. Asserts that it exited 0 and printed that line
        once. ``env`` replaces the environment, as in :meth:`run`. Returns
        (process, that dict, the source run)."""
        src = CHILD_PRELUDE + textwrap.dedent(prelude) + textwrap.dedent(code) + '\nprint("RESULT", json.dumps(R))\n'
        p = self.run(["-c", src], conf=conf, env=env, timeout=120)
        assert p.returncode == 0, f"child failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}"
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        assert len(lines) == 1, p.stdout
        return p, json.loads(lines[0][len("RESULT "):]), src


@pytest.fixture(scope="session")
def fresh_python() -> FreshPython:
    """See FreshPython: a new interpreter, for enable(), the patch, MEMALLOC_CONF and the CLI."""
    return FreshPython()


@pytest.fixture
def host_allocator():
    """A fresh host-backend allocator (64 MiB), not installed; validated after
    the test once its tensors are collected."""
    a = _C.Allocator("host", "host_capacity_mb:64")
    yield a
    gc.collect()
    a.validate()
