"""torch reads its allocator settings from PYTORCH_ALLOC_CONF, then from the
old name PYTORCH_CUDA_ALLOC_CONF (issue 42). Wherever memalloc's code, its
benchmarks or its tests read or clear the old name for a child process, the
new one must be read or cleared there too, or a user's PYTORCH_ALLOC_CONF
leaks through (or is ignored). Tests that *set* the old name on purpose are
left alone: they check that it is still honoured."""

from __future__ import annotations

import ast
from pathlib import Path

from memtest_helpers import REPO

OLD, NEW = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"
READERS = {"get", "pop", "getenv", "environ"}


def places(tree: ast.AST) -> list[tuple[int, set[str]]]:
    """(line, the names handled there) of each place that reads or clears
    the old name: a get/pop/getenv call with it, or a tuple/list/set of
    names that contains it (``k not in (...)``, ``for k in (...)``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READERS:
            if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == OLD:
                out.append((node.lineno, {OLD}))
        for seq in _name_lists(node):
            names = {e.value for e in seq.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if OLD in names:
                out.append((seq.lineno, names))
    return out


def _name_lists(node: ast.AST) -> list[ast.Tuple | ast.List | ast.Set]:
    """Literal lists of names that a test or a loop walks: ``x in (...)``,
    ``for x in (...)``."""
    kinds = (ast.Tuple, ast.List, ast.Set)
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return [c for c in node.comparators if isinstance(c, kinds)]
    if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, kinds):
        return [node.iter]
    return []


def test_every_reader_of_the_old_name_handles_the_new_one():
    bad = []
    for folder in ("memalloc", "benchmarks", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            found = places(tree)
            new_read = any(
                isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == NEW
                for n in ast.walk(tree)
            )
            for line, names in found:
                if names == {OLD} and not new_read or len(names) > 1 and NEW not in names:
                    bad.append(f"{Path(path).relative_to(REPO)}:{line}")
    assert not bad, f"these read or clear {OLD} but not {NEW}: {bad}"


def test_the_check_sees_a_reader_that_forgets_the_new_name():
    forgets = ast.parse('env = {k: v for k, v in os.environ.items() if k not in ("MEMALLOC_CONF", "%s")}' % OLD)
    assert places(forgets) == [(1, {"MEMALLOC_CONF", OLD})]
    assert places(ast.parse('os.environ.pop("%s", None)' % OLD)) == [(1, {OLD})]
