"""``python -m memalloc run [--leaks] [--out DIR] script.py [args...]``:
enable memalloc before the script starts, run it as ``__main__``, print the
memory totals at exit, and the bytes by category (parameters, gradients,
optimizer state, activations, temporaries, other) at the last step's peak.

With ``--leaks``: iteration boundaries come from every ``optimizer.step()``
(memalloc.auto_step) and from any ``memalloc.step()`` the script calls; a
leak tracker samples each one; at exit (normal, exception, Ctrl-C or
SIGTERM) the leak report is printed and written to DIR as ``leaks.json``
and ``leaks.html``.

On the host backend, with or without flags, torch's CPU tensors come from
the simulated device (memalloc.host.use_for_cpu_tensors), so a CPU script
is recorded, tracked and reported like a GPU one; the simulated device's
capacity (``host_capacity_mb``, 1 GiB by default: ``--config
host_capacity_mb:N`` for more) then bounds the script's CPU tensors.

With ``--advise``: a forward profile (memalloc.advisor.ForwardProfile:
what each module's forward keeps) and, at exit, the strategies that would
save memory, each with its estimated saving (memalloc/features/advisor.py), printed
and written to DIR as ``advice.json``. A leak tracker runs with it, with or
without ``--leaks``: the advice reads the same run as the leak report (a
leak is advised first, and the bytes it keeps are not counted as
activations that a smaller batch would save); ``leaks.json`` is written
only with ``--leaks``.

With ``--steps``: a :class:`memalloc.StepTracker` row per boundary
(allocated, reserved, peaks within the step, device use, OOMs), written at
exit to DIR as ``steps.csv`` and ``steps.json``, and ``steps.png`` when
matplotlib is installed.

An out-of-memory error in the script writes its report (memalloc/features/oom.py) to
DIR as well, with or without these flags.

In a job of several ranks (``torchrun ... -m memalloc run``: torchrun's
``RANK`` and ``WORLD_SIZE``, the latter above 1) each rank writes these
files in its own folder, ``DIR/rank<RANK>/`` (``DIR/rank0/steps.csv``,
``DIR/rank1/steps.csv``, ...), so that no rank overwrites another's; one
process writes them in DIR itself. The paths written are printed.

With ``--fit BUDGET`` (the script's batch size argument written
``{batch}``): the batch planner first (memalloc/cli/fit.py: one probe
process per small batch, then the plan printed), then the script at the
planned batch; ``--fit-only`` stops after the plan.

The flight recorder is on (memalloc/features/flight.py): the event rings go
into a file in DIR/flight that a SIGKILL, segfault or abort leaves behind,
for ``python -m memalloc postmortem DIR/flight``; so does an exception out
of the script (an OOM, Ctrl-C, SIGTERM). A clean end removes it in a single
process, leaving DIR/sites.json (its bytes by line, for ``python -m memalloc
diff``); in a job of several ranks every rank's file stays (marked exited)
for ``python -m memalloc report DIR``, which merges the ranks. The config
key ``flight_recorder_keep`` says otherwise when given (True: keep it in a
single process too; False: remove it in a job as well).
``--no-flight-recorder`` turns it off; a ``flight_recorder:`` config entry
chooses the folder instead.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
from typing import Any

from memalloc import _C
from memalloc.core import _state, iteration
from memalloc.core._config import config_value
from memalloc.core._format import describe_split, fmt_bytes
from memalloc.features import advisor, flight, oom, planner, stats
from memalloc.features.breakdown import memory_breakdown
from memalloc.features.leaks import LeakTracker
from memalloc.features.tracker import StepTracker
from memalloc.install import host
from memalloc.trace import diff, run_page
from memalloc.trace.flight_files import FlightFile, FlightFileError, read

from . import fit
from ._common import check_or_exit, enable_or_exit


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a Python script with memalloc enabled")
    p.add_argument(
        "--backend",
        default="auto",
        choices=_state.BACKENDS,
        help="cuda: the GPU; host: a simulated device, the script's CPU tensors on it; "
        "auto (default): cuda when a GPU is there, else host",
    )
    p.add_argument("--config", default=None, help="key:value,... applied after $MEMALLOC_CONF")
    p.add_argument("--leaks", action="store_true", help="track leaks per step and report them at exit")
    p.add_argument("--warmup-steps", type=int, default=1, help="steps ignored before judging growth (--leaks)")
    p.add_argument("--steps", action="store_true", help="record memory per step (steps.csv, .json, .png)")
    p.add_argument(
        "--advise",
        action="store_true",
        help="profile the forward and print which strategies would save memory (advice.json)",
    )
    p.add_argument(
        "--no-flight-recorder",
        action="store_true",
        help="do not keep the event rings in a file that outlives the process (DIR/flight)",
    )
    p.add_argument(
        "--out",
        default="memalloc-report",
        help="folder for leaks.json/.html (--leaks), steps.csv/.json/.png (--steps) and OOM reports "
        "(in a job of several ranks: OUT/rank<RANK>/ for each rank's) and the flight recorder "
        "(OUT/flight)",
    )
    p.add_argument(
        "--fit",
        metavar="BUDGET",
        default=None,
        help="find the largest batch that fits BUDGET (bytes, 7GiB, 512MiB or 'free') before running: "
        "the script's batch size argument is written {batch} (memalloc/cli/fit.py)",
    )
    p.add_argument("--fit-probes", default="2,4,8", help="the small batch sizes --fit runs (default 2,4,8)")
    p.add_argument("--fit-steps", type=int, default=2, help="recorded optimizer steps per probe, after one (--fit)")
    p.add_argument("--fit-max", type=int, default=1 << 16, help="the largest batch --fit considers")
    p.add_argument("--fit-only", action="store_true", help="print the plan and stop (--fit)")
    p.add_argument("--fit-probe-out", default=None, help=argparse.SUPPRESS)  # a probe's child process
    p.add_argument("--fit-probe-batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("script", help="the Python script to run (as `python SCRIPT ARGS...` would)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(func=main)


def _check_fit(args: argparse.Namespace) -> tuple[int | None, tuple[int, ...]]:
    """--fit's arguments, before anything runs: (the budget in bytes, None
    for 'free'; the probe batch sizes). SystemExit naming what to give."""
    fit.check_placeholder(args.script_args)
    budget = fit.parse_budget(args.fit)
    if args.fit_steps < 1 or args.fit_max < 1:
        raise SystemExit("memalloc: --fit-steps and --fit-max must be >= 1")
    probes = fit.parse_probes(args.fit_probes)
    if args.fit_max < max(probes):
        raise SystemExit(f"memalloc: --fit-max {args.fit_max} is below the largest probe ({max(probes)})")
    return budget, probes


def _fit_first(args: argparse.Namespace, probes: tuple[int, ...], budget: int | None) -> list:
    """--fit's probes, each a child ``memalloc run`` of the script (before
    this process touches the device); each child refuses a ``budget``
    (bytes) larger than its device before the script runs."""
    config = ["--config", args.config] if args.config else []

    def argv_for(batch: int, out: str, folder: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "memalloc",
            "run",
            "--backend",
            args.backend,
            *config,
            "--no-flight-recorder",
            "--out",
            folder,
            "--fit-probe-out",
            out,
            "--fit-probe-batch",
            str(batch),
            "--fit-steps",
            str(args.fit_steps),
            args.script,
            *fit.with_batch(args.script_args, batch),
        ]

    return fit.run_probes(argv_for, probes, budget)


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally below: reports are still written


def main(args: argparse.Namespace) -> int:
    check_or_exit(args.backend, args.config)
    probing = args.fit_probe_out is not None
    planning = args.fit is not None and not probing
    budget, probes = _check_fit(args) if planning else (None, ())
    if not os.path.isfile(args.script):
        raise SystemExit(f"memalloc: no such script: {args.script}")
    if args.warmup_steps < 0:
        raise SystemExit("memalloc: --warmup-steps must be >= 0")
    rank, world = job_rank()
    # this process's reports: OUT itself, or OUT/rank<N> in a job of several ranks (a probe: --fit's folder)
    out = args.out if probing else rank_folder(args.out, rank, world)
    try:  # leak reports and OOM reports go there
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"memalloc: cannot create the report folder {out!r}: {e}") from None
    records = _fit_first(args, probes, budget) if planning else None
    backend = enable_or_exit(args.backend, args.config)
    if backend == "host":
        # With or without flags, a CPU script's tensors come from the simulated
        # device, so the flight recorder, postmortem and top see the script
        # (its capacity, host_capacity_mb, then bounds the script's CPU tensors).
        host.use_for_cpu_tensors()
    if probing:
        fit.start_probe(args.fit_probe_batch, args.fit_steps, args.fit_probe_out)
    plan = None  # --fit's plan: the advice's batch figures come from it
    if records is not None:
        plan = fit.plan_of(records, budget, args.fit_max)
        extra = planner.refinement(plan)
        if extra is not None:  # one more probe, at half the plan (planner.refinement says why)
            records += _fit_first(args, (extra,), budget)
            plan = fit.plan_of(records, budget, args.fit_max)
        print(f"memalloc: {plan}", file=sys.stderr, flush=True)
        if args.fit_only:
            return 0
        args.script_args = fit.with_batch(args.script_args, plan.batch)
        print(f"memalloc: running {args.script} {' '.join(args.script_args)}", file=sys.stderr, flush=True)
    oom.set_oom_report(directory=out)  # an OOM writes its report next to the leak report
    flight_dir = None
    keep_flight = False
    if not args.no_flight_recorder and flight.current() is None:
        flight_dir = os.path.join(args.out, "flight")  # every rank's file in one folder, for `report`
        keep_flight = _keep_flight(args.config, world)
        flight.start(flight_dir, keep=keep_flight)
    if args.leaks or args.steps or args.advise:
        iteration.auto_step()  # a boundary after every optimizer.step()
    # --advise tracks leaks too: the advice must not count a leak as activations
    tracker = _start_leaks(args.warmup_steps) if args.leaks or args.advise else None
    step_tracker = _start_steps() if args.steps else None
    advice = _start_advice() if args.advise else None
    sys.argv = [args.script, *args.script_args]
    # As `python script.py` does: the script's folder first on sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    previous = signal.signal(signal.SIGTERM, _sigterm)
    script_globals: dict | None = None  # keeps the script's objects alive for the holder search
    clean = False
    try:
        script_globals = runpy.run_path(args.script, run_name="__main__")
        clean = True
        if probing:
            fit.probe_ended_early(args.fit_steps)
            return 2
    except SystemExit as e:
        clean = e.code in (0, None)  # sys.exit(0) is a clean end, SIGTERM (above) is not
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if step_tracker is not None:
            _write_steps(step_tracker, out)
        leak_report = None
        if tracker is not None:
            leak_report = _write_leaks(tracker, out) if args.leaks else _leaks_for_advice(tracker)
        if advice is not None:
            _write_advice(*advice, out, leak_report, plan)  # the leaks come first, not counted as activations
        _print_totals(backend)
        del script_globals
        own = _own_flight_file()  # read once, for the page and sites.json
        if not probing:
            _write_page(out, own, "exited" if clean else "raised")
        if flight_dir is not None:
            # a clean end: the file goes, and its folder when nothing else is in it,
            # leaving out/sites.json (what `diff` reads of it); an exception (an OOM,
            # Ctrl-C, SIGTERM) leaves the file for postmortem
            if clean and not keep_flight and own is not None:
                _write_sites(out, own)
            flight.stop(clean)
            try:
                os.rmdir(flight_dir)
            except OSError:
                pass
            if clean and keep_flight:
                how = f"rank {rank} of {world}: " if world > 1 else ""
                print(
                    f"memalloc: {how}the flight recorder file stays in {flight_dir} "
                    f"(python -m memalloc report {args.out})",
                    file=sys.stderr,
                )
    return 0


def _own_flight_file() -> FlightFile | str | None:
    """This process's flight recorder file, its stacks interned since the
    last step written first (FlightRecorder.sync): read, or its path when it
    cannot be read (the readers then say why); None when none runs."""
    recorder = flight.current()
    if recorder is None:
        return None
    recorder.sync()
    try:
        return read(recorder.path)
    except FlightFileError:
        return recorder.path


def _write_page(out: str, own: FlightFile | str | None, state: str) -> None:
    """``out/index.html``: the run's page (memalloc/trace/run_page.py), from
    the flight file and the reports written to ``out``; a page that cannot
    be written says why on stderr and ends nothing (it runs in the end's
    cleanup, before the flight recorder stops)."""
    try:
        path = run_page.write(out, own, state=state)
    except Exception as e:  # noqa: BLE001 - a page that fails must not cut the cleanup short
        print(f"memalloc: no run page: {type(e).__name__}: {e}", file=sys.stderr)
        return
    print(f"memalloc: wrote {path}", file=sys.stderr)


def _write_sites(out: str, own: FlightFile | str) -> None:
    """``out/sites.json``: the running flight file's bytes by line at the peak
    and per step (trace/diff.py), for ``python -m memalloc diff``; a run
    diff cannot read (several devices used) says why on stderr instead."""
    try:
        diff.save_summary(own, os.path.join(out, diff.SUMMARY))
    except (diff.DiffError, OSError) as e:
        print(f"memalloc: no {diff.SUMMARY} for `memalloc diff`: {e}", file=sys.stderr)


def job_rank() -> tuple[int, int]:
    """(rank, world size) of this process from torchrun's ``RANK`` and
    ``WORLD_SIZE``; (0, 1) outside a job (or when they are not numbers)."""
    try:
        return int(os.environ.get("RANK", "0")), max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 0, 1


def rank_folder(out: str, rank: int, world: int) -> str:
    """Where this process writes its reports: ``out`` for a single process,
    ``out/rank<rank>`` in a job of several ranks (each rank its own files)."""
    return out if world <= 1 else os.path.join(out, f"rank{rank}")


def _keep_flight(config: str | None, world: int) -> bool:
    """Whether the flight recorder file stays at a clean end: as
    ``flight_recorder_keep`` says when MEMALLOC_CONF or --config gives it,
    otherwise in a job of several ranks (``report OUT`` merges them) and not
    in a single process."""
    given = any(
        key == "flight_recorder_keep"
        for text in (os.environ.get("MEMALLOC_CONF", ""), config or "")
        for key, _ in _C.config_entries(text)
    )
    if given:
        installed = _state.installed_config()
        assert installed is not None  # main() enabled memalloc (enable_or_exit) before
        return config_value(installed, "flight_recorder_keep") == "True"
    return world > 1


def _start_leaks(warmup_steps: int):
    return LeakTracker(warmup_steps=warmup_steps).start()


def _start_steps():
    return StepTracker().start()


def _start_advice() -> tuple[advisor.ForwardProfile, dict]:
    """A forward profile of the current device, and the reserved bytes at
    each step boundary (the last one is what del + empty_cache would cut)."""
    device = stats.device_index(None)
    seen: dict = {"device": device, "reserved_after": None}

    def at_boundary(step: int) -> None:
        seen["reserved_after"] = stats.memory_reserved(device)

    iteration.add_step_listener(at_boundary)
    seen["listener"] = at_boundary
    return advisor.ForwardProfile(device=device).start(), seen


def _write_advice(profile: advisor.ForwardProfile, seen: dict, out: str, leaks: Any = None, plan: Any = None) -> None:
    profile.stop()
    iteration.remove_step_listener(seen["listener"])
    b = memory_breakdown(seen["device"])
    p = profile.profile()
    advice = advisor.advise(b, p, seen["reserved_after"], leaks=leaks, plan=plan)
    print(advisor.to_text(advice, b), file=sys.stderr)
    path = os.path.join(out, "advice.json")
    with open(path, "w") as f:
        json.dump(
            {
                "schema": "memalloc.advice/1",
                "breakdown": b.to_dict(),
                "reserved_after": seen["reserved_after"],
                "profile": p.to_dict() if p is not None else None,
                "advice": [a.to_dict() for a in advice],
            },
            f,
            indent=1,
        )
    print(f"memalloc: wrote {path}", file=sys.stderr)


def _write_steps(tracker, out: str) -> None:
    tracker.stop()
    tracker.to_csv(os.path.join(out, "steps.csv"))
    tracker.to_json(os.path.join(out, "steps.json"))
    written = "steps.csv and steps.json"
    if tracker.rows:
        try:
            tracker.plot(os.path.join(out, "steps.png"))
            written += " and steps.png"
        except ImportError as e:
            written += f" (no steps.png: {e})"
    print(f"memalloc: {len(tracker.rows)} steps recorded; wrote {written} to {out}", file=sys.stderr)


def _write_leaks(tracker, out: str) -> Any:
    tracker.stop()
    print(f"memalloc: analysing {len(tracker.samples)} steps for leaks ...", file=sys.stderr, flush=True)
    report = tracker.report()
    print(report.to_text(), file=sys.stderr)
    report.to_json(os.path.join(out, "leaks.json"))
    report.to_html(os.path.join(out, "leaks.html"))
    print(f"memalloc: wrote {os.path.join(out, 'leaks.json')} and {os.path.join(out, 'leaks.html')}", file=sys.stderr)
    return report


def _leaks_for_advice(tracker) -> Any:
    """--advise without --leaks: the leak report the advice reads, not
    printed or written (the advice names each leak first)."""
    tracker.stop()
    return tracker.report()


def _print_totals(backend: str) -> None:
    """Per device used: the peaks and counts, and the bytes by category at
    the last step's peak."""
    a = _state.installed_allocator()
    for d in range(a.device_count):
        s = a.stats(d)
        if s["allocation"]["all"]["allocated"] == 0:
            continue
        print(
            f"memalloc ({backend}, device {d}): peak allocated "
            f"{fmt_bytes(s['allocated_bytes']['all']['peak'])}, peak reserved "
            f"{fmt_bytes(s['reserved_bytes']['all']['peak'])}, "
            f"{s['allocation']['all']['allocated']} allocations, "
            f"{s['num_device_alloc']} device allocations, {s['num_ooms']} OOMs",
            file=sys.stderr,
        )
        print(f"memalloc by category ({backend}, device {d}): {_breakdown_line(d)}", file=sys.stderr)


def _breakdown_line(device: int) -> str:
    """The bytes by category at the last step's peak, largest first."""
    b = memory_breakdown(device)
    where = f"at step {b.peak_step}'s peak" if b.peak_step is not None else "at the peak so far (no step ended)"
    return f"{where}: " + (describe_split(b.peak) or "nothing allocated")
