"""memalloc.core._hooks: one owner of every hook memalloc installs into torch.

The rules checked here: a feature's hook never raises into the user's code
(it is turned off with one warning), what torch passes through a hook comes
back unchanged, tensors are known by identity (a tied weight, registered
twice, broke every transformers model under enable()), one wrapper exists
per hook point, and removing the subscribers gives torch back what it had.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from memalloc.core import _hooks

FEATURE = "test feature"


@pytest.fixture(autouse=True)
def no_test_subscriptions():
    yield
    for point in _hooks.POINTS:
        _hooks.unsubscribe(point, FEATURE)
        _hooks.unsubscribe(point, FEATURE + " 2")
    _hooks._failed.pop(FEATURE, None)
    _hooks._failed.pop(FEATURE + " 2", None)


def test_tied_weight_under_enable(fresh_python):
    """The issue's three-line reproduction, under memalloc.enable() (host
    backend), then a model whose two modules share a parameter trains."""
    _, r, _ = fresh_python.code(
        "memalloc.enable(backend='host'); host.use_for_cpu_tensors()\n",
        """
        m = torch.nn.Module(); p = torch.nn.Parameter(torch.randn(64, 64)); m.a = p; m.b = p
        emb = torch.nn.Embedding(32, 16); head = torch.nn.Linear(16, 32, bias=False)
        head.weight = emb.weight  # tied, as GPT-2's lm_head
        model = torch.nn.Sequential(emb, head)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            loss = model(torch.arange(8)).logsumexp(-1).mean()
            loss.backward(); opt.step(); opt.zero_grad()
        from memalloc.core import _hooks
        R["failures"] = _hooks.failures()
        R["parameters"] = memalloc.memory_breakdown().now["parameters"]
    """,
    )
    assert r["failures"] == {}
    assert r["parameters"] >= 32 * 16 * 4 + 64 * 64 * 4  # the shared weights, each counted once


def test_one_wrapper_per_point_and_torch_restored():
    original = torch.autograd.backward
    pre = len(torch_optimizer._global_optimizer_pre_hooks)
    calls = []
    _hooks.subscribe(_hooks.BACKWARD, FEATURE, lambda: calls.append("a"), lambda t: calls.append("a-end"))
    _hooks.subscribe(_hooks.BACKWARD, FEATURE + " 2", lambda: calls.append("b"), lambda t: calls.append("b-end"))
    _hooks.subscribe(_hooks.OPTIMIZER_STEP_PRE, FEATURE, lambda *a: calls.append("pre"))
    _hooks.subscribe(_hooks.OPTIMIZER_STEP_PRE, FEATURE + " 2", lambda *a: calls.append("pre2"))
    wrapper = torch.autograd.backward
    assert wrapper is not original and wrapper.__wrapped__ is original  # one wrapper for both features
    assert len(torch_optimizer._global_optimizer_pre_hooks) == pre + 1  # one torch hook for both
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    assert calls == ["a", "b", "b-end", "a-end"] and x.grad.tolist() == [2.0, 2.0, 2.0]
    for point in (_hooks.BACKWARD, _hooks.OPTIMIZER_STEP_PRE):
        _hooks.unsubscribe(point, FEATURE)
        _hooks.unsubscribe(point, FEATURE + " 2")
    assert torch.autograd.backward is original
    assert len(torch_optimizer._global_optimizer_pre_hooks) == pre


def test_a_failing_hook_turns_its_feature_off_never_the_user_code():
    def broken(*args):
        raise RuntimeError("boom")

    _hooks.subscribe(_hooks.BACKWARD, FEATURE, broken)
    _hooks.subscribe(_hooks.OPTIMIZER_STEP_POST, FEATURE, broken)
    lin = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    w = lin.weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lin(torch.ones(1, 4)).sum().backward()  # the hook raises here
        opt.step()
        lin(torch.ones(1, 4)).sum().backward()
    mine = [c for c in caught if FEATURE in str(c.message)]
    assert len(mine) == 1 and "boom" in str(mine[0].message) and "backward" in str(mine[0].message)
    assert mine[0].category is RuntimeWarning
    assert _hooks.failures() == {FEATURE: "RuntimeError: boom"}
    assert not _hooks.subscribed(_hooks.OPTIMIZER_STEP_POST, FEATURE)  # all its subscriptions are off
    assert torch.allclose(lin.weight, w - 0.5)  # the user's step happened as without the hook
    _hooks.subscribe(_hooks.BACKWARD, FEATURE, broken)
    assert not _hooks.subscribed(_hooks.BACKWARD, FEATURE)  # a failed feature stays off


def test_backward_results_and_errors_pass_through_unchanged():
    _hooks.subscribe(_hooks.BACKWARD, FEATURE, lambda: None, lambda t: None)
    x = torch.ones(2, requires_grad=True)
    assert torch.autograd.backward((x * 3).sum()) is None
    y = (x * 3).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()  # torch's own error, not ours
    assert x.grad.tolist() == [6.0, 6.0]


def test_parameter_registration_sees_tied_weights_by_identity():
    seen = _hooks.IdentityRegistry()
    added = []
    _hooks.subscribe(_hooks.PARAMETER_REGISTRATION, FEATURE, lambda m, n, p: added.append(seen.add(p)))
    m = torch.nn.Module()
    p = torch.nn.Parameter(torch.randn(64, 64))
    m.a = p
    m.b = p  # what a WeakSet could not hold: p == p is a 64x64 tensor
    assert added == [True, False] and len(seen) == 1 and p in seen
    assert torch.nn.Parameter(p.detach().clone()) not in seen  # equal values, another tensor
    del m, p
    gc.collect()
    assert len(seen) == 0  # weak: a dead parameter leaves


def test_parameter_registration_hook_count_is_one():
    already = _hooks.installed(_hooks.PARAMETER_REGISTRATION)
    before = len(torch_module._global_parameter_registration_hooks)
    _hooks.subscribe(_hooks.PARAMETER_REGISTRATION, FEATURE, lambda *a: None)
    _hooks.subscribe(_hooks.PARAMETER_REGISTRATION, FEATURE + " 2", lambda *a: None)
    assert len(torch_module._global_parameter_registration_hooks) == before + (0 if already else 1)


def test_replaced_attributes_are_given_back_as_they_were():
    import types

    mod = types.SimpleNamespace(f=len)
    _hooks.replace_attribute(mod, "f", max)
    _hooks.replace_attribute(mod, "g", min)  # torch had no such attribute
    assert mod.f is max and mod.g is min
    _hooks.restore_attribute(mod, "f")
    _hooks.restore_attribute(mod, "g")
    assert mod.f is len and not hasattr(mod, "g")


def test_bad_subscriptions_are_refused():
    with pytest.raises(ValueError, match="unknown hook point 'nope'"):
        _hooks.subscribe("nope", FEATURE, lambda: None)
    with pytest.raises(TypeError, match="callable"):
        _hooks.subscribe(_hooks.BACKWARD, FEATURE, 3)
    with pytest.raises(ValueError, match="only the backward point takes an after"):
        _hooks.subscribe(_hooks.OPTIMIZER_STEP_PRE, FEATURE, lambda *a: None, lambda t: None)
