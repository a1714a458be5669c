"""User code for tests/test_recording.py: allocation sites on known lines.

The tests find each site's line by its marker comment (``# SITE:<name>``),
never by a hard-coded number, and check that recorded stacks name this file,
that line and the enclosing function. Imported only by the child
interpreters the tests start (memalloc must be enabled on the host backend).
"""
import threading

import torch

import memalloc
from memalloc import host


def alloc_a(nbytes=1000):
    return host.empty(nbytes, torch.uint8)  # SITE:alloc_a


def alloc_b(nbytes=1000):
    return host.empty(nbytes, torch.uint8)  # SITE:alloc_b


def outer(nbytes=1000):
    return middle(nbytes)  # SITE:outer


def middle(nbytes):
    return alloc_a(nbytes)  # SITE:middle


def loop_twice():
    out = []
    for _ in range(2):
        out.append(host.empty(1000, torch.uint8))  # SITE:loop
    return out


def deep(depth, nbytes=1000):
    if depth == 0:
        return host.empty(nbytes, torch.uint8)  # SITE:deep
    return deep(depth - 1, nbytes)  # SITE:deep_rec


class Double(torch.autograd.Function):
    """x * 2 whose backward allocates the way autograd's engine threads do:
    from a native thread with no Python state."""

    native_ptrs = []  # pointers allocated by backward, in order
    python_thread_ptrs = []  # set when `python_thread` is on
    python_thread = False

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        a = memalloc.installed_allocator()
        Double.native_ptrs.append(memalloc._C._testing.malloc_on_native_thread(a, 3000))
        if Double.python_thread:
            # A Python thread (it has Python frames) allocating, untagged,
            # while the backward runs.
            t = threading.Thread(target=lambda: Double.python_thread_ptrs.append(a.malloc(3500)))
            t.start()
            t.join()
        return grad * 2


def train_step(tagged=True):
    x = torch.ones(4, requires_grad=True)
    loss = Double.apply(x).sum()
    if tagged:
        with memalloc.tag("train"):
            loss.backward()  # SITE:backward_tagged
    else:
        loss.backward()  # SITE:backward_plain
    return x.grad


def train_step_functional():
    x = torch.ones(4, requires_grad=True)
    loss = Double.apply(x).sum()
    torch.autograd.backward(loss)  # SITE:backward_functional
    return x.grad
