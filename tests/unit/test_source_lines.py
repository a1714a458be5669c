"""The line of source a report shows, for code that is not a plain file
(issue 23): a module imported from a zip archive and an IPython/Jupyter cell
(IPython registers its cells in linecache) show their line; code given to
``python -c`` / exec() says why it has none. Each runs a leaking loop under
leak_check() on a host allocator the test owns, with torch's CPU tensors
from it."""

from __future__ import annotations

import gc
import linecache
import sys
import zipfile

import pytest

import memalloc

LOOP = """\
import torch
import memalloc


def run(allocator):
    kept = []
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(8):
            kept.append(torch.ones(256))  # KEEPS
            memalloc.step()
    return check.report
"""
KEEP_LINE = LOOP.splitlines().index("            kept.append(torch.ones(256))  # KEEPS") + 1


@pytest.fixture
def a():
    allocator = memalloc.Allocator("host", "host_capacity_mb:64")
    with memalloc.host.cpu_tensors_from(allocator):
        yield allocator
    gc.collect()


def run_compiled(filename: str, allocator):
    namespace: dict = {}
    exec(compile(LOOP, filename, "exec"), namespace)
    return namespace["run"](allocator)


def only_leak(report):
    assert len(report.leaks) == 1, report.to_text()
    return report.leaks[0]


def test_python_c_code_says_it_has_no_source(a):
    report = run_compiled("<string>", a)
    leak = only_leak(report)
    assert leak.site["line"] == KEEP_LINE
    assert leak.code == "(no source: code given to python -c or exec() has no file)"
    assert "(no source: code given to python -c or exec() has no file)" in report.to_text()


def test_an_ipython_cell_shows_its_line(a):
    cell = "<ipython-input-7-0123456789ab>"
    linecache.cache[cell] = (len(LOOP), None, LOOP.splitlines(keepends=True), cell)  # what IPython does
    try:
        leak = only_leak(run_compiled(cell, a))
        assert leak.site["line"] == KEEP_LINE
        assert leak.code == "kept.append(torch.ones(256))  # KEEPS"
        assert leak.holder["name"] == "kept"
    finally:
        linecache.cache.pop(cell, None)


def test_a_cell_gone_from_the_history_says_so(a):
    leak = only_leak(run_compiled("<ipython-input-8-0123456789ab>", a))
    assert leak.code == "(no source: an IPython cell that is not in this session's history)"


def test_a_module_imported_from_a_zip_shows_its_line(a, tmp_path, monkeypatch):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("leaky_zip_module.py", LOOP)
    monkeypatch.syspath_prepend(str(archive))
    import leaky_zip_module  # noqa: PLC0415 - imported from the archive made above

    try:
        leak = only_leak(leaky_zip_module.run(a))
        assert leak.site["filename"].endswith("bundle.zip/leaky_zip_module.py")
        assert leak.site["line"] == KEEP_LINE
        assert leak.code == "kept.append(torch.ones(256))  # KEEPS"
    finally:
        sys.modules.pop("leaky_zip_module", None)
