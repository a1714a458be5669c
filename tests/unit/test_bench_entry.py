"""benchmarks/ has one entry point (issue 40): ``python -m benchmarks --help``
lists every benchmark, each name runs its module, and every benchmark module
the tree names (``python -m benchmarks.<folder>.<module>``, ``python -m
benchmarks NAME``, a worker's command line, ``from benchmarks.<folder> import
<module>``) exists, so that a device script run blind on a GPU machine names
no module that moved. Dated records (benchmarks/results/, a results page's
quoted "Command:") keep the names the tree had then."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.__main__ import COMMANDS  # noqa: E402

DOTTED = re.compile(r"""(?:-m |["'])(benchmarks(?:\.\w+)+)|from (benchmarks(?:\.\w+)*) import (\w+)""")
NAMED = re.compile(r"python3? -m benchmarks ([a-z][\w-]*)")


def test_help_lists_every_benchmark_and_each_name_has_a_main():
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    for name, (module, line) in COMMANDS.items():
        assert f"  {name}" in p.stdout and line in p.stdout, name
        assert callable(importlib.import_module(f"benchmarks.{module}").main), module
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "nope"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent that is no package
        return None


def names(module: str, attribute: str) -> bool:
    """``from module import attribute`` finds a submodule or a name the module's source defines."""
    found = spec(module)
    if found is None or spec(f"{module}.{attribute}") is not None:
        return found is not None
    with open(found.origin, encoding="utf-8") as fh:
        return (
            re.search(
                rf"^(?:def|class) {attribute}\b|^[\w, ]*\b{attribute}\b[\w, ]*[:=]|import .*\b{attribute}\b",
                fh.read(),
                re.M,
            )
            is not None
        )


def test_every_benchmark_module_the_tree_names_exists():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    missing = []
    for f in files:
        if not (f.endswith((".py", ".sh", ".md", ".toml")) or f == ".ci/run") or f.startswith("benchmarks/results/"):
            continue
        with open(os.path.join(REPO, f), encoding="utf-8", errors="replace") as fh:
            text = "\n".join(line for line in fh.read().splitlines() if "Command: `" not in line)
        for m in DOTTED.finditer(text):
            ok = spec(m.group(1)) is not None if m.group(1) else names(m.group(2), m.group(3))
            if not ok:
                missing.append(f"{f}: {m.group(0)}")
        missing += [f"{f}: python -m benchmarks {n}" for n in NAMED.findall(text) if n not in COMMANDS]
    assert missing == [], "\n".join(missing)
