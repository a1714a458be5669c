"""Every path of this repository that a doc, a comment or a docstring names
exists (issue 40: errors.h and architecture.md still named files of
boundary/ by their places before its sub-folders, long after the move).

A path is a run of folders and a file name with an extension of the tree's
kinds (.h .cpp .py .md .sh .toml); it is this repository's when it starts
with one of its top folders or csrc/'s (csrc/ itself is where C++ comments
count from), and it must then name a tracked file: as written, from the top,
from csrc/, or from the naming file's own folder. Paths of other projects
(torch's c10/ and test/, pybind11/, system headers) and placeholders (DIR/,
OUT/) are not this repository's. benchmarks/results/ holds dated records of
runs: they keep the names the tree had then."""

from __future__ import annotations

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.(?:h|cpp|py|md|sh|toml))(?![\w])")
RECORDS = ("benchmarks/results/",)


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return out.split()


def ours(path: str, tops: set[str]) -> bool:
    return path.split("/", 1)[0] in tops


def test_every_path_of_this_repository_that_the_tree_names_exists():
    files = tracked()
    every = set(files)
    tops = {f.split("/", 1)[0] for f in files if "/" in f} | {
        f.split("/", 2)[1] for f in files if f.startswith("csrc/") and f.count("/") >= 2
    }
    missing = []
    for f in files:
        if not f.endswith((".md", ".h", ".cpp", ".py", ".sh")) or f.startswith(RECORDS):
            continue
        with open(os.path.join(REPO, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in PATH.finditer(text):
            p = m.group(1)
            if not ours(p, tops):
                continue
            here = os.path.normpath(os.path.join(os.path.dirname(f), p))
            if p in every or "csrc/" + p in every or here in every:
                continue
            missing.append(f"{f}: {p}")
    assert missing == [], "\n".join(missing)
