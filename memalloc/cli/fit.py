"""``python -m memalloc run --fit BUDGET script.py ... {batch} ...``: the
batch planner (memalloc/features/planner.py) for a script that reads its
batch size from an argument.

The script's arguments name the batch size with ``{batch}`` (for example
``--batch-size {batch}``). For each probe batch (``--fit-probes``, default
2,4,8) the script runs in a fresh process under memalloc with the event ring
on from the start, its ``{batch}`` replaced by the probe, until its
``1 + --fit-steps`` th ``optimizer.step()`` (or ``memalloc.step()``); the
child writes what it recorded (planner.ProbeRecord) and ends there. The
planner then predicts the largest batch that fits BUDGET, prints it, and
runs the script with ``{batch}`` replaced by it (``--fit-only``: print and
stop).

A probe is planner.ProbeRecording, as in memalloc.largest_batch: the child
notes where each step ends (its boundaries) and stops after ``1 +
--fit-steps``, so the replay knows the step it repeats in both.

BUDGET: bytes the allocator may reserve: an int of bytes, or a number with
a unit (``7GiB``, ``7.5G``, ``512MiB``, ``500MB``), or ``free`` (the
device's free memory when the plan is made); planner.parse_size reads it, as
it reads memalloc.largest_batch's budget. A budget larger than the device
can give (its total memory, the host backend's capacity, under the memory
fraction) is refused with the most it can: by the first probe's process,
before the script runs in it (run_probes(..., budget) passes the budget to
each probe in MEMALLOC_FIT_BUDGET: the parent does not touch the device
before its probes; memalloc/cli/run.py's _fit_first passes it), and again
by the parent before it plans.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

from memalloc.core import _state, iteration
from memalloc.features import planner

PLACEHOLDER = "{batch}"
BUDGET_ENV = "MEMALLOC_FIT_BUDGET"  # the budget in bytes, for a probe's process to check before the script runs
REFUSED = 4  # a probe's exit status: the budget is more than its device can give (the message on stderr)
PROBE_RING = 1 << 20  # records (64 MiB): the probe child records from the start, model creation included


def parse_budget(text: str) -> int | None:
    """BUDGET as bytes (planner.parse_size, memalloc.largest_batch's parser);
    None for ``free``. SystemExit naming the forms."""
    try:
        return planner.parse_size(text)
    except planner.PlannerError:
        raise SystemExit(f"memalloc: --fit {text!r}: give {planner.BUDGET_FORMS}") from None


def parse_probes(text: str) -> tuple[int, ...]:
    try:
        probes = tuple(int(x) for x in text.split(","))
    except ValueError:
        probes = ()
    if len(set(probes)) < 2 or min(probes) < 1:
        raise SystemExit(
            f"memalloc: --fit-probes {text!r}: give two or more different batch sizes, comma-separated (2,4,8)"
        )
    return probes


def with_batch(script_args: Sequence[str], batch: int) -> list[str]:
    return [a.replace(PLACEHOLDER, str(batch)) for a in script_args]


def check_placeholder(script_args: Sequence[str]) -> None:
    if not any(PLACEHOLDER in a for a in script_args):
        raise SystemExit(
            f"memalloc: --fit needs the script's batch size argument written as {PLACEHOLDER} "
            f"(for example: run --fit 7GiB train.py --batch-size {PLACEHOLDER})"
        )


# ---- the child: one probe ---------------------------------------------------------
def start_probe(batch: int, steps: int, out: str) -> None:
    """In the probe's process, after enable(): a budget in MEMALLOC_FIT_BUDGET
    that is more than the device can give is refused first (exit REFUSED,
    the message on stderr); the probe (planner.ProbeRecording) records from
    now, each boundary is a step's end, and at the (1 + steps)-th the record
    is written to ``out`` and the process ended (exit 0)."""
    a = _state.installed_allocator()
    budget = os.environ.get(BUDGET_ENV)
    if budget:
        try:
            planner.check_budget(a, 0, int(budget), default="--fit free")
        except planner.PlannerError as e:
            print(f"memalloc: {e}", file=sys.stderr, flush=True)
            os._exit(REFUSED)
    rec = planner.ProbeRecording(a, 0, PROBE_RING, batch, steps)
    iteration.auto_step()

    def at_boundary(step: int) -> None:
        if not rec.step_ended():
            return
        record, lost = rec.finish()
        if record is None:
            print(
                f"memalloc: the probe at batch {batch} lost {lost} events (more than {PROBE_RING} recorded): "
                "give --fit-steps 1 or smaller --fit-probes",
                file=sys.stderr,
            )
            os._exit(3)
        planner.save_records([record], out)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the probe has what it came for: the script stops here

    iteration.add_step_listener(at_boundary)


def probe_ended_early(steps: int) -> None:
    """The script returned before the probe's last step."""
    print(
        f"memalloc: the script ended before optimizer.step() number {1 + steps}: a probe runs 1 + "
        f"--fit-steps ({steps}) steps; give the script more steps or --fit-steps {max(1, steps - 1)}",
        file=sys.stderr,
    )


# ---- the parent: probes, plan, run ------------------------------------------------
def run_probes(
    argv_for: Callable[[int, str, str], list[str]], probes: Sequence[int], budget: int | None = None
) -> list[planner.ProbeRecord]:
    """One child process per probe (``argv_for(batch, record path, report
    folder)``). ``budget`` (bytes; None: ``free``) goes to each child, which
    refuses one larger than its device can give before the script runs:
    SystemExit with its message, no probe taken."""
    records = []
    env = {k: v for k, v in os.environ.items() if k != BUDGET_ENV}
    if budget is not None:
        env[BUDGET_ENV] = str(budget)
    with tempfile.TemporaryDirectory(prefix="memalloc-fit-") as tmp:
        for b in sorted(set(probes)):
            out = os.path.join(tmp, f"probe-{b}.json")
            print(f"memalloc: probing batch {b} ...", file=sys.stderr, flush=True)
            p = subprocess.run(argv_for(b, out, tmp), capture_output=True, text=True, env=env)
            if p.returncode == REFUSED:
                refusal = [line for line in (p.stderr or "").splitlines() if line.startswith("memalloc: budget ")]
                raise SystemExit(refusal[-1] if refusal else f"memalloc: the probe at batch {b} refused the budget")
            if p.returncode != 0 or not os.path.exists(out):
                tail = "\n".join((p.stderr or "").strip().splitlines()[-15:])
                raise SystemExit(f"memalloc: the probe at batch {b} failed (exit {p.returncode}):\n{tail}")
            records.extend(planner.load_records(out))
    return records


def plan_of(records: Sequence[planner.ProbeRecord], budget: int | None, max_batch: int) -> planner.BatchPlan:
    """The plan under the installed allocator's policy (budget None: its
    default_budget; a budget larger than device 0 can give is refused)."""
    a = _state.installed_allocator()
    try:
        if budget is None:
            budget = planner.default_budget(a, 0)
        else:
            planner.check_budget(a, 0, budget, default="--fit free")
        return planner.plan(records, budget, planner.policy_config(a), max_batch=max_batch)
    except planner.PlannerError as e:
        raise SystemExit(f"memalloc: {e}") from None
