"""What to try first: the guide's strategies that apply to this run, each with
the peak allocated bytes it would save, estimated from the breakdown at the
step's peak (:func:`memalloc.memory_breakdown`) and, when a
:class:`ForwardProfile` watched the run, from what each module of the
forward kept alive.

``python -m memalloc run --advise script.py`` runs the script with a profile
and prints :func:`advise`'s list at exit. The estimates and what they rest
on (A, T: activations and temporaries at the peak; P: trainable parameter
bytes; G: gradients at the peak; bytes in the profile are those a module's
forward left allocated):

- half the batch: activations and temporaries scale with the batch:
  (A + T) / 2;
- gradient accumulation over 2 micro-batches: the same, but every gradient
  is live while the second micro-batch runs backward: (A + T) / 2 - (P - G);
- DDP over 2 GPUs (half the batch each): (A + T) / 2 - P (DDP's gradient
  buckets);
- activation checkpointing of the repeated blocks (the class of block that
  appears most often in the model's Sequential/ModuleList containers): what
  the blocks' forwards keep, less what checkpointing keeps at its worst
  moment: every block's input at the end of the forward, or, while block b
  is recomputed in backward, the inputs of blocks 1..b (the later ones are
  done) and what block b keeps;
- bf16 / fp16 autocast: half of what leaf modules keep (their outputs are
  half precision, or an fp32 output such as a layer norm's is saved as a
  half copy by the linear layer after it) and half the temporaries, less
  half the weights of linear and convolution layers (autocast keeps half
  copies of them for backward); what parent modules make themselves
  (residual sums of an fp32 stream) stays fp32;
- checkpointing + bf16: the two applied to activations and temporaries in
  turn;
- del + empty_cache each step: reserved bytes between steps fall to what
  stays allocated: the larger of the bytes the run held allocated at the
  last step boundary (the profile reads them there; a run holds its
  gradients, outputs and anything it keeps across it) and parameters,
  optimizer state and other at the peak plus what the known leaks held at
  the last boundary;
- optimizer state: an 8-bit or sharded optimizer (not measured here).

Only what applies is listed: DDP needs a second GPU, so it is left out of a
run on the host backend (a CPU) or with fewer than 2 CUDA devices.

A leak makes every other figure wrong (its tensors count as activations at
the peak, and it grows every step), so when the leak report of the same run
is given (``advise(..., leaks=report)``: memalloc/features/leaks.py), each
leak comes first ("fix the leak at file:line: +X per step") and the bytes it
held when the peak's step began are taken out of the activations (A above)
before any saving is estimated (a leak of parameter groups, cause
``optimizer_state``, holds no activations and is not taken out).

tests/integration/test_advisor.py checks the estimates against the table measured on
the GPU (docs/strategies.md) and against the tiny model's on the host
backend.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Optional

import torch
from torch import nn

from memalloc import _C
from memalloc.core import _hooks, _state, iteration
from memalloc.features import phases
from memalloc.core._format import fmt_bytes
from memalloc.features.breakdown import MemoryBreakdown

# Layers whose weights autocast copies to half precision (kept for backward).
CAST_WEIGHTS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)


@dataclasses.dataclass(frozen=True)
class Advice:
    """One strategy: the peak allocated bytes it would save (an estimate,
    ``saves``; for ``del_empty_cache``, reserved bytes between steps; for
    ``fix_leak``, the bytes the leak held when the peak's step began, and
    it grows every step), what the estimate rests on, and what it costs
    (for ``fix_leak``: the leak report's hint)."""

    strategy: str
    saves: int
    why: str
    cost: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Profile:
    """What one training step's forward kept, by module (bytes)."""

    blocks: list[tuple[str, int, int]]   # the repeated blocks in forward order: (name, kept bytes, input bytes)
    leaf_bytes: int                      # kept by leaf modules (no children)
    parent_bytes: int                    # kept by parent modules' own code (residual sums...)
    cast_weight_bytes: int               # fp32 weights of linear/convolution layers autocast would copy
    trainable_bytes: int                 # bytes of parameters that require grad
    # bytes allocated at the last step boundary the profile saw: what the run
    # held across it (None: no boundary seen, or a profile written before it was read)
    held_between_steps: Optional[int] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(**{f.name: d[f.name] if f.default is dataclasses.MISSING else d.get(f.name, f.default)
                      for f in dataclasses.fields(cls)})


FEATURE = "advisor's forward profile"  # its name in hook warnings (memalloc.core._hooks)


class ForwardProfile:
    """Watches the forward of every training step (global module hooks, so
    only for diagnostic runs: each module call reads the allocator twice) and
    keeps, for the last forward before a backward, the bytes each module's
    forward left allocated and the size of its input; at every step boundary
    (:func:`memalloc.step`, or ``optimizer.step()`` where boundaries are
    marked by it) it reads the allocated bytes (``held_between_steps``, the
    last boundary's). ``start()`` / ``stop()``; :meth:`profile` summarises
    the last forward."""

    def __init__(self, allocator: Optional[_C.Allocator] = None, device: int = 0) -> None:
        self._allocator = allocator
        self._a: Optional[_C.Allocator] = None
        self._device = device
        self._lock = threading.Lock()
        self._stack: list[tuple[Any, int, int]] = []
        self._current: dict[int, list] = {}  # id(module) -> [weakref, kept bytes, input bytes, calls]
        self._last: dict[int, list] = {}
        self._roots: _hooks.IdentityRegistry[nn.Module] = _hooks.IdentityRegistry()  # by identity
        self.held_between_steps: Optional[int] = None  # bytes allocated at the last step boundary

    def start(self) -> "ForwardProfile":
        self._a = _state.allocator_or_installed(self._allocator)
        _hooks.subscribe(_hooks.MODULE_FORWARD_PRE, FEATURE, self._pre)
        _hooks.subscribe(_hooks.MODULE_FORWARD, FEATURE, self._post)
        phases.add_backward_listener(self._backward_started)
        iteration.add_step_listener(self._boundary)
        return self

    def stop(self) -> None:
        _hooks.unsubscribe(_hooks.MODULE_FORWARD_PRE, FEATURE)
        _hooks.unsubscribe(_hooks.MODULE_FORWARD, FEATURE)
        phases.remove_backward_listener(self._backward_started)
        iteration.remove_step_listener(self._boundary)

    def _boundary(self, step: int) -> None:
        if self._a is not None:
            self.held_between_steps = self._allocated()

    def _allocated(self) -> int:
        assert self._a is not None
        return int(self._a.stats(self._device)["allocated_bytes"]["all"]["current"])

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self._a is None or self._a.phase(self._device) == "backward":
            return  # a recomputation (checkpointing) inside backward
        size = sum(t.untyped_storage().nbytes() for t in args if isinstance(t, torch.Tensor))
        with self._lock:
            if not self._stack:
                self._roots.add(module)
            self._stack.append((module, self._allocated(), size))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        with self._lock:
            if not self._stack or self._stack[-1][0] is not module:
                return
            _, before, size = self._stack.pop()
            entry = self._current.setdefault(id(module), [weakref.ref(module), 0, 0, 0])
            entry[1] += self._allocated() - before
            entry[2] += size
            entry[3] += 1

    def _backward_started(self) -> None:
        with self._lock:
            if self._current:
                self._last, self._current = self._current, {}

    def profile(self) -> Optional[Profile]:
        """The last forward's summary; None when no forward ran before a backward."""
        with self._lock:
            last = dict(self._last)
            roots = [r for r in self._roots]
        if not last or not roots:
            return None
        kept = {k: v[1] for k, v in last.items()}
        root = max(roots, key=lambda m: kept.get(id(m), 0))
        blocks = [(name, kept.get(id(m), 0), last[id(m)][2] if id(m) in last else 0)
                  for name, m in repeated_blocks(root)]
        leaf = parent = 0
        for m in root.modules():
            if id(m) not in last:
                continue
            children = [c for c in m.children() if id(c) in last]
            if not any(True for _ in m.children()):
                leaf += kept[id(m)]
            else:
                parent += kept[id(m)] - sum(kept[id(c)] for c in children)
        cast = sum(p.untyped_storage().nbytes() for m in root.modules() if isinstance(m, CAST_WEIGHTS)
                   for p in m.parameters(recurse=False) if p.dtype == torch.float32)
        trainable = sum(p.untyped_storage().nbytes() for p in root.parameters() if p.requires_grad)
        return Profile(blocks, leaf, max(0, parent), cast, trainable, self.held_between_steps)


def repeated_blocks(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks activation checkpointing would wrap: among the children of
    the model's Sequential and ModuleList containers that have children of
    their own, those of the class that appears most often (at least twice)."""
    by_class: dict[type, list[tuple[str, nn.Module]]] = {}
    for name, m in root.named_modules():
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            for child_name, child in m.named_children():
                if any(True for _ in child.children()):
                    by_class.setdefault(type(child), []).append((f"{name}.{child_name}".lstrip("."), child))
    if not by_class:
        return []
    best = max(by_class.values(), key=len)
    return best if len(best) >= 2 else []


def visible_gpus() -> int:
    """How many GPUs this run could train on: 0 on the host backend (the
    device is simulated in CPU memory), else torch.cuda.device_count()
    (0 without CUDA). Does not initialise CUDA."""
    if _state.enabled_backend() == "host":
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.version.cuda is not None else 0
    except Exception:  # a broken driver: no GPU to advise
        return 0


def _leaks_of(leaks: Any) -> tuple[list, list]:
    """(the leaks, the steps sampled) of a LeakReport, or of a list of Leak."""
    if leaks is None:
        return [], []
    if hasattr(leaks, "leaks"):
        return list(leaks.leaks), list(getattr(leaks, "steps", []))
    return list(leaks), []


def _held_at(leak: Any, steps: list, step: Optional[int]) -> int:
    """Bytes the leak's site held at boundary ``step`` (its sample there; the
    peak's step began at boundary ``peak_step - 1``); without that sample,
    at its second-to-last sample (the report's last step began there)."""
    series = list(leak.series or [])
    if step is not None and step in steps and len(steps) == len(series):
        return int(series[steps.index(step)])
    return int(series[-2]) if len(series) >= 2 else 0


def advise(breakdown: MemoryBreakdown, profile: Optional[Profile] = None,
           reserved_after: Optional[int] = None, *, leaks: Any = None, gpus: Optional[int] = None,
           held_between_steps: Optional[int] = None) -> list[Advice]:
    """The strategies that apply, the run's leaks first, then largest saving
    first (bytes). ``profile`` adds checkpointing and sharpens the
    mixed-precision estimate; ``reserved_after``: reserved bytes between
    steps (del + empty_cache); ``leaks``: the same run's leak report
    (:class:`memalloc.LeakReport`, or a list of its :class:`Leak`): each
    leak is advised first and the bytes it held when the peak's step began
    are not counted as activations; ``gpus``: the GPUs the run could use
    (default :func:`visible_gpus`; DDP is advised from 2);
    ``held_between_steps``: bytes allocated at the last step boundary
    (default: the profile's)."""
    b = breakdown.peak
    act, tmp, grads = b["activations"], b["temporaries"], b["gradients"]
    params = profile.trainable_bytes if profile is not None else b["parameters"]
    if gpus is None:
        gpus = visible_gpus()
    if held_between_steps is None and profile is not None:
        held_between_steps = profile.held_between_steps
    found, steps = _leaks_of(leaks)
    first: list[Advice] = []
    leaked_at_peak = leaked_at_end = 0  # bytes of activations the leaks held (peak's step start; last boundary)
    begun = breakdown.peak_step - 1 if breakdown.peak_step is not None else None
    for leak in found:
        holds_activations = leak.cause != "optimizer_state"  # a parameter-group leak holds parameters and state
        at_peak = _held_at(leak, steps, begun) if holds_activations else 0
        if holds_activations:
            leaked_at_peak += at_peak
            leaked_at_end += int(leak.series[-1]) if leak.series else int(leak.retained_bytes)
        holder = leak.holder
        held_by = f", held by {holder['kind']} `{holder['name']}`" if holder else ""
        if holds_activations:
            counted = (f"it held {fmt_bytes(at_peak)} when the peak's step began, counted as activations there "
                       "and left out of the estimates below")
        else:
            counted = "its bytes are parameters, gradients and optimizer state, not activations"
        first.append(Advice(
            "fix_leak", at_peak,
            f"fix the leak at {leak.where()}: +{fmt_bytes(leak.bytes_per_step)} per step "
            f"({fmt_bytes(leak.retained_bytes)} in {leak.retained_tensors} tensors since step {leak.first_step}"
            f"{held_by}); {counted}",
            leak.hint or "look for references kept across steps (lists, dicts, attributes, closures)"))
    act = max(0, act - leaked_at_peak)
    varying = act + tmp
    leak_note = f" (less {fmt_bytes(leaked_at_peak)} the leaks held)" if leaked_at_peak else ""
    out: list[Advice] = []
    if varying > 0:
        out.append(Advice("half_batch", varying // 2,
                          f"activations {fmt_bytes(act)}{leak_note} and temporaries {fmt_bytes(tmp)} at the peak "
                          "scale with the batch", "half the samples per step"))
        out.append(Advice("grad_accumulation", max(0, varying // 2 - max(0, params - grads)),
                          "half the activations per micro-batch; every gradient is live in the second one",
                          "the same samples per optimizer step; two forward/backward passes each"))
        if gpus >= 2:
            out.append(Advice("ddp", max(0, varying // 2 - params),
                              "each of 2 GPUs trains half the batch; DDP adds gradient buckets the size of the "
                              "trainable parameters", "a second GPU"))
    ckpt = mixed = None
    if profile is not None and profile.blocks:
        kept = sum(k for _, k, _ in profile.blocks)
        inputs = worst = 0
        for _, k, i in profile.blocks:  # block b recomputed: the inputs of blocks 1..b and what b keeps
            inputs += i
            worst = max(worst, inputs + k)
        worst = max(worst, inputs)
        ckpt = max(0, kept - worst)
        out.append(Advice("checkpointing", ckpt,
                          f"{len(profile.blocks)} repeated blocks keep {fmt_bytes(kept)} in the forward; "
                          f"checkpointed, they keep their inputs ({fmt_bytes(inputs)}), {fmt_bytes(worst)} at "
                          "the worst moment of the backward's recomputation",
                          "each block's forward runs twice (the guide: 20-30% more time)"))
    if varying > 0:
        if profile is not None:
            mixed = max(0, profile.leaf_bytes // 2 + tmp // 2 - profile.cast_weight_bytes // 2)
            why = (f"leaf modules keep {fmt_bytes(profile.leaf_bytes)}, half of it in half precision; "
                   f"{fmt_bytes(profile.parent_bytes)} made by parent modules stays fp32; autocast adds "
                   f"half copies of {fmt_bytes(profile.cast_weight_bytes)} of weights")
        else:
            mixed = max(0, varying // 2 - params // 2)
            why = "activations and temporaries in half precision, plus half copies of the weights"
        out.append(Advice("bf16_autocast", mixed, why, "none on GPUs with bf16 (Ampere and later): faster"))
        out.append(Advice("fp16_grad_scaler", mixed, why, "a GradScaler against fp16 underflow"))
        if ckpt is not None:
            left = 1.0 - (ckpt / varying)
            both = int(varying * (1.0 - max(0.0, left) * (1.0 - mixed / varying)))
            out.append(Advice("checkpointing_bf16", both, "checkpointing, then autocast on what is left",
                              "the recomputation of checkpointing"))
    if reserved_after is not None:
        stays = b["parameters"] + b["optimizer_state"] + b["other"] + leaked_at_end
        what = "parameters, optimizer state and other" + (" and the leaks" if leaked_at_end else "")
        if held_between_steps is not None and held_between_steps >= stays:
            stays, what = held_between_steps, "what the run held allocated at the last step boundary"
        out.append(Advice("del_empty_cache", max(0, reserved_after - stays),
                          f"between steps only {what} ({fmt_bytes(stays)}) must stay reserved, "
                          f"not {fmt_bytes(reserved_after)}",
                          "the peak is unchanged; every step allocates its memory from the device again"))
    if b["optimizer_state"] > varying:
        out.append(Advice("optimizer_state", b["optimizer_state"] * 3 // 4,
                          f"optimizer state ({fmt_bytes(b['optimizer_state'])}) is more than the activations",
                          "an 8-bit optimizer (3/4 of it) or one sharded over GPUs (FSDP/ZeRO); not measured"))
    return first + sorted(out, key=lambda a: -a.saves)


def to_text(advice: list[Advice], breakdown: MemoryBreakdown) -> str:
    """The advice as lines, in :func:`advise`'s order: the leaks first ("fix
    the leak at file:line: +X per step"), then largest saving first."""
    total = breakdown.peak_total
    lines = [f"memalloc advice (peak allocated {fmt_bytes(total)}; the largest part: {breakdown.largest()}):"]
    for a in advice:
        if a.strategy == "fix_leak":
            lines.append(f"  {a.strategy:<20} {a.why}; hint: {a.cost}")
            continue
        if a.strategy == "del_empty_cache":
            what = "reserved between steps"
        else:
            what = f"of the peak ({100 * a.saves / total:.0f}%)" if total else "of the peak"
        lines.append(f"  {a.strategy:<20} saves ~{fmt_bytes(a.saves)} {what}: {a.why}; cost: {a.cost}")
    return "\n".join(lines)
