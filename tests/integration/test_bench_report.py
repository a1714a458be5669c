"""benchmarks/report/tables.py renders the tables of a GPU suite, recording and CPU
suite run from committed results files (docs/results.md quotes the current
figures with their files instead of carrying the generated tables: issue 40)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def latest(kind: str) -> str:
    files = sorted(glob.glob(os.path.join(REPO, "benchmarks", "results", f"*-{kind}.json")))
    assert files, f"no committed {kind} results"
    return files[-1]


def test_report_renders_both_suites_from_the_newest_files():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "report",
            "--gpu",
            latest("gpu-bench"),
            "--cpu",
            latest("cpu-bench"),
            "--recording",
            latest("gpu-recording"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.strip()
    assert section.startswith("<!-- PERF-START -->") and section.endswith("<!-- PERF-END -->")
    assert "| case | unit | native |" in section and "memalloc" in section
    assert "Ir/op" in section
    assert "Python stacks on / off in one process" in section and "via in-process ratio" in section
    assert "/root/" not in section and "/work/" not in section  # no machine paths
