"""torch's own allocator tests as memalloc's conformance suite.

Runs upstream ``test/test_cuda.py`` (its allocator tests, selected by
benchmarks/compat/conformance_plugin.py) and ``test/inductor/test_cudagraph_trees.py``
unmodified, natively and under memalloc, with the default config and with
expandable segments, each (suite, mode, config) in its own processes, and
writes every test's outcome in each mode::

    python -m benchmarks conformance --upstream upstream/test --out DIR

The upstream files are not in this repository (git-ignored ``upstream/``;
upstream/SOURCE.txt says where they came from); the device run carries them.
A test that crashes the process (a poisoned CUDA context, a segfault, a
timeout: ``--timeout`` seconds, after which the plugin dumps every thread's
stack and ends the process) is recorded as ``crashed``, with the end of its
output, and the run restarts after it. By
default the two suites run side by side (the trees compile on the CPU) and
the modes and configs of one suite one after another, so no two processes
of a suite share the GPU; ``--lanes`` chooses otherwise (tests that take
half the GPU then collide), ``--only`` runs a list of node ids, and
``--merge`` joins several runs' files.

Writes DIR/conformance.json: meta (date, torch, GPU, command), per suite and
config each test's outcome natively and under memalloc (with the failure's
last lines), and the counts: passed natively, of those passed under
memalloc, and the list of tests that pass natively and not under memalloc.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITES = {"cuda": "test_cuda.py", "trees": "inductor/test_cudagraph_trees.py"}
MODES = ("native", "memalloc")
CONFIGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    # memalloc's expandable segments as its default would give them: set in
    # MEMALLOC_CONF, which torch's tests do not read (EXPANDABLE_SEGMENTS stays
    # False, as under an unset PYTORCH_CUDA_ALLOC_CONF); natively it is the
    # default config, whose native outcomes it is compared with
    "memalloc_expandable": "expandable_segments:True",
    # expandable segments that the tests are not told of, in both modes:
    # natively set at startup through torch.cuda.memory._set_allocator_settings
    # (the plugin, before any allocation), under memalloc in MEMALLOC_CONF.
    # The peer for memalloc's expandable default: what native torch does
    # when expandable segments are on and PYTORCH_CUDA_ALLOC_CONF does not say so
    "expandable_unsaid": "expandable_segments:True",
}
MEMALLOC_ONLY = {"memalloc_expandable": "default"}  # config -> the config its native outcomes are
UNSAID = ("expandable_unsaid",)  # configs set where torch's tests do not look (EXPANDABLE_SEGMENTS stays False)
OUTCOMES_PASSED = ("passed",)


def _env(upstream: Path, suite: str, mode: str, config: str, log: Path, skip: Path) -> dict:
    env = dict(os.environ)
    for name in ("MEMALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):  # torch reads the second first
        env.pop(name, None)
    env.update(
        PYTHONUNBUFFERED="1",
        MEMALLOC_CONFORMANCE_MODE=mode,
        MEMALLOC_CONFORMANCE_SELECT=suite,
        MEMALLOC_CONFORMANCE_LOG=str(log),
        MEMALLOC_CONFORMANCE_SKIP=str(skip),
        MEMALLOC_CONFORMANCE_FILE=str(upstream / SUITES[suite]),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    # torch.utils.cpp_extension builds (MemPool tests compile a dummy allocator)
    # take a lock in the extensions folder: one folder per run, so a run that
    # the budget kills cannot leave a lock that hangs the others.
    env["TORCH_EXTENSIONS_DIR"] = str(log.parent / f"extensions-{log.stem}")
    conf = CONFIGS[config]
    if config in MEMALLOC_ONLY:
        if mode == "memalloc":
            env["MEMALLOC_CONF"] = conf
    elif config in UNSAID:
        env["MEMALLOC_CONF" if mode == "memalloc" else "MEMALLOC_CONFORMANCE_NATIVE_SETTINGS"] = conf
    elif conf:
        # The same variable in both modes: the tests read it (EXPANDABLE_SEGMENTS)
        # and memalloc honours the keys it shares with torch.
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env


def _read_log(log: Path) -> tuple[dict, list]:
    """({id: {"outcome", "message"}}, ids started in order)."""
    results: dict = {}
    started: list = []
    if not log.exists():
        return results, started
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if "shims" in e or "allocator_config" in e or "after" in e:  # "after": MEMALLOC_CONFORMANCE_LIVE's
            continue
        if "start" in e:
            started.append(e["start"])
        elif e.get("outcome") == "failed" or e["id"] not in results:
            results[e["id"]] = {"outcome": e["outcome"], "message": e.get("message", "")}
    return results, started


def _crash_output(text: str) -> str:
    """What says why a pass ended: a timeout's stack dump (innermost frames
    first, faulthandler's order) from its start, else the pass's last lines."""
    lines = text.splitlines()
    at = next((i for i, l in enumerate(lines) if "Timeout (" in l), None)  # after pytest's progress dots
    return "\n".join(lines[at : at + 30] if at is not None else lines[-15:])[:3000]


def _clear_build_locks(env: dict) -> None:
    """Removes the build locks a killed process left in this run's own
    extensions folder (torch's FileBaton waits forever on one)."""
    for lock in Path(env["TORCH_EXTENSIONS_DIR"]).glob("*/lock"):
        lock.unlink(missing_ok=True)


def run_one(upstream: Path, out: Path, suite: str, mode: str, config: str, timeout: int, deadline: float) -> dict:
    """All passes of one (suite, mode, config); {id: {"outcome", "message"}}."""
    tag = f"{suite}-{mode}-{config}"
    log, skip, stdout = out / f"{tag}.jsonl", out / f"{tag}.skip", out / f"{tag}.log"
    for p in (log, skip, stdout):
        p.unlink(missing_ok=True)
    crashed: dict = {}
    passes = 0
    while time.monotonic() < deadline:
        passes += 1
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "benchmarks.compat.conformance_plugin",
            str(upstream / SUITES[suite]),
            "-q",
            "-rN",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
        ]
        start = stdout.stat().st_size if stdout.exists() else 0
        with open(stdout, "a") as f:
            f.write(f"\n=== pass {passes}: {' '.join(cmd)}\n")
            f.flush()
            env = _env(upstream, suite, mode, config, log, skip)
            env["MEMALLOC_CONFORMANCE_TEST_TIMEOUT"] = str(timeout)
            _clear_build_locks(env)  # a restart after a crash: no process of this run holds one
            try:
                rc = subprocess.run(
                    cmd,
                    cwd=REPO,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    timeout=max(1, deadline - time.monotonic()),
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "budget"
        results, started = _read_log(log)
        unfinished = [t for t in started if t not in results and t not in crashed]
        if not unfinished:
            if rc not in (0, 1, 5) and not results:
                print(
                    f"{tag}: pytest exited {rc} before any test; the end of {stdout}:\n"
                    + "\n".join(stdout.read_text().splitlines()[-15:]),
                    flush=True,
                )
            break
        crashed[unfinished[-1]] = {
            "outcome": "crashed",
            "message": f"the process ended (rc {rc}) in this test; its output:\n"
            + _crash_output(stdout.read_text()[start:]),
        }
        skip.write_text("\n".join([*results, *crashed]) + "\n")
        if rc == "budget":
            break
    results, _ = _read_log(log)
    results.update(crashed)
    print(
        f"{tag}: {sum(r['outcome'] == 'passed' for r in results.values())} passed of {len(results)} "
        f"in {passes} pass(es)",
        flush=True,
    )
    return results


def _short(message: str, n: int = 600) -> str:
    if message.startswith("the process ended"):  # a crash: what says where, whole (_crash_output)
        return message
    lines = [l for l in message.splitlines() if l.strip()]
    return "\n".join(lines[-8:])[-n:]


def summarise(tables: dict) -> dict:
    """Counts and regressions per suite and config from {suite: {config: {mode: results}}}."""
    out: dict = {}
    for suite, by_config in tables.items():
        for config, by_mode in by_config.items():
            native, ours = by_mode.get("native", {}), by_mode.get("memalloc", {})
            if not native and config in MEMALLOC_ONLY:  # natively the same run as that config's
                native = by_config.get(MEMALLOC_ONLY[config], {}).get("native", {})
            passed_native = sorted(t for t, r in native.items() if r["outcome"] in OUTCOMES_PASSED)
            passed_both = [t for t in passed_native if ours.get(t, {}).get("outcome") in OUTCOMES_PASSED]
            out[f"{suite}/{config}"] = {
                "tests": len(set(native) | set(ours)),
                "passed_natively": len(passed_native),
                "passed_natively_and_under_memalloc": len(passed_both),
                "passed_only_under_memalloc": sorted(
                    t
                    for t, r in ours.items()
                    if r["outcome"] in OUTCOMES_PASSED and native.get(t, {}).get("outcome") not in OUTCOMES_PASSED
                ),
                "regressions": {
                    t: {
                        "outcome": ours.get(t, {}).get("outcome", "not run"),
                        "message": _short(ours.get(t, {}).get("message", "")),
                    }
                    for t in passed_native
                    if t not in passed_both
                },
            }
    return out


def _machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "gpu": gpu,
        "python": sys.version.split()[0],
    }


def _tables_of(result: dict) -> dict:
    """{suite: {config: {mode: {test: {"outcome", "message"}}}}} back from a results file."""
    tables: dict = {}
    for suite, by_config in result["tests"].items():
        for config, tests in by_config.items():
            for test, by_mode in tests.items():
                for mode, outcome in by_mode.items():
                    message = result["messages"].get(suite, {}).get(config, {}).get(mode, {}).get(test, "")
                    tables.setdefault(suite, {}).setdefault(config, {}).setdefault(mode, {})[test] = {
                        "outcome": outcome,
                        "message": message,
                    }
    return tables


def _result(tables: dict, meta: dict) -> dict:
    return {
        "meta": meta,
        "summary": summarise(tables),
        "tests": {
            s: {
                c: {
                    t: {m: by_mode[m][t]["outcome"] for m in by_mode if t in by_mode[m]}
                    for t in sorted(set().union(*[set(r) for r in by_mode.values()]) if by_mode else [])
                }
                for c, by_mode in by_config.items()
            }
            for s, by_config in tables.items()
        },
        "messages": {
            s: {
                c: {
                    m: {t: _short(r["message"]) for t, r in res.items() if r["outcome"] in ("failed", "crashed")}
                    for m, res in by_mode.items()
                }
                for c, by_mode in by_config.items()
            }
            for s, by_config in tables.items()
        },
    }


def _print_summary(result: dict) -> None:
    for key, s in result["summary"].items():
        print(
            f"{key}: {s['passed_natively']} pass natively, {s['passed_natively_and_under_memalloc']} of them "
            f"under memalloc; regressions: {', '.join(t.split('::')[-1] for t in s['regressions']) or 'none'}"
        )


def merge(paths: list, out: Path) -> dict:
    """One results file from several runs': each test's outcome in each
    (suite, config, mode) from the last file that ran it; ``sources`` says
    which run (index into meta.runs) each outcome comes from."""
    tables: dict = {}
    sources: dict = {}
    metas = []
    for i, path in enumerate(paths):
        r = json.loads(Path(path).read_text())
        metas.append(r["meta"])
        for suite, by_config in _tables_of(r).items():
            for config, by_mode in by_config.items():
                for mode, res in by_mode.items():
                    tables.setdefault(suite, {}).setdefault(config, {}).setdefault(mode, {}).update(res)
                    for test in res:
                        sources.setdefault(f"{suite}/{config}/{mode}", {})[test] = i
    result = _result(tables, {"runs": metas})
    result["sources"] = sources
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    _print_summary(result)
    return result


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", type=Path, default=REPO / "upstream" / "test")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--lanes",
        default="cuda:native:default+cuda:memalloc:default+cuda:native:expandable+"
        "cuda:memalloc:expandable,trees:native:default+trees:memalloc:default+trees:native:expandable+"
        "trees:memalloc:expandable",
        help="runs as suite:mode:config; '+' runs one after another, ',' separates lanes run side by "
        "side (keep a suite's memory-hungry runs in one lane)",
    )
    p.add_argument("--timeout", type=int, default=300, help="seconds per test")
    p.add_argument("--budget", type=float, default=1500, help="seconds for the whole run")
    p.add_argument("--merge", nargs="+", type=Path, help="merge these results files into --out instead of running")
    p.add_argument("--only", type=Path, help="a file of node ids: run only these tests")
    args = p.parse_args(argv)
    if args.merge:
        merge(args.merge, args.out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        os.environ["MEMALLOC_CONFORMANCE_ONLY"] = str(args.only.resolve())
    deadline = time.monotonic() + args.budget
    lanes = [[tuple(job.split(":")) for job in lane.split("+") if job] for lane in args.lanes.split(",") if lane]
    tables: dict = {}
    lock = threading.Lock()

    def lane(jobs: list) -> None:
        for suite, mode, config in jobs:
            res = run_one(args.upstream, args.out, suite, mode, config, args.timeout, deadline)
            with lock:
                tables.setdefault(suite, {}).setdefault(config, {})[mode] = res

    threads = [threading.Thread(target=lane, args=(jobs,)) for jobs in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    source = args.upstream.parent / "SOURCE.txt"
    shims, configs = {}, {}
    for log in sorted(args.out.glob("*.jsonl")):
        for line in log.read_text().splitlines():
            if line.startswith('{"shims"'):
                shims[log.stem] = json.loads(line)["shims"]
            elif line.startswith('{"allocator_config"'):
                configs[log.stem] = json.loads(line)["allocator_config"]
            elif line.startswith('{"start"'):
                break
    meta = {
        **_machine(),
        "command": "python -m benchmarks conformance " + " ".join(argv or sys.argv[1:]),
        "upstream": source.read_text().strip() if source.exists() else "",
        "shimmed_imports": shims,
        "allocator_config": configs,
    }
    result = _result(tables, meta)
    (args.out / "conformance.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    _print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
