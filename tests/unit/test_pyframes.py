"""The GIL-free Python frame walk (csrc/boundary/callers/pyframes.cpp) on every
local CPython it supports (3.11, 3.12, 3.13; the GPU machine runs 3.12).

For each interpreter found (python3.11, python3.12, python3.13 on PATH or
under pyenv's versions directory), a
minimal extension around pyframes.cpp (tests/cpp/pyframes_probe.cpp, C API
only) is built with g++ and a script runs in that interpreter that compares
the walk, taken with the GIL released, against traceback.extract_stack() of
the same line: nested calls, a generator, a method, a callback called from C
(sorted's key), a lambda, a worker thread, and a thread whose frames are
read while other threads keep running Python. An interpreter that is not
installed is skipped, and says so."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(REPO, "tests", "cpp", "pyframes_probe.cpp")
PYFRAMES = os.path.join(REPO, "csrc", "boundary", "callers", "pyframes.cpp")

CHECK = textwrap.dedent("""
    import sys, threading, traceback
    import pyframes_probe as probe

    assert probe.supported(), "the GIL-free walk is compiled out on " + sys.version

    def expected(stack):
        return [(f.filename, f.lineno, f.name) for f in reversed(stack)]

    def check(got, want, where):
        # traceback names functions by co_name, the walk by co_qualname.
        got = [(f, l, n.rsplit(".", 1)[-1]) for f, l, n in got]
        assert got == expected(want), f"{where}:\\n got  {got}\\n want {expected(want)}"

    def leaf(where):
        got, want = probe.walk(), traceback.extract_stack()
        check(got, want, where)
        return len(got)

    def nested(depth, where):
        return leaf(where) if depth == 0 else nested(depth - 1, where)

    def gen():
        yield leaf("generator")

    class Model:
        def forward(self):
            return leaf("method")

    depth = nested(30, "nested calls")
    assert depth >= 31, depth
    next(gen())
    Model().forward()
    sorted([3, 1, 2], key=lambda x: leaf("callback from C"))
    list(map(lambda x: leaf("map"), [1]))

    errors = []
    def in_thread(name):
        try:
            for _ in range(200):
                nested(5, name)
        except AssertionError as e:
            errors.append(e)

    def busy(stop):
        while not stop.is_set():
            sum(i * i for i in range(100))

    stop = threading.Event()
    busy_threads = [threading.Thread(target=busy, args=(stop,)) for _ in range(2)]
    walkers = [threading.Thread(target=in_thread, args=(f"thread {i}",)) for i in range(3)]
    for t in busy_threads + walkers:
        t.start()
    for t in walkers:
        t.join()
    stop.set()
    for t in busy_threads:
        t.join()
    assert not errors, errors[0]
    print("ok", sys.version_info[:2])
""")


def interpreter_paths(version: str):
    """(executable, include dir, extension suffix) of a working CPython
    `version` with its headers, or None."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", f"python{version}")))
    for exe in filter(None, candidates):
        proc = subprocess.run(
            [
                exe,
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['include']);"
                "print(sysconfig.get_config_var('EXT_SUFFIX'))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            continue  # e.g. a pyenv shim for a version that is not selected
        include, suffix = proc.stdout.split()
        if os.path.exists(os.path.join(include, "Python.h")):
            return exe, include, suffix
    return None


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_frames_read_without_the_gil_equal_the_traceback(version, tmp_path):
    found = interpreter_paths(version)
    if found is None:
        pytest.skip(f"python{version} with its headers is not installed here")
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    exe, include, suffix = found
    module = tmp_path / f"pyframes_probe{suffix}"
    build = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O2",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Wextra",
            f"-I{include}",
            f"-I{os.path.join(REPO, 'csrc')}",
            PROBE,
            PYFRAMES,
            "-o",
            str(module),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "warning" not in build.stderr, build.stderr[-3000:]
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    proc = subprocess.run(
        [exe, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.startswith("ok"), proc.stdout
