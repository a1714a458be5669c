"""Records the allocator events of real training loops to trace files for
replay on the host backend (memalloc/features/replay.py, benchmarks/traces/).

    python -m benchmarks record-traces --out DIR [--backend cuda|host] [--workloads a,b]

Each workload runs in a fresh process (memalloc is enabled once per
process) under memalloc with the event ring on from the first allocation
and no stacks (``call_sites:False,record_history:N,record_stacks:none``:
the file then holds records only), and writes ``DIR/<workload>.mtrace.gz``.
The parent prints, per workload, the events, dropped records (must be 0),
the file size and the replay under the default config next to the run's
own peaks (equal when the replay reproduces the run).

Workloads on CUDA: ``transformer`` (12 layers, 768 wide, bf16 autocast,
batch 16x512, AdamW; benchmarks/speed/worker.py), ``resnet50`` (torchvision,
batch 64 at 224x224, SGD with momentum), ``varlen`` (6 layers, 512 wide,
bf16, batch 16, sequence lengths drawn long-tailed between 64 and 2048 per
step, seed 0), ``gpt2`` (a transformers GPT-2 from its default config, batch
8x512, bf16 autocast, AdamW, 10 steps; speed/worker.gpt2_step). On the host
backend (CPU tensors from memalloc): ``tiny``, a small MLP with varying
batch sizes, to test the plumbing without a GPU, and ``gpt2_cpu``: the same
GPT-2 with 2 layers on the CPU (bf16 autocast), 12 steps, the loop whose
every step moved pages under expandable segments' 5% ceiling (issue 25).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RING = 4_000_000  # records per device (64 B each): every event of the run
WORKLOADS = {"cuda": ("transformer", "resnet50", "varlen", "gpt2"), "host": ("tiny", "gpt2_cpu")}
# the host backend's simulated device for each host workload (MiB; default: the config's)
HOST_CAPACITY_MB = {"gpt2_cpu": 16384, "gpt2": 32768}


def _varlen_lengths(steps: int, seed: int = 0) -> list[int]:
    """Long-tailed sequence lengths in [64, 2048]: most short, a few long."""
    rng = random.Random(seed)
    return [max(64, min(2048, int(64 * 2 ** rng.expovariate(0.9)))) // 8 * 8 for _ in range(steps)]


def _steps(name: str, device: str):
    """(step(i), number of steps) of one workload."""
    import torch

    torch.manual_seed(0)
    if name == "transformer":
        sys.path.insert(0, REPO)
        from benchmarks.speed.worker import transformer_steps

        step = transformer_steps()["bf16"]
        return (lambda i: step()), 8
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (64,), device=device)

        def resnet_step(i):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return resnet_step, 6
    if name == "varlen":
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
        model = torch.nn.TransformerEncoder(layer, 6).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        lengths = _varlen_lengths(30)

        def varlen_step(i):
            x = torch.randn(16, lengths[i], 512, device=device)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return varlen_step, len(lengths)
    if name in ("gpt2", "gpt2_cpu"):
        sys.path.insert(0, REPO)
        from benchmarks.speed.worker import gpt2_step

        step = gpt2_step(device, n_layer=2 if name == "gpt2_cpu" else 12)
        return (lambda i: step()), 12 if name == "gpt2_cpu" else 10
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        batches = [16, 64, 32, 128, 16, 96]

        def tiny_step(i):
            x = torch.randn(batches[i % len(batches)], 64)
            loss = model(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return tiny_step, len(batches)
    raise SystemExit(f"unknown workload {name!r}")


def record_one(name: str, backend: str, out_dir: str, steps: int | None = None, conf: str = "") -> dict:
    """Runs one workload in this process (``steps`` of them instead of its
    own number; under ``conf``, more allocator config) and writes its trace."""
    capacity = f",host_capacity_mb:{HOST_CAPACITY_MB[name]}" if backend == "host" and name in HOST_CAPACITY_MB else ""
    extra = f",{conf}" if conf else ""
    os.environ["MEMALLOC_CONF"] = f"call_sites:False,record_history:{RING},record_stacks:none{capacity}{extra}"
    import memalloc

    memalloc.enable(backend=backend)
    if backend == "host":
        memalloc.host.use_for_cpu_tensors()
    step, n = _steps(name, "cuda" if backend == "cuda" else "cpu")
    n = steps or n
    t0 = time.perf_counter()
    for i in range(n):
        step(i)
        memalloc.step()
    if backend == "cuda":
        import torch

        torch.cuda.synchronize()
    path = memalloc.save_trace(os.path.join(out_dir, f"{name}.mtrace.gz"))
    stats = memalloc.memory.memory_stats()
    return {
        "workload": name,
        "steps": n,
        "seconds": time.perf_counter() - t0,
        "path": path,
        "events": len(memalloc.events()),
        "dropped": memalloc.recording.dropped(),
        "bytes": os.path.getsize(path),
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_reserved": stats["reserved_bytes.all.peak"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the .mtrace.gz files")
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--workloads", default=None, help="comma-separated (default: all of the backend's)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps of each workload (default: its own; varlen takes at most its 30 lengths)",
    )
    p.add_argument(
        "--conf",
        default="",
        help="more allocator config for the recording run, e.g. "
        "expandable_segments:True (the request stream as that mode saw it)",
    )
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one workload
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.one:
        print("RESULT " + json.dumps(record_one(args.one, args.backend, args.out, args.steps, args.conf)))
        return 0
    from memalloc import replay

    names = args.workloads.split(",") if args.workloads else list(WORKLOADS[args.backend])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    results = []
    for name in names:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.traces.record",
                "--out",
                args.out,
                "--backend",
                args.backend,
                "--one",
                name,
                "--conf",
                args.conf,
                *(["--steps", str(args.steps)] if args.steps else []),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            print(f"{name}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        r = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
        d = replay.replay_trace(r["path"]).devices[0]
        r.update(replay_peak_allocated=d.peak_allocated, replay_peak_reserved=d.peak_reserved, replay_ratio=d.ratio)
        results.append(r)
        print(
            f"{name:<12} {r['steps']:>3} steps {r['events']:>9} events {r['dropped']} dropped "
            f"{r['bytes'] / 1e6:8.2f} MB  run peaks {r['peak_allocated']} / {r['peak_reserved']} B, "
            f"replay {d.peak_allocated} / {d.peak_reserved} B ({d.ratio:.4f})",
            flush=True,
        )
    with open(os.path.join(args.out, "recorded.json"), "w") as f:
        json.dump(
            {"command": "python -m benchmarks record-traces " + " ".join(argv or sys.argv[1:]), "results": results},
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
