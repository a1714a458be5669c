"""User code for tests/unit/test_recording.py: allocation sites on known lines.

The tests find each site's line by its marker comment (``# SITE:<name>``),
never by a hard-coded number, and check that recorded stacks name this file,
that line and the enclosing function. Every site allocates from
``allocator``: the test's own host-backend allocator when the tests run in
their process, the installed one (None) in the fresh interpreter that
enables memalloc.
"""

import threading

import torch

import memalloc
from memalloc import _C, host


def alloc_a(nbytes: int = 1000, allocator: _C.Allocator | None = None) -> torch.Tensor:
    return host.empty(nbytes, torch.uint8, allocator=allocator)  # SITE:alloc_a


def alloc_b(nbytes: int = 1000, allocator: _C.Allocator | None = None) -> torch.Tensor:
    return host.empty(nbytes, torch.uint8, allocator=allocator)  # SITE:alloc_b


def outer(nbytes: int = 1000, allocator: _C.Allocator | None = None) -> torch.Tensor:
    return middle(nbytes, allocator)  # SITE:outer


def middle(nbytes: int, allocator: _C.Allocator | None) -> torch.Tensor:
    return alloc_a(nbytes, allocator)  # SITE:middle


def loop_twice(allocator: _C.Allocator | None = None) -> list:
    out = []
    for _ in range(2):
        out.append(host.empty(1000, torch.uint8, allocator=allocator))  # SITE:loop
    return out


def deep(depth: int, nbytes: int = 1000, allocator: _C.Allocator | None = None) -> torch.Tensor:
    if depth == 0:
        return host.empty(nbytes, torch.uint8, allocator=allocator)  # SITE:deep
    return deep(depth - 1, nbytes, allocator)  # SITE:deep_rec


class BackwardLog:
    """What Double's backward allocated, in order: ``native`` (from a native
    thread), ``python`` (from a Python thread, when asked for)."""

    def __init__(self) -> None:
        self.native: list = []
        self.python: list = []


class Double(torch.autograd.Function):
    """x * 2 whose backward allocates from ``allocator`` the way autograd's
    engine threads do: from a native thread with no Python state; with
    ``python_thread``, a Python thread (it has Python frames) also
    allocates, untagged, while the backward runs."""

    @staticmethod
    def forward(ctx, x, allocator, log, python_thread):
        ctx.allocator, ctx.log, ctx.python_thread = allocator, log, python_thread
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        a, log = ctx.allocator, ctx.log
        log.native.append(_C._testing.malloc_on_native_thread(a, 3000))
        if ctx.python_thread:
            t = threading.Thread(target=lambda: log.python.append(a.malloc(3500)))
            t.start()
            t.join()
        return grad * 2, None, None, None


def train_step(
    allocator: _C.Allocator, log: BackwardLog, tagged: bool = True, python_thread: bool = False
) -> torch.Tensor:
    x = torch.ones(4, requires_grad=True)
    loss = Double.apply(x, allocator, log, python_thread).sum()
    if tagged:
        with memalloc.tag("train"):
            loss.backward()  # SITE:backward_tagged
    else:
        loss.backward()  # SITE:backward_plain
    return x.grad


def train_step_functional(allocator: _C.Allocator, log: BackwardLog) -> torch.Tensor:
    x = torch.ones(4, requires_grad=True)
    loss = Double.apply(x, allocator, log, False).sum()
    torch.autograd.backward(loss)  # SITE:backward_functional
    return x.grad
