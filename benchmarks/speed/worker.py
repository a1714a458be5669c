"""One allocator, one benchmark group, one fresh process:
``python -m benchmarks worker ALLOCATOR GROUP`` prints one JSON object.

The allocator is chosen once per process (torch cannot swap an initialised
allocator), so the orchestrator (suite.py) starts one worker per
(allocator, group, repeat). Groups: ``micro`` (the lognormal random workload,
then the torch.empty+del cost per size), ``transformer`` (fp32 and bf16
training steps), ``resnet50`` (training steps), ``recording`` (native and
memalloc only: the cost of recording, measured inside one process by
switching recording off and on between rounds; see run_recording),
``call_sites`` (memalloc only: the cost of its default call-site capture,
switched off and on the same way; see run_call_sites), ``flight``
(memalloc only: the flight recorder's file against the in-memory ring and no
recording, modes alternating every few steps in one process; see run_flight), ``bf16`` (the bf16 transformer
step alone, 20 steps: the cross-process comparison with native, e.g. of
``memalloc_flight``, tests/gpu/test_cuda_flight.py).

Memory figures: peaks come from memalloc's own accounting under memalloc,
from torch.cuda.max_memory_* for native, expandable and cudaMallocAsync, and
are absent for RMM (its pool keeps no such counters without a slower
statistics adaptor); "device_used" is total - free from cudaMemGetInfo for all,
and "context_used" is the same before the first allocation, so the
difference is what the allocator took.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import resource
import sys
import time

ALLOCATORS = (
    "native",
    "expandable",
    "cudaMallocAsync",
    "rmm",
    "memalloc",
    # recording on: torch's own history (Python stacks) and memalloc's modes
    "native_history",
    "memalloc_tags",
    "memalloc_stacks",
    # memalloc's default is expandable segments; memalloc_plain is native's
    # policy (MEMALLOC_CONF=expandable_segments:False); memalloc_expandable says
    # the default explicitly, _noreuse without giving free pages back before
    # growing (reuse_free_pages:False)
    "memalloc_expandable",
    "memalloc_expandable_noreuse",
    "memalloc_plain",
    # expandable segments whose pages are not created exportable (no CUDA IPC of
    # them: torch's TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0), to weigh that choice
    "memalloc_expandable_noipc",
    # what `python -m memalloc run` turns on: the flight recorder's file and a
    # step boundary (a heartbeat and checkpoint) at every optimizer.step()
    "memalloc_flight",
    # native under a second name: two native processes in lockstep measure
    # the benchmark's own noise (an A/A control, benchmarks/speed/lockstep.py)
    "native_control",
    # memalloc's default without call sites (no Python stack per
    # allocation: MEMALLOC_CONF=call_sites:False), to weigh their cost in a step
    "memalloc_nosites",
)
DEFAULT_ALLOCATORS = ALLOCATORS[:5]
GROUPS = (
    "micro",
    "transformer",
    "resnet50",
    "recording",
    "call_sites",
    "flight",
    "flight_pair",
    "bf16",
    # lockstep workers (benchmarks/speed/lockstep.py): one step per "step" line of the bf16
    # transformer, ResNet-50 and a transformers GPT-2
    "bf16_lockstep",
    "resnet50_lockstep",
    "gpt2_lockstep",
)
LOCKSTEP_STEPS = {
    "bf16_lockstep": lambda: transformer_steps()["bf16"],
    "resnet50_lockstep": lambda: resnet50_step(),
    "gpt2_lockstep": lambda: gpt2_step(),
}
# The recording group's modes per allocator ("python" = Python call stacks:
# torch's _record_memory_history(stacks="python") for native).
RECORDING_MODES = {"native": ("off", "python"), "memalloc": ("off", "tags", "python")}
PAIR_SIZES = (512, 64 << 10, 1 << 20, 16 << 20, 256 << 20)
GiB = 1 << 30


# The environment each allocator mode sets before CUDA starts (the modes not
# named here set none); benchmarks/fit/largest_batch.py and replay_gpu.py use it too.
ENV = {
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "memalloc_plain": {"MEMALLOC_CONF": "expandable_segments:False"},
    "memalloc_expandable": {"MEMALLOC_CONF": "expandable_segments:True"},
    "memalloc_expandable_noipc": {
        "MEMALLOC_CONF": "expandable_segments:True",
        "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC": "0",
    },
    "memalloc_expandable_noreuse": {"MEMALLOC_CONF": "expandable_segments:True,reuse_free_pages:False"},
    "memalloc_nosites": {"MEMALLOC_CONF": "call_sites:False"},
}


def setup(name: str):
    """Installs allocator `name` before CUDA is initialised; returns a
    function giving (peak_allocated, peak_reserved) or None."""
    os.environ.update(ENV.get(name, {}))
    import torch

    if name == "rmm":
        import rmm
        from rmm.allocators.torch import rmm_torch_allocator

        rmm.reinitialize(pool_allocator=True, initial_pool_size=GiB)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return lambda: None
    if name == "native_history":
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    if name.startswith("memalloc"):
        import memalloc

        memalloc.enable(backend="cuda")
        if name == "memalloc_flight":
            import tempfile

            from memalloc.features import flight

            flight.start(tempfile.mkdtemp(prefix="memalloc-flight-bench-"))
            memalloc.auto_step()
        stacks = {"memalloc_tags": "tags", "memalloc_stacks": "python"}.get(name)
        if stacks:
            memalloc.record_history(max_entries=1 << 20, stacks=stacks)

        def peaks():
            s = memalloc.memory.memory_stats_raw(0)
            return s["allocated_bytes"]["all"]["peak"], s["reserved_bytes"]["all"]["peak"]

        return peaks
    return lambda: (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())


def reset_peaks(name: str) -> None:
    import torch

    if name.startswith("memalloc"):
        import memalloc

        memalloc.installed_allocator().reset_peak_stats(0)
    elif name != "rmm":
        torch.cuda.reset_peak_memory_stats()


def device_used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


def run_pair(name: str) -> dict:
    """µs per `t = torch.empty(n, uint8, cuda); del t`, median of 5 x 10,000."""
    out = {}
    for n in PAIR_SIZES:
        pair_us(n, 100)
        out[f"pair_us_{n}"] = sorted(pair_us(n, 10_000) for _ in range(5))[2]
    return out


def random_plan(n_allocs: int = 50_000, live: int = 64, seed: int = 7):
    """Sizes e^N(11,3) bytes capped at 512 MiB, and which live slot to free
    after each allocation (fixed seed: identical for every allocator)."""
    rng = random.Random(seed)
    cap = 512 << 20
    sizes = [max(1, min(cap, int(math.exp(rng.gauss(11, 3))))) for _ in range(n_allocs)]
    victims = [rng.randrange(live) for _ in range(n_allocs)]
    return sizes, victims, live


def run_random(name: str, peaks) -> dict:
    import torch

    sizes, victims, live = random_plan()
    slots = [None] * live
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for size, victim in zip(sizes, victims):
        slots[victim] = None  # free a random live tensor (or nothing yet)
        slots[victim] = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    out = {"random_ns_per_op": elapsed / len(sizes) * 1e9, "random_device_used": device_used()}
    p = peaks()
    if p is not None:
        out["random_peak_allocated"], out["random_peak_reserved"] = p
        out["random_reserved_over_allocated"] = p[1] / p[0]
    del slots
    return out


def timed_steps(step, warmup: int, steps: int) -> float:
    """Median ms per step, each step timed between two synchronisations."""
    import torch

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def transformer_steps():
    """{"fp32": step, "bf16": step} of one 12-layer, 768-wide pre-norm
    encoder, batch 16x512, AdamW (bf16 = autocast, the allocator-bound one)."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.1, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 512, 768, device="cuda")

    def make(dtype):
        def step():
            ctx = torch.autocast("cuda", dtype=dtype) if dtype is not None else contextlib.nullcontext()
            with ctx:
                loss = model(x).float().square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    return {"fp32": make(None), "bf16": make(torch.bfloat16)}


def run_transformer(name: str, peaks, labels=("fp32", "bf16"), steps: int = 10) -> dict:
    """The transformer steps (transformer_steps): median ms of ``steps``
    steps after 3 warm-up steps, for each of ``labels``."""
    out = {}
    for label, step in transformer_steps().items():
        if label not in labels:
            continue
        reset_peaks(name)
        out[f"transformer_{label}_ms"] = timed_steps(step, warmup=3, steps=steps)
        out[f"transformer_{label}_device_used"] = device_used()
        p = peaks()
        if p is not None:
            out[f"transformer_{label}_peak_allocated"], out[f"transformer_{label}_peak_reserved"] = p
    return out


def pair_us(n: int, pairs: int) -> float:
    """µs per torch.empty(n, uint8, cuda) + del, over `pairs` pairs."""
    import torch

    t0 = time.perf_counter()
    for _ in range(pairs):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t
    return (time.perf_counter() - t0) / pairs * 1e6


def set_recording(name: str, mode: str) -> None:
    """Recording off, or on with `mode` stacks, in a running process."""
    import torch

    if name == "native":
        if mode == "off":
            torch.cuda.memory._record_memory_history(enabled=None)
        else:
            torch.cuda.memory._record_memory_history(max_entries=100_000, stacks=mode)
    else:
        import memalloc

        if mode == "off":
            memalloc.record_history(enabled=False)
        else:
            memalloc.record_history(max_entries=1 << 20, stacks=mode)


def set_call_sites(mode: str) -> None:
    """memalloc's call sites (the process-wide stack mode) "off" or "on"
    (Python stacks, the default from enable() on), no recording ring."""
    from memalloc import _C

    _C.set_stack_mode(0 if mode == "off" else 2)


def run_flight(rounds: int = 121, bf16_steps: bool = True) -> dict:
    """What the flight recorder costs under memalloc, in one process, modes
    switched every few steps: "off" (no recording, the baseline), "memory"
    (the in-memory ring, 65,536 records per device) and "file" (the flight
    recorder as ``python -m memalloc run`` turns it on: the same ring in its
    MAP_SHARED file, memalloc/features/flight.py, and a step boundary, so a
    heartbeat and checkpoint, at every optimizer.step()). One recorder is
    started once and attached and detached (FlightRecorder.attach/detach),
    so switching costs microseconds and the modes can alternate finely:
    the machine's speed drifts by +-30% over seconds (seen on the H200), so
    rounds of seconds each, as run_modes takes, cannot resolve 5%.

    Each of ``rounds`` rounds runs every mode (order rotated): 3 bf16
    transformer steps after one warm-up step (their median, ms), and the
    512 B torch.empty+del pair, 3 x 2,000 pairs after 200 warm-up ones, both
    in wall time and in the thread's CPU time (time.thread_time: what the
    allocator's own code costs, page faults included, without the time the
    machine gave to others). Ratios per round against the same round's "off";
    figures are medians over rounds (keys fr_*: fr_bf16_ms_x_file,
    fr_pair_us_512_x_file, fr_pair_cpu_us_512_x_file, ...), with
    fr_pair_minflt_per_1000_* the page faults per 1,000 pairs.
    ``bf16_steps=False`` (the flight_pair group: 363 rounds of pairs only,
    about 40 s a process) leaves the transformer out, for A/B runs of the
    pair's cost in many processes (benchmarks/device/ab.sh)."""
    import tempfile

    import memalloc
    from memalloc.features import flight

    bf16 = transformer_steps()["bf16"] if bf16_steps else None
    rec = flight.start(tempfile.mkdtemp(prefix="memalloc-flight-bench-"))
    rec.detach()

    def set_mode(mode: str) -> None:
        rec.detach()
        memalloc.record_history(enabled=False)
        memalloc.auto_step(mode == "file")
        if mode == "memory":
            memalloc.record_history(max_entries=flight.DEFAULT_RECORDS, stacks="python")
        elif mode == "file":
            rec.attach()

    modes = ("off", "memory", "file")
    metrics = ("bf16_ms",) * bf16_steps + ("pair_us_512", "pair_cpu_us_512", "pair_minflt_per_1000")
    times = {m: {mode: [] for mode in modes} for m in metrics}
    for mode in rotated(modes, rounds):
        set_mode(mode)
        if bf16_steps:
            times["bf16_ms"][mode].append(timed_steps(bf16, warmup=1, steps=3))
        pair_us(512, 200)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall, cpu = [], []
        for _ in range(3):
            c0 = time.thread_time()
            wall.append(pair_us(512, 2_000))
            cpu.append((time.thread_time() - c0) / 2_000 * 1e6)
        times["pair_us_512"][mode].append(sorted(wall)[1])
        times["pair_cpu_us_512"][mode].append(sorted(cpu)[1])
        times["pair_minflt_per_1000"][mode].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 6)
    set_mode("off")
    flight.stop()
    return summarize_rounds(times, "fr", rounds, {"fr_rounds": rounds}, ratio_free=("pair_minflt_per_1000",))


def run_recording(name: str, rounds: int = 11) -> dict:
    """What recording costs, measured in one process (run_modes with
    RECORDING_MODES[name]; keys rec_*)."""
    return run_modes(lambda mode: set_recording(name, mode), RECORDING_MODES[name], "rec", rounds)


def run_call_sites(rounds: int = 11) -> dict:
    """What call sites cost under memalloc, measured in one process: stack
    capture off against on (run_modes; keys cs_*, e.g. cs_bf16_ms_x_on)."""
    return run_modes(set_call_sites, ("off", "on"), "cs", rounds)


DEEP = 24  # extra Python frames above the deep pair measurement (a training script's depth)


def nested(depth: int, fn):
    """fn() called `depth` Python frames further down."""
    return fn() if depth == 0 else nested(depth - 1, fn)


def run_modes(set_mode, modes, prefix: str, rounds: int) -> dict:
    """`rounds` rounds, each running every mode (order rotated per round;
    modes[0] is the baseline, "off") for a bf16 transformer measurement
    (median of 8 steps after 2 warm-up steps) and a 512 B torch.empty+del
    measurement (median of 3 x 5,000 pairs), also DEEP frames further down
    (pair_us_512_deep: stack capture walks every frame). Per round, each mode's time is
    divided by the same round's baseline time; the figures are medians over
    rounds of those ratios (<prefix>_*_x_<mode>) and of the times
    (<prefix>_*_<mode>). Cross-process noise (the machine's
    process-to-process spread) cancels out of the ratios."""
    bf16 = transformer_steps()["bf16"]
    times: dict[str, dict[str, list[float]]] = {
        "bf16_ms": {m: [] for m in modes},
        "pair_us_512": {m: [] for m in modes},
        "pair_us_512_deep": {m: [] for m in modes},
    }
    for mode in rotated(modes, rounds):
        set_mode(mode)
        times["bf16_ms"][mode].append(timed_steps(bf16, warmup=2, steps=8))
        pair_us(512, 500)
        times["pair_us_512"][mode].append(sorted(pair_us(512, 5_000) for _ in range(3))[1])
        times["pair_us_512_deep"][mode].append(nested(DEEP, lambda: sorted(pair_us(512, 5_000) for _ in range(3))[1]))
    set_mode(modes[0])
    return summarize_rounds(times, prefix, rounds, {f"{'recording' if prefix == 'rec' else prefix}_rounds": rounds})


def rotated(modes, rounds: int):
    """Every mode once per round, ``rounds`` rounds, the order rotated each
    round (so that no mode always runs first or after the same one)."""
    for r in range(rounds):
        k = r % len(modes)
        yield from modes[k:] + modes[:k]


def summarize_rounds(times: dict, prefix: str, rounds: int, out: dict, ratio_free=()) -> dict:
    """``times[metric][mode]``: one figure per round, the first mode the
    baseline. Adds the medians over rounds of the figures
    (<prefix>_<metric>_<mode>) and of each round's ratio to the same round's
    baseline (<prefix>_<metric>_x_<mode>, all of them in ..._all) to ``out``;
    metrics in ``ratio_free`` get no ratios."""
    med = lambda v: sorted(v)[len(v) // 2]
    for metric, per_mode in times.items():
        base = next(iter(per_mode.values()))
        for i, (mode, v) in enumerate(per_mode.items()):
            out[f"{prefix}_{metric}_{mode}"] = med(v)
            if i and metric not in ratio_free:
                ratios = [x / y for x, y in zip(v, base)]
                out[f"{prefix}_{metric}_x_{mode}"] = med(ratios)
                out[f"{prefix}_{metric}_x_{mode}_all"] = [round(x, 4) for x in ratios]
    return out


def resnet50_step():
    """One step of torchvision ResNet-50, batch 64 at 224x224, SGD with momentum, fp32."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def gpt2_step(device: str = "cuda", n_layer: int = 12, batch: int = 8, bf16: bool = True):
    """One step of a transformers GPT-2 built from its default config (12
    layers, 768 wide, 124M parameters; ``n_layer`` fewer to run on the CPU),
    ``batch`` x 512 tokens, bf16 autocast (fp32 with ``bf16=False``: a CPU
    without bf16 instructions takes minutes per bf16 step), AdamW, on
    ``device`` (also benchmarks/traces/record.py's gpt2 workloads and
    tests/integration/test_expandable_loops.py)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=512, n_layer=n_layer)).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (batch, 512), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def run_resnet50(name: str, peaks) -> dict:
    """torchvision ResNet-50, batch 64 at 224x224, SGD with momentum, fp32."""
    step = resnet50_step()
    reset_peaks(name)
    out = {"resnet50_ms": timed_steps(step, warmup=3, steps=10), "resnet50_device_used": device_used()}
    p = peaks()
    if p is not None:
        out["resnet50_peak_allocated"], out["resnet50_peak_reserved"] = p
    return out


def pin_to(cpus: str) -> None:
    """Every thread of this process on cores ``cpus`` ("2-5", "3"): Linux
    sets affinity per thread, and threads made later inherit it."""
    lo, _, hi = cpus.partition("-")
    cores = range(int(lo), int(hi or lo) + 1)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
            os.sched_setaffinity(int(tid), cores)


def main(argv) -> int:
    usage = f"usage: python -m benchmarks worker {{{','.join(ALLOCATORS)}}} {{{','.join(GROUPS)}}}"
    if len(argv) != 2:  # --help too
        print(usage + "\n" + __doc__.split("\n\n")[0].replace("``", ""))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    name, group = argv
    # e.g. "2-5": every process of a comparison on the same cores; a lockstep
    # worker takes them once warmed up (many start at once in a crowd, on all
    # cores), the others from the start
    cpus = os.environ.get("MEMALLOC_BENCH_CPUS")
    if cpus and group not in LOCKSTEP_STEPS:
        pin_to(cpus)
    if name not in ALLOCATORS or group not in GROUPS:
        raise SystemExit(usage)
    peaks = setup(name)
    import torch

    torch.cuda.init()
    result = {"context_used": device_used()}
    if group == "micro":
        result.update(run_random(name, peaks))  # first: its memory figures start clean
        result.update(run_pair(name))
    elif group == "transformer":
        result.update(run_transformer(name, peaks))
    elif group == "bf16":
        result.update(run_transformer(name, peaks, labels=("bf16",), steps=20))
    elif group == "recording":
        if name not in RECORDING_MODES:
            raise SystemExit(f"the recording group runs under {' and '.join(RECORDING_MODES)} only")
        result.update(run_recording(name))
    elif group == "call_sites":
        if name != "memalloc":
            raise SystemExit("the call_sites group runs under memalloc only")
        result.update(run_call_sites())
    elif group == "flight":
        if name != "memalloc":
            raise SystemExit("the flight group runs under memalloc only")
        result.update(run_flight())
    elif group in LOCKSTEP_STEPS:
        from benchmarks.speed.lockstep import serve

        # what the timed steps asked of the device (torch's counters, which
        # memalloc answers too): cudaMalloc/cudaFree calls or page mappings,
        # full synchronisations, retries; and per timed step (read after its
        # time is out) the device calls so far, to find the steps that made them
        counters = ("num_device_alloc", "num_device_free", "num_sync_all_streams", "num_alloc_retries")
        counts = lambda: {k: torch.cuda.memory_stats().get(k, 0) for k in counters}  # noqa: E731
        before, per_step = {}, []

        def ready() -> None:  # warmed up: take the comparison's cores, start counting
            if cpus:
                pin_to(cpus)
            before.update(counts())

        def after() -> None:  # one read of torch's stats per step
            now = counts()
            per_step.append([now[k] - before[k] for k in counters[:2]])

        result["steps"] = serve(
            LOCKSTEP_STEPS[group](), warmup=3, sync=torch.cuda.synchronize, ready=ready, after=after
        )
        result["timed_steps_counts"] = {k: v - before[k] for k, v in counts().items()}
        result["device_alloc_free_after_each_step"] = per_step
    elif group == "flight_pair":
        if name != "memalloc":
            raise SystemExit("the flight_pair group runs under memalloc only")
        result.update(run_flight(rounds=363, bf16_steps=False))
    else:
        result.update(run_resnet50(name, peaks))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.exit(main(sys.argv[1:]))
