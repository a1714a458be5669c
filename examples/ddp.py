"""DistributedDataParallel over ``--ranks`` processes (default 2): each rank
trains 1/ranks of the baseline's batch (the same global batch) and DDP
all-reduces the gradients in buckets. Per-GPU memory: the activations of the
rank's share, plus DDP's gradient buckets. NCCL with one GPU per rank when
there are enough GPUs; otherwise gloo, every rank on the same device (the
memory per rank is measured the same way; the step time is not that of
separate GPUs).

    python examples/ddp.py --model transformer --ranks 2
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import build, enable, parse_args, run


def worker(rank: int, args, port: int) -> None:
    backend = enable()  # in each rank's own process, before CUDA is used
    gpus = torch.cuda.device_count() if backend == "cuda" else 0
    nccl = gpus >= args.ranks
    device = torch.device("cuda", rank if nccl else 0) if backend == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if nccl else "gloo", rank=rank, world_size=args.ranks)
    w = build(args.model, batch_scale=1.0 / args.ranks, device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(w.model, device_ids=[device.index] if nccl else None)

    def step() -> None:
        w.optimizer.zero_grad(set_to_none=True)
        w.loss_fn(ddp(w.inputs), w.targets).backward()
        w.optimizer.step()

    # Every rank measures; rank 0 reports (the ranks are alike).
    result = run(
        "ddp",
        w,
        step,
        args,
        samples_per_step=w.batch * args.ranks,
        ranks=args.ranks,
        process_group="nccl" if nccl else "gloo",
        quiet=rank != 0,
    )
    dist.barrier()
    dist.destroy_process_group()
    return result


def free_port() -> int:
    """A TCP port no process listens on now (the OS picks it), so that two
    runs at once (parallel tests) do not meet on one rendezvous port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    args = parse_args(
        __doc__,
        lambda p: (
            p.add_argument("--ranks", type=int, default=2),
            p.add_argument("--port", type=int, default=0, help="rendezvous port; 0 = a free one"),
        ),
    )
    mp.spawn(worker, args=(args, args.port or free_port()), nprocs=args.ranks, join=True)
