"""Every torch a user has (issue 42): for each torch release, its own venv,
memalloc built against it, the fast test tier run, and torch's CUDA allocator
interface answered (benchmarks/compat/interface.py), into one results file.

    python -m benchmarks matrix --out benchmarks/results/DATE-torch-matrix.json
    python -m benchmarks matrix --versions 2.13 2.15 --no-install

Per version: the venv at ``--venvs/torch-X.Y`` (made and filled with pip when
missing, unless ``--no-install``; a ``--reuse X.Y=PATH`` venv instead, its
torch kept and the test dependencies added), a
copy of the tree's tracked files at ``--scratch/torch-X.Y`` built there with
``setup.py build_ext --inplace``, then ``pytest -m "not slow"`` (the README's
fast tier) with a junit file, and the interface report of that venv's torch.
The results record each step's exact command, its outcome, and when a step
fails, why (the log's tail). Nothing here needs a GPU: a CUDA torch builds
memalloc's CUDA part and runs the tier on the host backend.

Invariants:
  * Steps run one at a time (the machine has two cores); a failed step
    stops that version, not the others.
  * The results file is rewritten after every version, so an interrupted run
    keeps what it finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("2.11", "2.12", "2.13", "2.14", "2.15")
# The release of each line that is installed (pip), and how: a CUDA build
# from PyPI, except 2.13, CI's torch, whose CPU wheel CI installs.
RELEASES = {"2.11": "2.11.0", "2.12": "2.12.0", "2.13": "2.13.0", "2.14": "2.14.1", "2.15": "2.15.0"}
# setuptools >= 77 reads pyproject.toml's SPDX license string; older venvs (torch 2.11, 2.12) come with less.
TEST_DEPS = ("pybind11", "ninja", "pytest", "pytest-xdist", "numpy", "hypothesis", "setuptools>=77", "wheel")
FAST_TIER = (
    "-m",
    "pytest",
    "-q",
    "-n",
    "2",
    "--dist",
    "loadscope",
    "-m",
    "not slow",
    "tests",
    "-p",
    "no:cacheprovider",
)


def run(
    cmd: Sequence[str], log: Path, cwd: Path, env: dict[str, str] | None = None, timeout: int = 3600
) -> dict[str, Any]:
    """Runs cmd, its output to log; {command, rc, seconds, tail (on failure)}."""
    start = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(
                list(cmd), cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    out: dict[str, Any] = {"command": " ".join(cmd), "rc": rc, "seconds": round(time.monotonic() - start, 1)}
    if rc != 0:
        out["tail"] = log.read_text(errors="replace")[-3000:]
    return out


def install(version: str, venv: Path, logs: Path, with_torch: bool = True) -> dict[str, Any]:
    """Makes the venv and installs torch (unless not with_torch: a reused
    venv keeps its own) and the test dependencies into it."""
    py = venv / "bin" / "python"
    steps = []
    if not py.exists():
        steps.append(run([sys.executable, "-m", "venv", str(venv)], logs / "venv.log", REPO))
    env = dict(os.environ)
    if tuple(int(x) for x in version.split(".")) > (2, 14):
        env["PIP_CONFIG_FILE"] = "/dev/null"  # this machine's pip caps torch at 2.14.1 (its wheels on disk)
    torch_spec = [f"torch=={RELEASES[version]}"] if with_torch else []
    pip = [str(py), "-m", "pip", "install", "--no-cache-dir", "-q", *torch_spec, *TEST_DEPS]
    steps.append(run(pip, logs / "pip.log", REPO, env))
    return {"steps": steps, "ok": all(s["rc"] == 0 for s in steps)}


def copy_tree(dest: Path) -> None:
    """The tree's tracked and untracked-but-not-ignored files, copied to dest
    (anew) and indexed in a git repository there."""
    if dest.exists():
        shutil.rmtree(dest)
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    # A repository of its own (files indexed, nothing committed): tests that
    # list the tree's files ask git (git ls-files).
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)


def junit_counts(path: Path) -> dict[str, int]:
    """passed/failed/errors/skipped of a pytest junit file."""
    if not path.is_file():
        return {}
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if suite is None:
        return {}
    tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed_names = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {
        "passed": tests - failures - errors - skipped,
        "failed": failures,
        "errors": errors,
        "skipped": skipped,
        "failed_tests": failed_names,  # type: ignore[dict-item]
    }


def one_version(version: str, venv: Path, scratch: Path, install_missing: bool, reused: bool) -> dict[str, Any]:
    logs = scratch.parent / f"logs-torch-{version}"
    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"version": version, "venv": str(venv)}
    py = venv / "bin" / "python"
    if install_missing:
        result["install"] = install(version, venv, logs, with_torch=not reused)
        if not result["install"]["ok"]:
            result["why"] = "pip could not install this torch (install.steps[].tail)"
            return result
    elif not py.exists():
        result["why"] = f"no venv at {venv} and --no-install given"
        return result
    probe = subprocess.run(
        [str(py), "-c", "import torch, json; print(json.dumps([torch.__version__, torch.version.cuda]))"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        result["why"] = "this venv's torch does not import: " + probe.stderr[-1500:]
        return result
    result["torch"], cuda = json.loads(probe.stdout.strip().splitlines()[-1])
    result["build_kind"] = f"CUDA {cuda}" if cuda else "CPU"
    copy_tree(scratch)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEMALLOC_CONF")}
    env["PYTHONPATH"] = str(scratch)
    result["build"] = run([str(py), "setup.py", "build_ext", "--inplace"], logs / "build.log", scratch, env)
    result["build_ok"] = result["build"]["rc"] == 0
    if not result["build_ok"]:
        result["why"] = "memalloc did not build against this torch (build.tail)"
        return result
    junit = logs / "fast-tier.xml"
    result["fast_tier"] = run([str(py), *FAST_TIER, f"--junitxml={junit}"], logs / "fast-tier.log", scratch, env)
    result["fast_tier"].update(junit_counts(junit))
    interface = run([str(py), "-m", "benchmarks.compat.interface", "--json"], logs / "interface.log", scratch, env)
    result["interface_command"] = interface["command"]
    try:
        result["interface"] = json.loads((logs / "interface.log").read_text())
    except ValueError:
        result["interface"] = {"error": interface.get("tail", "")}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS), choices=VERSIONS)
    parser.add_argument("--venvs", type=Path, default=Path("/work/venvs"), help="where each torch-X.Y venv lives")
    parser.add_argument("--reuse", action="append", default=[], metavar="X.Y=PATH", help="an existing venv for X.Y")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/memalloc-matrix"), help="build copies and logs")
    parser.add_argument("--no-install", action="store_true", help="use the venvs as they are")
    parser.add_argument("--out", type=Path, required=True, help="the results JSON")
    args = parser.parse_args(argv)
    reuse = dict(item.split("=", 1) for item in args.reuse)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout)
    results: dict[str, Any] = {
        "what": "memalloc built and its fast tier run against each torch release, and torch's CUDA allocator "
        "interface answered (issue 42)",
        "command": "python -m benchmarks matrix " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, no GPU",
        "versions": [],
    }
    for version in args.versions:
        venv = Path(reuse.get(version, args.venvs / f"torch-{version}"))
        print(f"== torch {version}: {venv}", flush=True)
        r = one_version(version, venv, args.scratch / f"torch-{version}", not args.no_install, version in reuse)
        results["versions"].append(r)
        ft = r.get("fast_tier", {})
        print(
            f"   build_ok={r.get('build_ok')} fast tier: {ft.get('passed')} passed, {ft.get('failed')} failed, "
            f"{ft.get('skipped')} skipped; missing methods: {r.get('interface', {}).get('missing')}",
            flush=True,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    ok = all(r.get("build_ok") and r.get("fast_tier", {}).get("rc") == 0 for r in results["versions"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
