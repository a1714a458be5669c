"""Training loops for the leak tests (tests/integration/test_leaks.py), run on the host
backend with torch's CPU tensors coming from memalloc
(memalloc.host.use_for_cpu_tensors). Each leaking line is marked with
``# LEAK:<name>`` (the line the report must name) and, where the leak is
allocated elsewhere, ``# ALLOC:<name>``. Every loop calls memalloc.step()
at the end of each iteration, except the auto_step one. Each loop takes the
allocator its leak_check() watches (default: the installed one, as a user
would write it); tests/integration/test_leaks.py passes one it owns."""

from __future__ import annotations

import collections
import gc

import torch

import memalloc

STEPS = 24  # iterations per loop
# Each loop runs under memalloc.leak_check(allocator=allocator) and returns it: the report is made
# when the with block ends, while the loop's locals are still alive.
torch.manual_seed(0)


def model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))


def batch():
    return torch.randn(16, 64), torch.randn(16, 8)


# ---- leaks -----------------------------------------------------------------------
def losses_with_graph(allocator=None):
    """Training loop that keeps each loss tensor (and its autograd graph)."""
    m, losses = model(), []
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            loss = torch.nn.functional.mse_loss(m(x), y)  # ALLOC:losses_with_graph
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)  # LEAK:losses_with_graph
            memalloc.step()
    return check


def logits_with_graph(allocator=None):
    """Training loop that keeps each step's logits (16x8 float32: 512 B, with
    their autograd graph, whose saved tensors backward freed)."""
    m, logits = model(), []
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            out = m(x)
            loss = torch.nn.functional.mse_loss(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            logits.append(out)  # LEAK:logits_with_graph
            memalloc.step()
    return check


def eval_without_no_grad(allocator=None):
    """Evaluation that keeps outputs with their graphs (activations saved)."""
    m, outputs = model(), []
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            out = m(x)
            outputs.append(out)  # LEAK:eval_without_no_grad
            memalloc.step()
    return check


class LazyWorkspace(torch.nn.Module):
    """A layer that makes a scratch buffer on its first call and keeps it, as
    cuBLAS and cuDNN do with their workspaces: allocated at the forward's
    line in the first iteration, alive ever after, saved by no graph."""

    def __init__(self):
        super().__init__()
        self.scratch = None

    def forward(self, x):
        if self.scratch is None:
            self.scratch = torch.empty(32 * 1024)  # 128 KiB
        return x


def eval_with_a_lazy_workspace(allocator=None):
    """eval_without_no_grad through a layer whose first call makes a
    workspace it keeps: the workspace is no part of the kept graphs."""
    m, outputs = torch.nn.Sequential(LazyWorkspace(), *model()), []
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            out = m(x)
            outputs.append(out)  # LEAK:eval_with_a_lazy_workspace
            memalloc.step()
    return check


class Recorder:
    """Forward hook that stores activations: the classic hook leak."""

    def __init__(self):
        self.store = []

    def hook(self, module, inputs, output):
        self.store.append(output.detach().clone())  # LEAK:hook_storage


def hook_storage(allocator=None):
    m, rec = model(), Recorder()
    m[1].register_forward_hook(rec.hook)
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        with torch.no_grad():
            for _ in range(STEPS):
                m(x)
                memalloc.step()
    return check


def cache_by_step(allocator=None):
    """A dict keyed by the step keeps every step's tensor."""
    cache = {}
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for step in range(STEPS):
            feats = x * 2.0
            cache[step] = feats  # LEAK:cache_by_step
            memalloc.step()
    return check


def _remember(store, t):
    store.append(t + 1)  # LEAK:helper


def leak_in_helper(allocator=None):
    """The leak is in a helper function called from the loop."""
    store = []
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            _remember(store, x)
            memalloc.step()
    return check


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.seen = []

    def forward(self, x):
        h = self.lin(x)
        self.seen.append(h.detach())  # LEAK:nested_module
        return h


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(Block(), torch.nn.ReLU())

    def forward(self, x):
        return self.inner(x)


def nested_module(allocator=None):
    """The leak is two modules deep (an attribute list of an inner module)."""
    m = Outer()
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        with torch.no_grad():
            for _ in range(STEPS):
                m(x)
                memalloc.step()
    return check


def auto_step_loss_list(allocator=None):
    """losses.append(loss) with boundaries from optimizer.step() (no memalloc.step())."""
    with memalloc.leak_check(allocator=allocator) as check:
        memalloc.auto_step()
        m, losses = model(), []
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        x, y = batch()
        for _ in range(STEPS):
            loss = torch.nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)  # LEAK:auto_step_loss_list
        memalloc.auto_step(False)
    return check


# ---- not leaks -------------------------------------------------------------------
def training_with_item(allocator=None):
    """The fixed loop: loss.item(); warm-up growth (Adam state) then flat."""
    m, losses = model(), []
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    x, y = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            loss = torch.nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            memalloc.step()
    return check


def cache_heavy(allocator=None):
    """Big tensors freed every step: reserved stays far above allocated."""
    with memalloc.leak_check(allocator=allocator) as check:
        for i in range(STEPS):
            big = torch.empty((4 << 20) + (i % 3) * (1 << 20), dtype=torch.uint8)
            big.fill_(1)
            del big
            memalloc.step()
    return check


def one_iteration_retention(allocator=None):
    """The previous step's output is kept for one more step only."""
    m = model()
    x, _ = batch()
    prev = None
    with memalloc.leak_check(allocator=allocator) as check:
        with torch.no_grad():
            for _ in range(STEPS):
                out = m(x)
                prev = out  # replaced next step
                memalloc.step()
    return check


def warmup_then_flat(allocator=None):
    """A buffer pool that grows for 3 steps and then is reused."""
    pool = []
    with memalloc.leak_check(allocator=allocator) as check:
        for i in range(STEPS):
            if i < 3:
                pool.append(torch.zeros(1 << 16))
            pool[i % len(pool)].add_(1)
            memalloc.step()
    return check


class Cycle:
    def __init__(self, t):
        self.t = t
        self.me = self


def gc_delayed(allocator=None):
    """Tensors in reference cycles, freed only when the garbage collector runs
    (every 4 steps here)."""
    with memalloc.leak_check(allocator=allocator) as check:
        gc.disable()
        try:
            for i in range(STEPS):
                Cycle(torch.ones(1 << 14))
                if i % 4 == 3:
                    gc.collect()
                memalloc.step()
        finally:
            gc.enable()
    return check


def bounded_deque(allocator=None):
    """A bounded deque of the last 3 outputs: flat after it fills."""
    last = collections.deque(maxlen=3)
    x, _ = batch()
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(STEPS):
            last.append(x * 3)
            memalloc.step()
    return check


LEAKS = [
    logits_with_graph,
    losses_with_graph,
    eval_without_no_grad,
    hook_storage,
    cache_by_step,
    leak_in_helper,
    nested_module,
    auto_step_loss_list,
    eval_with_a_lazy_workspace,
]
NOT_LEAKS = [training_with_item, cache_heavy, one_iteration_retention, warmup_then_flat, gc_delayed, bounded_deque]
