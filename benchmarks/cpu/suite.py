"""CPU benchmark suite: the memalloc C++ core on the host backend, no GPU.

    python -m benchmarks cpu [--check] [--update-baseline [--reason TEXT]]
                                         [--quick] [--repeats N] [--out PATH] [--rebuild]

Builds benchmarks/cpu/bench_core.cpp with the core (every csrc/ folder but boundary/; the torch
and Python boundary in csrc/boundary/ stays out) into build/cpu_bench/ (git-ignored), then in
one run:

1. timings (wall clock, informational, medians of --repeats, default 5;
   --quick: 3): ns per malloc+free pair for 512 B .. 256 MiB; ns per op of a
   seeded random workload (lognormal sizes, 64 live blocks) with its
   fragmentation figure (peak reserved / peak allocated); the same with 8
   threads on one device (contending on its lock) and 8 threads over 2
   devices: ns per op per thread and aggregate ops/s;
2. instructions per op (callgrind Ir in the measured region only,
   deterministic): 20,000 ops of the random workload and 20,000 pairs of
   each size, compared with benchmarks/baselines/cpu_instructions.json.
   --check exits 1 when a figure is more than 10% above its baseline;
   figures more than 10% below only print a note. --update-baseline rewrites
   the baseline (commit it, with the reason, in the same change).

Prints a table and writes a JSON record (date, machine, compiler, flags,
the exact command, raw repeats, medians, callgrind figures, the baseline
comparison) to benchmarks/results/<UTC date>-cpu-bench.json or --out PATH.
Exit status: 0 fine, 1 regression (with --check), 2 the suite itself
could not run (build failure, self-check failure, valgrind missing for
--check, no baseline for --check).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import core_build

REPO = Path(__file__).resolve().parents[2]
BENCH_SRC = REPO / "benchmarks" / "cpu" / "bench_core.cpp"
BASELINE_PATH = REPO / "benchmarks" / "baselines" / "cpu_instructions.json"
RESULTS_DIR = REPO / "benchmarks" / "results"
BUILD_DIR = REPO / "build" / "cpu_bench"

# One binary serves the timings and callgrind, built with these flags every
# time; the instruction figures depend on them (and on the compiler), so they
# are recorded with the baseline. No -march: the code must not depend on the
# machine that builds it.
FLAGS = ["-std=c++17", "-O2", "-g", "-pthread"]
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter"]  # no effect on code generation
LDLIBS = ["-ldl"]

TOLERANCE = 0.10  # --check fails above baseline * (1 + TOLERANCE)
DEFAULT_REPEATS = 5
QUICK_REPEATS = 3
# Work per repeat of the timing binary (the same with --quick: only the
# number of repeats changes, so quick and full figures are comparable).
TIMING_COUNTS = {
    "pair-iters": 500_000,
    "random-ops": 300_000,
    "thread-pair-iters": 50_000,
    "thread-random-ops": 25_000,
    "threads": 8,
}
CALLGRIND_OPS = 20_000
# The function whose execution callgrind counts (see bench_core.cpp for why
# a toggle function rather than the client-request macros).
CALLGRIND_REGION = "memalloc_bench_measured"

KiB, MiB = 1 << 10, 1 << 20
PAIR_SIZES = [512, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]


class SuiteError(Exception):
    """The suite could not produce its figures (exit status 2)."""


def size_label(n: int) -> str:
    for unit, label in ((MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {label}"
    return f"{n} B"


def pair_name(size: int) -> str:
    return "pair_" + size_label(size).replace(" ", "")


# Instruction-count workloads: name -> bench_core arguments after "callgrind".
def callgrind_workloads(ops: int = CALLGRIND_OPS) -> dict[str, list[str]]:
    w = {"random": ["random", str(ops)]}
    for s in PAIR_SIZES:
        w[pair_name(s)] = ["pair", str(s), str(ops)]
    # The same with the event ring on: the difference is the recording cost.
    w["random_recording"] = ["random", str(ops), "record"]
    w["pair_64KiB_recording"] = ["pair", str(64 << 10), str(ops), "record"]
    # The same ring in a flight recorder file: the difference to _recording
    # is what publishing each record with its sequence number costs.
    w["pair_64KiB_flight"] = ["pair", str(64 << 10), str(ops), "flight"]
    return w


# ------------------------------------------------------------------ build ----
def build(
    build_dir: Path | None = None, rebuild: bool = False, jobs: int | None = None, log: Callable[[str], None] = print
) -> dict[str, object]:
    """Compiles bench_core into build_dir with benchmarks/cpu/core_build.py (which
    reuses the binary when compiler, flags and every source are unchanged).
    Returns {binary, compiler, compiler_version, flags, link, seconds, cached,
    warnings}; SuiteError when it cannot build."""
    try:
        b = core_build.build_executable(
            "bench_core",
            [BENCH_SRC],
            Path(build_dir or BUILD_DIR),
            FLAGS,
            compile_flags=WARNINGS,
            libs=LDLIBS,
            rebuild=rebuild,
            jobs=jobs,
        )
    except core_build.BuildError as e:
        raise SuiteError(str(e)) from e
    if b.warnings:
        log("compiler warnings:\n" + b.warnings[-4000:])
    return {
        "binary": str(b.binary),
        "compiler": b.compiler,
        "compiler_version": b.compiler_version,
        "flags": FLAGS + WARNINGS,
        "link": LDLIBS,
        "cached": b.cached,
        "seconds": b.seconds,
        "warnings": b.warnings,
    }


# ---------------------------------------------------------------- timings ----
def parse_bench_output(proc: subprocess.CompletedProcess, what: str) -> dict:
    """The one JSON object bench_core prints; SuiteError when it failed or a
    self-check (counters back to zero, validate) failed."""
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise SuiteError(
            f"{what}: bench_core exited {proc.returncode} without its JSON output\n{proc.stderr[-4000:]}"
        ) from None
    if proc.returncode != 0 or not doc.get("ok"):
        raise SuiteError(
            f"{what}: bench_core exited {proc.returncode}; self-check failures: "
            f"{doc.get('failures')}\n{proc.stderr[-4000:]}"
        )
    return doc


def timing_args(repeats: int, counts: dict[str, int] | None = None) -> list[str]:
    args = ["timing", "--repeats", str(repeats)]
    for k, v in (counts or TIMING_COUNTS).items():
        args += [f"--{k}", str(v)]
    return args


def run_timings(binary: str, repeats: int, counts: dict[str, int] | None = None, timeout: float = 300) -> dict:
    try:
        proc = subprocess.run(
            [binary, *timing_args(repeats, counts)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise SuiteError(f"timings: bench_core did not finish within {timeout:.0f} s") from None
    return parse_bench_output(proc, "timings")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize_timings(raw: dict) -> dict:
    """Medians of the raw repeats, keyed like the table rows."""
    th = raw["threads"]

    def threaded(entry: dict) -> dict:
        return {
            "ns_per_op_per_thread": median(entry["ns_per_op_per_thread"]),
            "ops_per_s": median(entry["ops_per_s"]),
            "peak_reserved": entry["peak_reserved"],
            "peak_allocated": entry["peak_allocated"],
            "num_ooms": entry["num_ooms"],
            "num_alloc_retries": entry["num_alloc_retries"],
        }

    rows = {}
    for i, p in enumerate(raw["pair"]):
        rows[pair_name(p["size"])] = {
            "size": p["size"],
            "ns_per_op": median(p["ns_per_pair"]),
            "threads_1dev": threaded(th["pair_1dev"][i]),
            "threads_2dev": threaded(th["pair_2dev"][i]),
        }
    if "pair_recording" in raw:  # same as "pair 64 KiB" with the event ring on (3 events a pair)
        rec = raw["pair_recording"]
        plain = rows[pair_name(rec["size"])]["ns_per_op"]
        rows["pair_64KiB_recording"] = {
            "size": rec["size"],
            "ns_per_op": median(rec["ns_per_pair"]),
            "ns_per_event_added": (median(rec["ns_per_pair"]) - plain) / 3,
        }
    r = raw["random"]
    rows["random"] = {
        "ns_per_op": median(r["ns_per_op"]),
        "peak_reserved": r["peak_reserved"],
        "peak_allocated": r["peak_allocated"],
        "fragmentation": r["peak_reserved"] / r["peak_allocated"],
        "threads_1dev": threaded(th["random_1dev"]),
        "threads_2dev": threaded(th["random_2dev"]),
    }
    for key in ("threads_1dev", "threads_2dev"):
        t = rows["random"][key]
        t["fragmentation"] = t["peak_reserved"] / t["peak_allocated"]
    return {"threads": th["threads"], "repeats": raw["repeats"], "rows": rows}


# -------------------------------------------------------------- callgrind ----
def valgrind_version() -> str | None:
    exe = shutil.which("valgrind")
    if not exe:
        return None
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def _callgrind_one(binary: str, name: str, args: list[str], workdir: Path) -> dict:
    out_file = workdir / f"callgrind.{name}.out"
    out_file.unlink(missing_ok=True)  # never read a stale total
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        "--collect-atstart=no",
        f"--toggle-collect={CALLGRIND_REGION}",
        binary,
        "callgrind",
        *args,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        raise SuiteError(f"callgrind {name}: valgrind did not finish within 300 s") from None
    doc = parse_bench_output(proc, f"callgrind {name}")
    total = None
    if out_file.exists():
        for line in out_file.read_text().splitlines():
            m = re.match(r"^(?:totals|summary):\s+(\d+)", line)
            if m:
                total = int(m.group(1))
                break
    ops = int(doc["ops"])
    # Any real malloc+free runs hundreds of instructions: a total below one
    # per op means the region was not collected (e.g. the function renamed).
    if total is None or total < ops:
        raise SuiteError(
            f"callgrind {name}: no instructions were collected in {CALLGRIND_REGION}() "
            f'(total {total}); is the function still extern "C" and noipa in bench_core.cpp?\n' + proc.stderr[-2000:]
        )
    return {
        "args": args,
        "ops": ops,
        "ir": total,
        "ir_per_op": round(total / ops, 2),
        "command": " ".join(shlex.quote(display_path(Path(c)) if c == binary else c) for c in cmd),
        "output": display_path(out_file),
    }


def run_callgrind(
    binary: str, workloads: dict[str, list[str]] | None = None, out_dir: Path | None = None, jobs: int | None = None
) -> dict[str, dict]:
    """Instructions per op of each workload, one valgrind run each (in
    parallel: the counts do not depend on timing). The callgrind output files
    stay in out_dir (default build/cpu_bench/callgrind) for callgrind_annotate."""
    if not shutil.which("valgrind"):
        raise SuiteError(
            "valgrind is not installed: apt-get install -y valgrind "
            "(needed for the instruction counts of --check / --update-baseline)"
        )
    workloads = workloads or callgrind_workloads()
    out_dir = Path(out_dir or BUILD_DIR / "callgrind")
    out_dir.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = {n: pool.submit(_callgrind_one, binary, n, a, out_dir) for n, a in workloads.items()}
        return {n: f.result() for n, f in futures.items()}


# --------------------------------------------------------------- baseline ----
def load_baseline(path: Path = BASELINE_PATH) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def baseline_figures(baseline: dict | None) -> dict[str, float]:
    if not baseline:
        return {}
    return {k: float(v["ir_per_op"]) for k, v in baseline.get("workloads", {}).items()}


def compare_to_baseline(measured: dict[str, float], baseline: dict[str, float], tolerance: float = TOLERANCE) -> dict:
    """measured / baseline instructions per op, per workload.

    Fails (ok False) when a figure is more than `tolerance` above its
    baseline or has no baseline; a figure more than `tolerance` below only
    adds a note suggesting --update-baseline."""
    rows, failures, notes = [], [], []
    for name, value in measured.items():
        base = baseline.get(name)
        if base is None or base <= 0:
            rows.append({"workload": name, "measured": value, "baseline": None, "ratio": None, "status": "no baseline"})
            failures.append(f"{name}: no baseline figure")
            continue
        ratio = value / base
        status = "ok"
        if ratio > 1 + tolerance:
            status = "REGRESSION"
            failures.append(
                f"{name}: {value:.1f} instructions/op vs baseline {base:.1f} "
                f"(+{(ratio - 1) * 100:.1f}%, limit +{tolerance * 100:.0f}%)"
            )
        elif ratio < 1 - tolerance:
            status = "improved"
            notes.append(f"{name}: {value:.1f} instructions/op vs baseline {base:.1f} ({(ratio - 1) * 100:.1f}%)")
        rows.append({"workload": name, "measured": value, "baseline": base, "ratio": round(ratio, 4), "status": status})
    for name in baseline:
        if name not in measured:
            notes.append(f"{name}: in the baseline but not measured")
    return {"ok": not failures, "tolerance": tolerance, "rows": rows, "failures": failures, "notes": notes}


def write_baseline(
    path: Path, figures: dict[str, dict], build_info: dict, valgrind: str | None, command: str, reason: str
) -> dict:
    doc = {
        "description": "Instructions (valgrind callgrind Ir) per op of bench_core's measured region "
        f"({CALLGRIND_REGION}); an op is one malloc + one free. Checked by "
        "`python -m benchmarks cpu --check` (fails above +10%); rewritten by "
        "--update-baseline.",
        "updated": utc_now(),
        "command": command,
        "reason": reason,
        "compiler": build_info["compiler_version"],
        "flags": build_info["flags"],
        "valgrind": valgrind,
        "libc": " ".join(platform.libc_ver()),
        "workloads": {
            n: {"ir_per_op": f["ir_per_op"], "ops": f["ops"], "ir": f["ir"], "args": f["args"]}
            for n, f in figures.items()
        },
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


# ----------------------------------------------------------------- output ----
def display_path(path: Path) -> str:
    """`path` relative to the repository when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    u = platform.uname()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "uname": " ".join([u.system, u.node, u.release, u.version, u.machine]),
        "cpu_model": cpu,
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "libc": " ".join(platform.libc_ver()),
        "python": platform.python_version(),
    }


def format_table(summary: dict | None, callgrind: dict[str, dict] | None, comparison: dict | None) -> str:
    names = list(callgrind_workloads())
    threads = summary["threads"] if summary else 8
    cmp_rows = {r["workload"]: r for r in (comparison or {}).get("rows", [])}

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head1 = (
        f"{'':<14}{'1 thread':>10}  {f'{threads} threads, 1 device':>22}  {f'{threads} threads, 2 devices':>22}"
        f"  {'callgrind':>10}  {'baseline':>9}  {'ratio':>6}"
    )
    head2 = (
        f"{'workload':<14}{'ns/op':>10}  {'ns/op/thread':>13}{'Mops/s':>9}  {'ns/op/thread':>13}{'Mops/s':>9}"
        f"  {'Ir/op':>10}  {'Ir/op':>9}  {'':>6}"
    )
    lines = [head1, head2, "-" * len(head2)]
    for n in names:
        row = (summary or {}).get("rows", {}).get(n, {})
        t1, t2 = row.get("threads_1dev", {}), row.get("threads_2dev", {})
        cg = (callgrind or {}).get(n, {})
        c = cmp_rows.get(n, {})
        ratio = c.get("ratio")
        label = n.replace("pair_", "pair ").replace("KiB", " KiB").replace("MiB", " MiB")
        if label.endswith("B") and not label.endswith("iB"):
            label = label[:-1] + " B"
        lines.append(
            f"{label:<14}{f(row.get('ns_per_op'), '.1f'):>10}  "
            f"{f(t1.get('ns_per_op_per_thread'), '.0f'):>13}"
            f"{f(t1.get('ops_per_s') and t1['ops_per_s'] / 1e6, '.2f'):>9}  "
            f"{f(t2.get('ns_per_op_per_thread'), '.0f'):>13}"
            f"{f(t2.get('ops_per_s') and t2['ops_per_s'] / 1e6, '.2f'):>9}  "
            f"{f(cg.get('ir_per_op'), '.1f'):>10}  {f(c.get('baseline'), '.1f'):>9}  {f(ratio, '.3f'):>6}"
            + ("" if c.get("status") in (None, "ok") else f"  {c['status']}")
        )
    if summary:
        r = summary["rows"]["random"]
        lines.append("")
        lines.append(
            "op = one malloc + one free; medians of "
            f"{summary['repeats']} repeats; ns/op/thread = wall time / ops of one thread; "
            "Mops/s = all threads' ops / wall time."
        )
        rec = summary["rows"].get("pair_64KiB_recording")
        if rec:
            lines.append(
                f"event recording on (ring of 64 Ki records): pair 64 KiB {rec['ns_per_op']:.1f} ns/op, "
                f"{rec['ns_per_event_added']:.1f} ns added per event (3 events a pair)"
            )
        lines.append(
            f"random workload fragmentation (peak reserved / peak allocated): "
            f"1 thread {r['peak_reserved'] / MiB:.0f} / {r['peak_allocated'] / MiB:.0f} MiB = "
            f"{r['fragmentation']:.2f}"
        )
        for key, label in (
            ("threads_1dev", f"{threads} threads, 1 device"),
            ("threads_2dev", f"{threads} threads, 2 devices"),
        ):
            t = r[key]
            extra = ""
            if t["num_ooms"]:
                extra = (
                    f"; over the {summary['repeats']} rounds + warm-up, {t['num_ooms']} allocations hit "
                    f"OOM (4 GiB device) and were skipped, after {t['num_alloc_retries']} cache releases"
                )
            lines.append(
                f"  {label}: {t['peak_reserved'] / MiB:.0f} / {t['peak_allocated'] / MiB:.0f} MiB = "
                f"{t['fragmentation']:.2f}{extra}"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------- main ----
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks cpu", description="CPU benchmarks of the memalloc core (host backend)."
    )
    p.add_argument(
        "--check", action="store_true", help="exit 1 when an instructions-per-op figure is >10%% above the baseline"
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help=f"rewrite {BASELINE_PATH.relative_to(REPO)} from this run's callgrind figures",
    )
    p.add_argument("--reason", default="", help="with --update-baseline: why (stored in the baseline)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} timing repeats instead of {DEFAULT_REPEATS}")
    p.add_argument("--repeats", type=int, help="timing repeats (overrides --quick)")
    p.add_argument("--out", help="results JSON path (default benchmarks/results/<UTC date>-cpu-bench.json)")
    p.add_argument("--baseline", default=str(BASELINE_PATH), help=argparse.SUPPRESS)
    p.add_argument("--rebuild", action="store_true", help="recompile even when nothing changed")
    p.add_argument("--no-timings", action="store_true", help="skip the wall-clock timings")
    args = p.parse_args(list(argv))
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] = (), command: str | None = None) -> int:
    args = parse_args(argv)
    if command is None:
        command = "python -m benchmarks cpu " + " ".join(shlex.quote(a) for a in argv)
    t_start = time.monotonic()
    repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    baseline_path = Path(args.baseline)
    need_callgrind = args.check or args.update_baseline
    vg = valgrind_version()
    doc: dict = {"suite": "cpu", "date": utc_now(), "command": command, "machine": machine_info()}
    try:
        print("memalloc CPU suite: building bench_core ...", flush=True)
        b = build(rebuild=args.rebuild)
        built = "up to date" if b["cached"] else f"built in {b['seconds']:.1f} s"
        print(
            f"  {built}: {b['compiler_version']}, {' '.join(FLAGS)}",
            flush=True,
        )
        doc.update(
            compiler=b["compiler_version"],
            compiler_path=b["compiler"],
            flags=b["flags"],
            link=b["link"],
            build={"seconds": b["seconds"], "cached": b["cached"]},
        )
        summary = raw = None
        if not args.no_timings:
            print(f"timings: {repeats} repeats ...", flush=True)
            t0 = time.monotonic()
            raw = run_timings(b["binary"], repeats)
            summary = summarize_timings(raw)
            doc["timings"] = {
                "informational": True,
                "repeats": repeats,
                "counts": TIMING_COUNTS,
                "seconds": round(time.monotonic() - t0, 2),
                "medians": summary,
                "raw": raw,
            }
        figures = None
        if vg is None and need_callgrind:
            raise SuiteError(
                "valgrind is not installed but --check/--update-baseline need its instruction "
                "counts: install it (apt-get install -y valgrind) and rerun"
            )
        if vg is not None:
            print(f"callgrind: {len(callgrind_workloads())} workloads x {CALLGRIND_OPS} ops ...", flush=True)
            t0 = time.monotonic()
            figures = run_callgrind(b["binary"])
            doc["callgrind"] = {
                "valgrind": vg,
                "region": CALLGRIND_REGION,
                "method": "valgrind --tool=callgrind --collect-atstart=no "
                f"--toggle-collect={CALLGRIND_REGION}; Ir total of the region / ops",
                "ops": CALLGRIND_OPS,
                "seconds": round(time.monotonic() - t0, 2),
                "output_dir": str(BUILD_DIR / "callgrind"),
                "workloads": figures,
            }
        else:
            print("callgrind: skipped (valgrind not installed)", flush=True)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.update_baseline:
        write_baseline(baseline_path, figures, b, vg, command, args.reason)
        print(f"baseline written: {display_path(baseline_path)}: commit it with the reason for the change", flush=True)
    baseline = load_baseline(baseline_path)
    comparison = None
    if figures is not None and baseline is not None:
        comparison = compare_to_baseline({n: f["ir_per_op"] for n, f in figures.items()}, baseline_figures(baseline))
        comparison.update(
            baseline_path=display_path(baseline_path),
            baseline_compiler=baseline.get("compiler"),
            baseline_flags=baseline.get("flags"),
            baseline_updated=baseline.get("updated"),
            baseline_reason=baseline.get("reason"),
        )
    doc["baseline"] = comparison

    print()
    print(format_table(summary, figures, comparison))
    print()

    # Notes first, the verdict last.
    verdict: list[str] = []
    rc = 0
    if comparison is not None:
        for n in comparison["notes"]:
            if "not measured" in n:
                print(f"note: {n}")
            else:
                print(
                    f"note: {n}, more than {TOLERANCE * 100:.0f}% below the baseline: if the improvement is "
                    "real, rerun with --update-baseline --reason '...' and commit the new baseline"
                )
        if baseline.get("compiler") != b["compiler_version"] or baseline.get("flags") != b["flags"]:
            print(
                f"note: the baseline was recorded with {baseline.get('compiler')} {baseline.get('flags')}; "
                f"this run used {b['compiler_version']} {b['flags']}: instruction counts depend on the "
                "toolchain"
            )
        if comparison["failures"]:
            verdict.append(
                ("CHECK FAILED" if args.check else "WARNING")
                + f": instructions per op more than {TOLERANCE * 100:.0f}% above "
                f"{display_path(baseline_path)}:"
            )
            verdict += [f"  {f}" for f in comparison["failures"]]
            verdict.append(
                "Either fix the regression (`callgrind_annotate --inclusive=yes "
                f"{display_path(Path(doc['callgrind']['output_dir']))}/callgrind.<workload>.out` shows where "
                "the instructions go), or, if the cost is intended, rerun `python -m benchmarks cpu "
                "--update-baseline --reason '...'` and commit the new baseline with that reason."
            )
            if args.check:
                rc = 1
        elif args.check:
            verdict.append(
                f"check passed: every instructions-per-op figure is within +{TOLERANCE * 100:.0f}% "
                f"of {display_path(baseline_path)}"
            )
    elif args.check:
        verdict.append(
            f"CHECK FAILED: no baseline at {display_path(baseline_path)}: run `python -m benchmarks cpu "
            "--update-baseline --reason '...'` and commit it"
        )
        rc = 2
    doc["check"] = {"requested": args.check, "exit_status": rc, "verdict": verdict}
    doc["wall_s"] = round(time.monotonic() - t_start, 2)

    out = Path(args.out) if args.out else RESULTS_DIR / f"{doc['date'][:10]}-cpu-bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {display_path(out)} (whole run {doc['wall_s']:.1f} s)")
    for line in verdict:
        print(line)
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
