"""Every framework x every way of running it (issue 37, the real-paths
suite), on the host backend: a plain PyTorch loop, Lightning's automatic
optimization (two batches accumulated per optimizer step) and manual
optimization, HF Trainer (two micro-batches per step) and accelerate (its
accumulation skips every other ``opt.step()``), each a script of
tests/real_paths_cases/ that plants a leak (a list keeping one 64 KiB tensor
per forward), run

- ``enable``: as ``python script.py`` with ``memalloc.enable()`` in the
  script and its flight recorder on (``flight_recorder:DIR``), the process
  SIGKILLed after its last step;
- ``none``: as ``python -m memalloc run --out D script.py`` with no flag
  (MEMALLOC_CONF keeps the flight file at the clean end);
- ``steps``, ``leaks``, ``advise``: the same with ``--steps``, ``--leaks``,
  ``--advise``;
- ``fit`` (the plain script only, whose batch size is an argument):
  ``--fit BUDGET``.

Every figure memalloc writes is checked against a truth the script computes
of itself with torch alone (tests/real_paths_cases/truth.py): the optimizer
steps torch really took (its global post-step hook) and the framework's own
count of them, how many tensors the leak list gained in each, the bytes of
one, and the storages of the parameters, gradients and optimizer state.
Then a 2-rank torchrun job (gloo) under ``run`` whose rank 1 SIGKILLs itself
mid-run: ``python -m memalloc report D`` still reads both ranks.

One fresh process per (loop, mode), run when a test first needs it and
shared by the module's tests. The slow tier (CI runs it).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from memtest_helpers import REPO, require_library

from memalloc.core._format import fmt_bytes
from memalloc.trace import flight_files as ff

sys.path.insert(0, str(REPO / "tests" / "recording_cases"))
from flight_checks import SPLIT_ENTRY, memalloc_run  # noqa: E402

pytestmark = pytest.mark.slow

CASES = REPO / "tests" / "real_paths_cases"
# loop: (script, its arguments after the truth file, the library it needs)
LOOPS = {
    "plain": ("plain.py", [], None),
    "lightning_automatic": ("lightning_loop.py", ["automatic"], "lightning"),
    "lightning_manual": ("lightning_loop.py", ["manual"], "lightning"),
    "hf_trainer": ("hf_trainer.py", [], "transformers"),
    "accelerate": ("accelerate_loop.py", [], "accelerate"),
}
# The function the leak line is in, as a stack names it.
LEAK_FUNCTION = {
    "plain": "<module>",
    "lightning_automatic": "training_step",
    "lightning_manual": "training_step",
    "hf_trainer": "compute_loss",
    "accelerate": "<module>",
}
QUALNAME = dict(
    LEAK_FUNCTION,
    lightning_automatic="Module.training_step",
    lightning_manual="Module.training_step",
    hf_trainer="KeepingTrainer.compute_loss",
)
FLAGS = {"none": [], "steps": ["--steps"], "leaks": ["--leaks"], "advise": ["--advise"]}
MODES = ("enable", *FLAGS)
CAPACITY = "host_capacity_mb:1024"


class Run:
    """One (loop, mode) run: its process, folder, truth and script."""

    def __init__(self, loop: str, mode: str, d: Path, p: subprocess.CompletedProcess) -> None:
        self.loop, self.mode, self.dir, self.p = loop, mode, d, p
        self.out = d / "out"
        self.script = CASES / LOOPS[loop][0]
        source = self.script.read_text().splitlines()
        self.leak_line = next(i for i, l in enumerate(source, 1) if l.endswith("# LEAK-LINE"))
        self.truth = json.loads((d / "truth.json").read_text())
        t = self.truth
        per_step = set(t["kept_per_step"])
        assert len(per_step) == 1, t  # every step keeps as many tensors: its bytes per step
        self.kept_per_step = per_step.pop()
        self.leak_per_step = self.kept_per_step * t["leak_bytes"]
        self.steps = t["optimizer_steps"]
        # what the list holds at the last boundary, and when the last step began
        self.kept_at_end = sum(t["kept_per_step"]) * t["leak_bytes"]
        self.kept_before_last = sum(t["kept_per_step"][:-1]) * t["leak_bytes"]

    @property
    def where(self) -> str:
        return f"{self.script}:{self.leak_line}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fresh_python):
    """run(loop, mode) -> Run, each (loop, mode) run once for the module."""
    done: dict[tuple[str, str], Run] = {}

    def run(loop: str, mode: str) -> Run:
        if (loop, mode) in done:
            return done[loop, mode]
        script, args, library = LOOPS[loop]
        if library:
            require_library(library)
        d = tmp_path_factory.mktemp(f"{loop}-{mode}")
        argv = [str(CASES / script), str(d / "truth.json"), *args]
        e = fresh_python.env(OMP_NUM_THREADS="1")
        if mode == "enable":
            e.update(REAL_PATHS_ENABLE=str(d / "flight"), REAL_PATHS_KILL="1")
            p = fresh_python.run(argv, cwd=d, env=e, timeout=300)
            assert p.returncode == -9, (p.returncode, p.stderr[-3000:])
        else:
            if mode == "none":
                e["MEMALLOC_CONF"] = "flight_recorder_keep:True"
            p = fresh_python.run(
                [
                    "-m",
                    "memalloc",
                    "run",
                    "--backend",
                    "host",
                    "--config",
                    CAPACITY,
                    *FLAGS[mode],
                    "--out",
                    str(d / "out"),
                    *argv,
                ],
                cwd=d,
                env=e,
                timeout=300,
            )
            assert p.returncode == 0, p.stderr[-3000:]
        done[loop, mode] = r = Run(loop, mode, d, p)
        return r

    return run


# Lightning's automatic optimization with accumulate_grad_batches: the optimizer step's closure runs
# the forward and backward of the last micro-batch, after the backward of the first one ran outside
# it. memalloc/features/phases.py takes such a step for one without a closure (a backward already
# ran in the step) and enters the optimizer phase before the closure: the forward's blocks still
# live (the kept tensor) become optimizer_state, and Adam's state, allocated after the closure's
# backward returned to the forward phase, is activations. Open (phases.py is not this suite's).
def by_loop():
    """Parametrizes over the loops."""
    return pytest.mark.parametrize("loop", sorted(LOOPS))


# ---- the script's own truths agree with the framework --------------------------------------
@by_loop()
def test_the_framework_took_the_steps_the_script_counted(runs, loop):
    t = runs(loop, "none").truth
    assert t["optimizer_steps"] == t["framework_steps"] == 6, t
    assert t["kept_per_step"] == [2 if loop in ("lightning_automatic", "hf_trainer", "accelerate") else 1] * 6


# ---- what every run under `memalloc run` prints at its end -----------------------------------
TOTALS = re.compile(
    r"memalloc \(host, device 0\): peak allocated (.+?), peak reserved (.+?), (\d+) allocations, "
    r"(\d+) device allocations, (\d+) OOMs"
)
BY_CATEGORY = re.compile(r"memalloc by category \(host, device 0\): at step (\d+)'s peak: (.*)")


def totals(stderr: str) -> dict:
    (m,) = TOTALS.findall(stderr)
    (c,) = BY_CATEGORY.findall(stderr)
    return {
        "peak_allocated": m[0],
        "peak_reserved": m[1],
        "ooms": int(m[4]),
        "step": int(c[0]),
        "split": {cat: text for cat, text, _ in SPLIT_ENTRY.findall(c[1])},
    }


@pytest.mark.parametrize("mode", list(FLAGS))
@by_loop()
def test_the_totals_at_exit_name_the_last_step_and_the_model_and_optimizer(runs, loop, mode):
    r = runs(loop, mode)
    got = totals(r.p.stderr)
    assert got["ooms"] == 0 and got["step"] == r.steps, got
    # at the last step's peak: the model's parameters and the optimizer's state, to the byte
    assert got["split"]["parameters"] == fmt_bytes(r.truth["parameters"]), got
    assert got["split"]["optimizer_state"] == fmt_bytes(r.truth["optimizer_state"]), got


# ---- no flag: the flight file records the last step and the line that keeps memory ----------
def check_flight(r: Run, folder: Path, state: str, cli_here) -> None:
    (path,) = ff.files_in(folder)
    f = ff.read(path)
    assert (f.state, f.step, f.rank, f.world_size, f.backend) == (state, r.steps, 0, 1, "host"), (f.state, f.step)
    p = cli_here("postmortem", str(folder))
    assert p.returncode == 0, p.stderr
    sites = p.stdout.split("live memory at the end by line")[1].split("  last ")[0].splitlines()[1:]
    kept = sum(r.truth["kept_per_step"])
    leak = f"{fmt_bytes(r.kept_at_end)} in {kept} blocks  {r.where} in {QUALNAME[r.loop]}"
    assert [s.strip() for s in sites if f" {r.where} " in s] == [leak], p.stdout
    assert f"last step: {r.steps}" in p.stdout, p.stdout


@by_loop()
def test_a_plain_run_keeps_a_flight_file_at_the_last_step(runs, loop, memalloc_cli_here):
    r = runs(loop, "none")
    check_flight(r, r.out / "flight", "exited", memalloc_cli_here)


@by_loop()
def test_enable_in_the_script_leaves_a_flight_file_at_the_last_step_when_killed(runs, loop, memalloc_cli_here):
    r = runs(loop, "enable")
    check_flight(r, r.dir / "flight", "running", memalloc_cli_here)


# ---- --steps: one row per optimizer step the framework took ----------------------------------
def steps_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: float(v) if k == "time_s" else int(v) for k, v in row.items()} for row in csv.DictReader(f)]


@by_loop()
def test_steps_has_a_row_per_optimizer_step_with_the_model_optimizer_and_leak(runs, loop):
    r = runs(loop, "steps")
    rows = steps_rows(r.out / "steps.csv")
    doc = json.loads((r.out / "steps.json").read_text())
    assert [row["step"] for row in rows] == list(range(1, r.steps + 1)), rows
    assert doc["rows"] == [dict(row, time_s=d["time_s"]) for row, d in zip(rows, doc["rows"])]
    assert f"memalloc: {r.steps} steps recorded" in r.p.stderr
    t = r.truth
    for row in rows:
        assert row["num_ooms"] == 0 and row["allocated"] <= row["peak_allocated"] <= row["peak_reserved"]
        assert row["reserved"] <= row["device_used"] and row["device_total"] == 1024 << 20
        assert row["peak_parameters"] == t["parameters"], row
        assert (
            sum(
                row[f"peak_{c}"]
                for c in ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
            )
            == row["peak_allocated"]
        )
    for row in rows[1:]:  # the optimizer's state exists from the first step on
        assert row["peak_optimizer_state"] == t["optimizer_state"], (row["step"], row, t)
    # between the boundaries of the steady steps, what the run holds grows by the leak alone
    for before, row in zip(rows[1:], rows[2:-1]):
        assert row["allocated"] - before["allocated"] == r.leak_per_step, (before, row)
    got = totals(r.p.stderr)
    assert got["peak_allocated"] == fmt_bytes(max(row["peak_allocated"] for row in rows)), (got, rows)


# ---- --leaks: the planted leak at its line, to the byte --------------------------------------
@by_loop()
def test_leaks_reports_the_planted_leak_at_its_line_to_the_byte(runs, loop):
    r = runs(loop, "leaks")
    report = json.loads((r.out / "leaks.json").read_text())
    assert report["steps"] == list(range(1, r.steps + 1))
    assert report["boundaries"] == f"{r.steps} from optimizer.step()", report["boundaries"]
    (leak,) = report["leaks"]
    assert (leak["site"]["filename"], leak["site"]["line"]) == (str(r.script), r.leak_line), leak["site"]
    assert leak["bytes_per_step"] == r.leak_per_step and leak["tensors_per_step"] == r.kept_per_step, leak
    assert leak["retained_bytes"] == r.kept_at_end and leak["retained_tensors"] == sum(r.truth["kept_per_step"])
    assert leak["first_step"] == 1 and leak["holder"]["name"] == "kept", leak
    text = r.p.stderr
    assert (
        f"#1 {r.where} in {LEAK_FUNCTION[r.loop]}: +{fmt_bytes(r.leak_per_step)} per step "
        f"({r.kept_per_step}.0 tensors), {fmt_bytes(r.kept_at_end)} retained"
    ) in text, text[-3000:]
    assert f"{r.where}" in (r.out / "leaks.html").read_text()


# ---- --advise: advice that agrees with the run and with its leak report ----------------------
def advice_of(r: Run) -> tuple[dict, dict]:
    data = json.loads((r.out / "advice.json").read_text())
    return data, {a["strategy"]: a for a in data["advice"]}


@by_loop()
def test_advise_puts_the_leak_first(runs, loop):
    r = runs(loop, "advise")
    data, got = advice_of(r)
    first = data["advice"][0]
    assert first["strategy"] == "fix_leak" and [a["strategy"] for a in data["advice"]].count("fix_leak") == 1
    assert first["why"].startswith(f"fix the leak at {r.where}: +{fmt_bytes(r.leak_per_step)} per step"), first
    assert first["saves"] == r.kept_before_last  # the list when the peak's (last) step began
    assert data["breakdown"]["peak_step"] == r.steps
    assert "ddp" not in got and "a second GPU" not in r.p.stderr  # the host backend: no second GPU
    assert not (r.out / "leaks.json").exists()  # --advise alone writes no leak report


@by_loop()
def test_advise_agrees_with_the_leak_report_of_the_same_script(runs, loop):
    leak = json.loads((runs(loop, "leaks").out / "leaks.json").read_text())["leaks"][0]
    r = runs(loop, "advise")
    first = advice_of(r)[0]["advice"][0]
    assert first["why"].startswith(
        f"fix the leak at {leak['site']['filename']}:{leak['site']['line']}: "
        f"+{fmt_bytes(leak['bytes_per_step'])} per step "
        f"({fmt_bytes(leak['retained_bytes'])} in {leak['retained_tensors']} tensors"
    ), first


@by_loop()
def test_advise_figures_are_true_of_the_run(runs, loop):
    r = runs(loop, "advise")
    data, got = advice_of(r)
    t, peak = r.truth, data["breakdown"]["peak"]
    # a smaller batch saves at most half of what is neither the model, the optimizer's state nor the
    # leak (the list's tensors when the peak's step began: they do not scale with the batch)
    fixed = t["parameters"] + t["optimizer_state"] + r.kept_before_last
    for strategy in ("half_batch", "grad_accumulation"):
        if strategy in got:
            assert got[strategy]["saves"] <= (data["breakdown"]["peak_total"] - fixed) // 2, got[strategy]
    # del + empty_cache: what must stay reserved is at least what the run held at its last
    # boundary: the model, its gradients, the optimizer's state and the leak
    held = t["parameters"] + t["gradients"] + t["optimizer_state"] + r.kept_at_end
    assert held <= data["profile"]["held_between_steps"]
    if "del_empty_cache" in got:
        stays = data["reserved_after"] - got["del_empty_cache"]["saves"]
        assert data["profile"]["held_between_steps"] <= stays <= data["reserved_after"], stays
    # an 8-bit optimizer saves 3/4 of the optimizer's own state, which the run's breakdown holds
    assert peak["optimizer_state"] == t["optimizer_state"], (peak, t)
    if "optimizer_state" in got:
        assert got["optimizer_state"]["saves"] == t["optimizer_state"] * 3 // 4, got["optimizer_state"]


@by_loop()
def test_advise_reads_what_the_run_held_as_steps_csv_does(runs, loop):
    held = advice_of(runs(loop, "advise"))[0]["profile"]["held_between_steps"]
    assert held == steps_rows(runs(loop, "steps").out / "steps.csv")[-1]["allocated"]


# ---- --fit: the planned batch runs within the budget -----------------------------------------
# The plain loop without its leak: with one, the plan leaves room for the leak's growth over more
# steps than the script takes (a leaking step never settles, so the planner replays MAX_REPEATS
# steps beyond its probes': test_planner_no_oom's leaking case), so it is not within 5% of the
# largest batch that runs the script's own 6 steps.
FIT_BUDGET = 4 << 20


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory, fresh_python):
    d = tmp_path_factory.mktemp("plain-fit")
    p = fresh_python.run(
        [
            "-m",
            "memalloc",
            "run",
            "--backend",
            "host",
            "--fit",
            str(FIT_BUDGET),
            "--out",
            str(d / "out"),
            str(CASES / "plain.py"),
            str(d / "truth.json"),
            "{batch}",
            "no-leak",
        ],
        cwd=d,
        env=fresh_python.env(OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (planned,) = re.findall(r"memalloc: largest batch that fits .*?: (\d+);", p.stderr)
    return d, p, int(planned), json.loads((d / "truth.json").read_text())


def test_fit_runs_the_script_at_the_planned_batch_within_the_budget(fit_run):
    d, p, planned, t = fit_run
    assert t["batch"] == planned > 8 and t["optimizer_steps"] == 6, (planned, t)
    got = totals(p.stderr)
    assert got["ooms"] == 0 and got["step"] == 6
    assert f"peak reserved {got['peak_reserved']}" in p.stderr
    m = re.search(r"peak reserved ([\d.]+) MiB", p.stderr)
    assert float(m.group(1)) * (1 << 20) <= FIT_BUDGET, p.stderr[-2000:]


def test_fit_plans_within_five_percent_of_the_largest_batch_that_runs(fit_run, fresh_python):
    d, _, planned, _ = fit_run
    larger = planned * 105 // 100 + 1  # on a device of the budget's size, this batch runs out of memory
    p = fresh_python.run(
        [
            "-m",
            "memalloc",
            "run",
            "--backend",
            "host",
            "--config",
            f"host_capacity_mb:{FIT_BUDGET >> 20}",
            "--no-flight-recorder",
            "--out",
            str(d / "larger"),
            str(CASES / "plain.py"),
            str(d / "larger.json"),
            str(larger),
            "no-leak",
        ],
        cwd=d,
        env=fresh_python.env(OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert p.returncode != 0 and "OutOfMemoryError" in p.stderr, (larger, p.returncode, p.stderr[-2000:])


# ---- torchrun, 2 ranks, killed mid-run: report still reads every rank -------------------------
KILLED_JOB = """\
import os, signal
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(12):
    loss = model(torch.randn(16, 64)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    kept.append(torch.ones(4096 * (rank + 1)))  # KEEP-LINE: 16 KiB per step on rank 0, 32 KiB on rank 1
    if rank == 1 and step == KILLED_AFTER - 1:
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
"""
KILLED_AFTER = 7  # rank 1 SIGKILLs itself after its 7th step


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory):
    d = tmp_path_factory.mktemp("killed_job")
    script = d / "train.py"
    script.write_text(KILLED_JOB.replace("KILLED_AFTER", str(KILLED_AFTER)))
    out = d / "out"
    p = memalloc_run("--backend", "host", "--out", str(out), str(script), ranks=2, timeout=240, cwd=d)
    assert p.returncode != 0, p.stderr[-3000:]  # the job failed: a rank was killed
    return d, script, out, p


def test_a_killed_job_leaves_a_flight_file_per_rank(killed_job):
    d, script, out, p = killed_job
    files = {f.rank: f for f in (ff.read(path) for path in ff.files_in(out / "flight"))}
    assert sorted(files) == [0, 1], files
    assert all(f.world_size == 2 and f.state != "exited" for f in files.values())
    assert files[1].state == "running" and files[1].step == KILLED_AFTER, (files[1].state, files[1].step)
    assert files[0].step >= KILLED_AFTER, files[0].step  # rank 0 waits in the next step's collective


def test_report_reads_every_rank_of_a_killed_job(killed_job, memalloc_cli_here):
    d, script, out, p = killed_job
    keep = next(i for i, l in enumerate(KILLED_JOB.splitlines(), 1) if "# KEEP-LINE" in l)
    for target in (out, out / "flight"):
        r = memalloc_cli_here("report", str(target))
        assert r.returncode == 0, r.stderr
        assert "2 rank(s)" in r.stdout and "rank 0 (pid" in r.stdout and "rank 1 (pid" in r.stdout, r.stdout
        assert f"rank 1 leaks: {script}:{keep} in <module> grows by 32.00 KiB per step" in r.stdout, r.stdout
        # rank 1 stands out by its line: at their ends (rank 0 raised in the collective rank 1 never
        # joined) each rank kept KILLED_AFTER tensors there, rank 1's twice as large
        ours, theirs = KILLED_AFTER * 32 * 1024, KILLED_AFTER * 16 * 1024
        stands = r.stdout.split("rank 1 stands out")[1].splitlines()
        assert stands[1].strip() == (
            f"+{fmt_bytes(ours - theirs)}  {script}:{keep} in <module>  ({fmt_bytes(ours)} against {fmt_bytes(theirs)})"
        ), r.stdout
    page = d / "job.html"
    r = memalloc_cli_here("report", str(out), "--html", str(page))
    assert r.returncode == 0 and 'polyline class="series rank-1"' in page.read_text()
