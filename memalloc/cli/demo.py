"""``python -m memalloc demo``: a short training loop under memalloc that
prints what the allocator did.

On a machine with a usable GPU it trains a small MLP on CUDA through torch's
autograd and AdamW. Without one it runs on the host backend (a simulated
device): activations and gradients of a two-layer MLP, with backpropagation
written out, are memalloc tensors from :func:`memalloc.host.empty`. Both end
by provoking an out-of-memory error, catching it as torch.OutOfMemoryError,
training on, and emptying the cache. Then a leak hunt
(memalloc/demo/leaky_training.py): a training loop that keeps every loss
tensor (``losses.append(loss)``) runs under ``memalloc.leak_check()``, whose
report names that line and the bytes it leaks per step; the fixed loop
(``loss.item()``) reports nothing. On the host backend torch's own CPU
tensors come from the simulated device for that part
(memalloc.host.use_for_cpu_tensors). Last, a small encoder trains three
AdamW steps and memalloc.memory_breakdown() shows where its memory goes
(parameters, gradients, optimizer state, activations, temporaries, other).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from memalloc.core import _state, iteration
from memalloc.core._format import fmt_bytes
from memalloc.demo import leaky_training
from memalloc.features.breakdown import memory_breakdown
from memalloc.install import host

from ._common import enable_or_exit

HOST_CAPACITY_MB = 256


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small model under memalloc and show what it did")
    p.add_argument(
        "--backend",
        default="auto",
        choices=_state.BACKENDS,
        help="cuda: the GPU; host: a simulated device on the CPU; auto (default): cuda when a GPU is there",
    )
    p.add_argument("--steps", type=int, default=8, help="training steps to run (default 8)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    backend = enable_or_exit(args.backend, f"host_capacity_mb:{HOST_CAPACITY_MB}")
    a = _state.installed_allocator()
    where = "CUDA GPU" if backend == "cuda" else f"host backend (simulated {HOST_CAPACITY_MB} MiB device)"
    print(f"memalloc demo on the {where}")
    step = _cuda_trainer() if backend == "cuda" else _host_trainer()
    print(
        f"{'step':>4} {'loss':>10} {'allocated':>12} {'reserved':>12} {'peak alloc':>12} "
        f"{'allocs':>7} {'from device':>11}"
    )
    for i in range(1, args.steps + 1):
        loss = step()
        _row(a, i, loss)
    s = a.stats(0)
    hits = s["allocation"]["all"]["allocated"] - s["num_device_alloc"]
    print(
        f"{hits} of {s['allocation']['all']['allocated']} allocations were served from the cache; "
        f"{s['num_device_alloc']} segments came from the device."
    )
    _oom_then_recover(a, backend, step)
    released = sum(a.empty_cache(d) for d in range(a.device_count))
    print(
        f"empty_cache(): returned {fmt_bytes(released)} to the device; "
        f"reserved now {fmt_bytes(a.stats(0)['reserved_bytes']['all']['current'])}"
    )
    a.validate(0)
    print("allocator invariants hold (validate() passed)")
    del step  # the first model and its optimizer go: the breakdown below is the encoder's
    _leak_hunt(backend)
    _where_it_goes(backend)
    return 0


def _where_it_goes(backend: str) -> None:
    """A small encoder trained 3 steps with AdamW (after _leak_hunt, CPU
    tensors are memalloc's on the host backend), then memory_breakdown()."""
    device = "cuda" if backend == "cuda" else "cpu"
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 64, 128, device=device)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        iteration.step()  # the leak hunt called memalloc.step(): the code marks the boundaries now
    print()
    print("where the memory goes (memalloc.memory_breakdown()): a 4-layer encoder, 3 AdamW steps")
    print(memory_breakdown().to_text())


def _leak_hunt(backend: str) -> None:
    if backend == "host":
        host.use_for_cpu_tensors()
    device = "cuda" if backend == "cuda" else "cpu"
    for keep_item in (False, True):
        print()
        print(
            "leak hunt (memalloc/demo/leaky_training.py): a loop that keeps "
            + ("loss.item()" if keep_item else "every loss tensor")
        )
        print(leaky_training.train(device, keep_item=keep_item).to_text())


def _row(a, i: int, loss: float) -> None:
    s = a.stats(0)
    print(
        f"{i:>4} {loss:>10.4f} {fmt_bytes(s['allocated_bytes']['all']['current']):>12} "
        f"{fmt_bytes(s['reserved_bytes']['all']['current']):>12} "
        f"{fmt_bytes(s['allocated_bytes']['all']['peak']):>12} "
        f"{s['allocation']['all']['allocated']:>7} {s['num_device_alloc']:>11}"
    )


def _oom_then_recover(a, backend: str, step: Callable[[], float]) -> None:
    before = a.stats(0)["reserved_bytes"]["all"]["current"]
    try:
        if backend == "cuda":
            torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
        else:
            host.empty(1 << 30, dtype=torch.uint8)
        print("unexpected: the oversized allocation succeeded")
    except torch.OutOfMemoryError as e:
        print(f"caught torch.OutOfMemoryError: {str(e).split('. Of the')[0]}.")
    after_oom = a.stats(0)["reserved_bytes"]["all"]["current"]
    loss = step()
    s = a.stats(0)
    print(
        f"before raising, memalloc released its unused cache and retried: reserved "
        f"{fmt_bytes(before)} -> {fmt_bytes(after_oom)} (num_alloc_retries="
        f"{s['num_alloc_retries']}, num_ooms={s['num_ooms']})"
    )
    print(
        f"training continued after the OOM: loss {loss:.4f}, reserved "
        f"{fmt_bytes(s['reserved_bytes']['all']['current'])}"
    )


def _host_trainer(batch: int = 256, dim: int = 512, hidden: int = 1024, lr: float = 0.002):
    """One step of a 2-layer MLP regression; every buffer is a memalloc tensor."""
    g = torch.Generator().manual_seed(0)
    x = host.empty((batch, dim)).copy_(torch.randn(batch, dim, generator=g))
    y = host.empty((batch, 1)).copy_(x[:, :8].sum(dim=1, keepdim=True).tanh())
    w1 = host.empty((dim, hidden)).copy_(torch.randn(dim, hidden, generator=g) / dim**0.5)
    w2 = host.empty((hidden, 1)).copy_(torch.randn(hidden, 1, generator=g) / hidden**0.5)

    def step() -> float:
        h = host.empty((batch, hidden))  # 1 MiB: small pool
        torch.mm(x, w1, out=h).relu_()
        out = host.empty((batch, 1))
        torch.mm(h, w2, out=out).sub_(y)  # out now holds the residual
        loss = float(out.square().mean())
        g_w2 = host.empty((hidden, 1))
        torch.mm(h.t(), out, out=g_w2)
        g_h = host.empty((batch, hidden))
        torch.mm(out, w2.t(), out=g_h).masked_fill_(h <= 0, 0.0)
        g_w1 = host.empty((dim, hidden))  # 2 MiB: large pool
        torch.mm(x.t(), g_h, out=g_w1)
        w1.sub_(g_w1, alpha=2 * lr / batch)
        w2.sub_(g_w2, alpha=2 * lr / batch)
        return loss  # h, out, grads die here

    return step


def _cuda_trainer(batch: int = 512, dim: int = 1024):
    """One AdamW step of a small MLP on CUDA through autograd."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, dim, device="cuda")
    y = torch.randn(batch, dim, device="cuda")

    def step() -> float:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    return step
