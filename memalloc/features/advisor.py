"""What to try first: the guide's strategies that apply to this run, each with
the peak allocated bytes it would save, estimated from the breakdown at the
step's peak (:func:`memalloc.memory_breakdown`) and, when a
:class:`ForwardProfile` watched the run, from what each module of the
forward kept alive, where in the step the peak was, and what the
allocator's segments held at the last step boundary.

``python -m memalloc run --advise script.py`` runs the script with a profile
and prints :func:`advise`'s list at exit. The estimates and what they rest
on (A, T: activations and temporaries at the peak; P: trainable parameter
bytes; G: gradients at the peak; bytes in the profile are those a module's
forward left allocated):

- where the peak was: the profile reads the step's running peak where each
  backward begins and ends; a peak after the step's last backward is in the
  optimizer's step, where what autograd saved is gone and the temporaries
  are the optimizer's (as large as the parameters, whatever the batch):
  there only A (what the loop keeps: its outputs, the loss, the batch)
  scales with the batch, and checkpointing saves nothing (not listed);
- half the batch: what scales with the batch halves: (A + T) / 2, or A / 2
  at a peak in the optimizer's step; under ``run --fit`` the planner's
  figure instead (its per-sample bytes times the samples dropped: the batch
  planner, memalloc/features/planner.py, answers "what fits", and the
  largest batch for a budget is its answer, not this list's);
- gradient accumulation over 2 micro-batches: the same, but every gradient
  is live while the second micro-batch runs backward: ... - (P - G);
- DDP over 2 GPUs (half the batch each): ... - P (DDP's gradient buckets);
- activation checkpointing of the repeated blocks (the class of block that
  appears most often in the model's Sequential/ModuleList containers): what
  the blocks' forwards keep, less what checkpointing keeps at its worst
  moment: every block's input at the end of the forward, or, while block b
  is recomputed in backward, the inputs of blocks 1..b (the later ones are
  done) and what block b keeps, less the gradients the peak held that were
  freed before the backward began (zero_grad between forward and backward,
  as Lightning's closure does);
- bf16 / fp16 autocast: half of what leaf modules keep (their outputs are
  half precision, or an fp32 output such as a layer norm's is saved as a
  half copy by the linear layer after it), but for the model's output (what
  the last leaf keeps), which the loss casts back to fp32; less half the
  weights of linear and convolution layers (autocast keeps half copies of
  them for backward); the temporaries at a peak in the forward are the
  loss's, which autocast runs in fp32 (they stay), at a peak in backward
  they are gradients of half-precision ops (they halve); what parent
  modules make themselves (residual sums of an fp32 stream) stays fp32. At
  a peak in the optimizer's step: A / 2;
- checkpointing + bf16: the two applied to activations and temporaries in
  turn;
- del + empty_cache each step: reserved bytes between steps fall to what
  empty_cache() keeps at the last step boundary: the segments, under
  expandable segments the pages, that hold a live block there (the
  profile reads them: :func:`kept_by_empty_cache`), and at least the bytes
  the run held allocated there, or parameters, optimizer state and other at
  the peak plus what the known leaks held at the last boundary;
- optimizer state: an 8-bit or sharded optimizer (not measured here).

Only what applies is listed: DDP needs a second GPU, so it is left out of a
run on the host backend (a CPU) or with fewer than 2 CUDA devices; a
strategy that would save nothing is left out.

A leak makes every other figure wrong (its tensors count as activations at
the peak, and it grows every step), so when the leak report of the same run
is given (``advise(..., leaks=report)``: memalloc/features/leaks.py), each
leak comes first ("fix the leak at file:line: +X per step", saving the bytes
it held when the peak's step began) and those bytes are taken out of the
activations (A above) before any other saving is estimated: the figures
after it are those of the run with the leak fixed (a leak of parameter
groups, cause ``optimizer_state``, holds no activations and is not taken
out; what a leak kept from the first step counts as other, the breakdown's
warm-up step, as far as other holds it). ``del_empty_cache`` is of the run
as it is: the leak's tensors are live between its steps.

tests/integration/test_advisor.py checks the estimates against the table
measured on the GPU (docs/strategies.md) and against the tiny model's on
the host backend; tests/integration/test_real_paths_advice_applied.py
against the savings measured by applying each strategy to a plain script,
a Lightning loop and a leaking script on the host backend.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import torch
from torch import nn

from memalloc import _C
from memalloc.core import _hooks, _state, iteration
from memalloc.core._format import fmt_bytes
from memalloc.features import phases
from memalloc.features.breakdown import MemoryBreakdown
from memalloc.reporters.advice import advice_text
from memalloc.reporters.notebook import advice_html

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

    def __repr__(self) -> str:
        return f"<memalloc Advice {self.strategy}: saves ~{fmt_bytes(self.saves)}; {self.why}>"

    def _repr_html_(self) -> str:
        """What Jupyter shows (memalloc/reporters/notebook.py renders it)."""
        return advice_html(self.to_dict())


@dataclasses.dataclass
class Profile:
    """What one training step's forward kept, by module (bytes)."""

    blocks: list[tuple[str, int, int]]  # the repeated blocks in forward order: (name, kept bytes, input bytes)
    leaf_bytes: int  # kept by leaf modules (no children)
    parent_bytes: int  # kept by parent modules' own code (residual sums...)
    cast_weight_bytes: int  # fp32 weights of linear/convolution layers autocast would copy
    trainable_bytes: int  # bytes of parameters that require grad
    # bytes allocated at the last step boundary the profile saw: what the run
    # held across it (None: no boundary seen, or a profile written before it was read)
    held_between_steps: int | None = None
    # reserved bytes that empty_cache() at the last step boundary would have
    # kept: the segments (under expandable segments, the pages) holding a live
    # block there (None: not read)
    kept_reserved: int | None = None
    # where the last finished step's peak was: "forward" (before one of its
    # backwards), "backward" (inside one), "optimizer" (after its last
    # backward: the optimizer's step); None: not read, or a step without a backward
    peak_phase: str | None = None
    # gradient bytes live when that step's first backward began (None: not read)
    grads_at_backward: int | None = None
    # what the forward's last leaf module (its head) kept: its output, which
    # autocast casts back to fp32 for the loss (None: not read)
    output_bytes: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        return cls(
            **{
                f.name: d[f.name] if f.default is dataclasses.MISSING else d.get(f.name, f.default)
                for f in dataclasses.fields(cls)
            }
        )


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

    def __init__(self, allocator: _C.Allocator | None = None, device: int = 0) -> None:
        self._allocator = allocator
        self._a: _C.Allocator | None = None
        self._device = device
        self._lock = threading.Lock()
        self._stack: list[tuple[Any, int, int]] = []
        self._current: dict[int, list] = {}  # id(module) -> [weakref, kept bytes, input bytes, calls]
        self._last: dict[int, list] = {}
        self._roots: _hooks.IdentityRegistry[nn.Module] = _hooks.IdentityRegistry()  # by identity
        self.held_between_steps: int | None = None  # bytes allocated at the last step boundary
        self.kept_reserved: int | None = None  # reserved bytes empty_cache() would keep there
        # This step's running peak read where a backward begins ("forward" up
        # to there) and ends ("backward"), and the gradients live at its first
        # backward; at the boundary, the phase of the finished step's peak.
        self._readings: list[tuple[str, int]] = []
        self._grads_now: int | None = None
        self._depth = 0
        self.peak_phase: str | None = None
        self.grads_at_backward: int | None = None

    def start(self) -> ForwardProfile:
        self._a = _state.allocator_or_installed(self._allocator)
        _hooks.subscribe(_hooks.MODULE_FORWARD_PRE, FEATURE, self._pre)
        _hooks.subscribe(_hooks.MODULE_FORWARD, FEATURE, self._post)
        phases.add_backward_listener(self._backward_started)
        _hooks.subscribe(_hooks.BACKWARD, FEATURE, self._backward_begins, self._backward_ends)
        iteration.add_step_listener(self._boundary)
        return self

    def stop(self) -> None:
        _hooks.unsubscribe(_hooks.MODULE_FORWARD_PRE, FEATURE)
        _hooks.unsubscribe(_hooks.MODULE_FORWARD, FEATURE)
        phases.remove_backward_listener(self._backward_started)
        _hooks.unsubscribe(_hooks.BACKWARD, FEATURE)
        iteration.remove_step_listener(self._boundary)

    def _boundary(self, step: int) -> None:
        if self._a is None:
            return
        self.held_between_steps = self._allocated()
        self.kept_reserved = kept_by_empty_cache(self._a, self._device)
        raw = self._a.breakdown(self._device)
        # the step's peak: `last` once the breakdown has ended the step (its
        # listener runs first), else the running peak
        ended = raw["last"] is not None and int(raw["last_step"]) == step
        final = int((raw["last"] if ended else raw["peak"])["total"])
        with self._lock:
            readings, self._readings = self._readings, []
            grads, self._grads_now = self._grads_now, None
        if readings:  # the first interval whose running peak reached the step's: where the peak was
            self.peak_phase = next((label for label, running in readings if running >= final), "optimizer")
            self.grads_at_backward = grads
        else:
            self.peak_phase = self.grads_at_backward = None

    def _backward_begins(self) -> bool:
        with self._lock:
            self._depth += 1
            if self._depth > 1 or self._a is None:  # a backward inside a backward (reentrant checkpointing)
                return False
        raw = self._a.breakdown(self._device)
        with self._lock:
            self._readings.append(("forward", int(raw["peak"]["total"])))
            if self._grads_now is None:
                self._grads_now = int(raw["now"]["split"]["gradients"])
        return True

    def _backward_ends(self, outermost: bool) -> None:
        with self._lock:
            self._depth -= 1
        if outermost and self._a is not None:
            running = int(self._a.breakdown(self._device)["peak"]["total"])
            with self._lock:
                self._readings.append(("backward", running))

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

    def profile(self) -> Profile | None:
        """The last forward's summary; None when no forward ran before a backward."""
        with self._lock:
            last = dict(self._last)
            roots = [r for r in self._roots]
        if not last or not roots:
            return None
        kept = {k: v[1] for k, v in last.items()}
        root = max(roots, key=lambda m: kept.get(id(m), 0))
        blocks = [
            (name, kept.get(id(m), 0), last[id(m)][2] if id(m) in last else 0) for name, m in repeated_blocks(root)
        ]
        leaf = parent = 0
        for m in root.modules():
            if id(m) not in last:
                continue
            if not any(True for _ in m.children()):
                leaf += kept[id(m)]
            else:  # less what the nearest profiled modules below it kept (a container may not be called)
                parent += kept[id(m)] - sum(kept[id(c)] for c in _profiled_below(m, last))
        finished = [k for k, v in last.items() if v[0]() is not None and not any(True for _ in v[0]().children())]
        output = kept[finished[-1]] if finished else 0  # the last leaf to finish its forward (dicts keep order)
        cast = sum(
            p.untyped_storage().nbytes()
            for m in root.modules()
            if isinstance(m, CAST_WEIGHTS)
            for p in m.parameters(recurse=False)
            if p.dtype == torch.float32
        )
        trainable = sum(p.untyped_storage().nbytes() for p in root.parameters() if p.requires_grad)
        return Profile(
            blocks,
            leaf,
            max(0, parent),
            cast,
            trainable,
            self.held_between_steps,
            self.kept_reserved,
            self.peak_phase,
            self.grads_at_backward,
            output,
        )


def _profiled_below(module: nn.Module, profiled: dict) -> list[nn.Module]:
    """The modules under ``module`` whose forward the profile saw that are
    not under another such module: its children, or, for a child that was
    not called (an nn.Sequential or nn.ModuleList the parent loops over),
    that child's own, and so on."""
    out: list[nn.Module] = []
    for child in module.children():
        out += [child] if id(child) in profiled else _profiled_below(child, profiled)
    return out


def kept_by_empty_cache(allocator: _C.Allocator, device: int) -> int:
    """The reserved bytes of ``device`` that ``empty_cache()`` called now
    would keep: every segment holding a live block (one in use, or freed
    but waiting for a stream), under expandable segments only the pages
    such a block touches, and every segment of a private pool (a CUDA
    graph's, which empty_cache leaves alone)."""
    kept = 0
    for seg in allocator.segments(device):
        live = [(b["address"], b["size"]) for b in seg["blocks"] if b["state"] != "inactive"]
        if tuple(seg["segment_pool_id"]) != (0, 0):
            kept += seg["total_size"]
        elif live and not seg["is_expandable"]:
            kept += seg["total_size"]
        elif live:  # the pages it unmaps at a time (pool/vm_arena.h): a mapped run starts on one
            page = seg["page_size"]
            pages: set[int] = set()
            for address, size in live:
                first = (address - seg["address"]) // page
                pages.update(range(first, (address - seg["address"] + size - 1) // page + 1))
            kept += min(seg["total_size"], len(pages) * page)
    return kept


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


def _held_at(leak: Any, steps: list, step: int | None) -> int:
    """Bytes the leak's site held at boundary ``step`` (its sample there; the
    peak's step began at boundary ``peak_step - 1``); without that sample,
    at its second-to-last sample (the report's last step began there)."""
    series = list(leak.series or [])
    if step is not None and step in steps and len(steps) == len(series):
        return int(series[steps.index(step)])
    return int(series[-2]) if len(series) >= 2 else 0


def _held_from_the_first_step(leak: Any, steps: list) -> int:
    """Bytes the leak's site held at the first step boundary (sampled
    there): allocated before it, in the breakdown's warm-up step, so counted
    as ``other``, not as activations (0 when the report did not sample it)."""
    series = list(leak.series or [])
    return int(series[steps.index(1)]) if 1 in steps and len(steps) == len(series) else 0


def advise(
    breakdown: MemoryBreakdown,
    profile: Profile | None = None,
    reserved_after: int | None = None,
    *,
    leaks: Any = None,
    gpus: int | None = None,
    held_between_steps: int | None = None,
    plan: Any = None,
) -> list[Advice]:
    """The strategies that apply, the run's leaks first, then largest saving
    first (bytes); a strategy that would save nothing is not listed.
    ``profile`` adds checkpointing, sharpens the mixed-precision estimate,
    says where the step's peak was and what empty_cache() would keep;
    ``reserved_after``: reserved bytes between steps (del + empty_cache);
    ``leaks``: the same run's leak report (:class:`memalloc.leaks.LeakReport`, or
    a list of its :class:`Leak`): each leak is advised first and the bytes
    it held when the peak's step began are not counted as activations;
    ``gpus``: the GPUs the run could use (default :func:`visible_gpus`; DDP
    is advised from 2); ``held_between_steps``: bytes allocated at the last
    step boundary (default: the profile's); ``plan``: the batch planner's
    plan the run trains at (:class:`memalloc.features.planner.BatchPlan`, ``run --fit``):
    the bytes a batch half as large saves (half_batch, and the half batch of
    gradient accumulation and DDP) are then the planner's, its per-sample
    bytes times the samples dropped, not the breakdown's estimate. For the
    batch that fits a budget, ask the planner (``run --fit BUDGET``,
    :func:`memalloc.largest_batch`), not this list."""
    b = breakdown.peak
    act, tmp, grads = b["activations"], b["temporaries"], b["gradients"]
    params = profile.trainable_bytes if profile is not None else b["parameters"]
    phase = profile.peak_phase if profile is not None else None
    after_backward = phase == "optimizer"  # the peak came in the optimizer's step
    if gpus is None:
        gpus = visible_gpus()
    if held_between_steps is None and profile is not None:
        held_between_steps = profile.held_between_steps
    found, steps = _leaks_of(leaks)
    first: list[Advice] = []
    leaked_at_peak = leaked_at_end = 0  # bytes of activations the leaks held (peak's step start; last boundary)
    begun = breakdown.peak_step - 1 if breakdown.peak_step is not None else None
    in_other = b["other"]
    for leak in found:
        holds_activations = leak.cause != "optimizer_state"  # a parameter-group leak holds parameters and state
        at_peak = _held_at(leak, steps, begun) if holds_activations else 0
        at_end = (int(leak.series[-1]) if leak.series else int(leak.retained_bytes)) if holds_activations else 0
        # counted as other (the breakdown's warm-up step), as far as other holds them
        warm_up = min(_held_from_the_first_step(leak, steps), in_other) if holds_activations else 0
        in_other -= warm_up
        leaked_at_peak += at_peak - min(at_peak, warm_up)
        leaked_at_end += at_end - min(at_end, warm_up)
        holder = leak.holder
        held_by = f", held by {holder['kind']} `{holder['name']}`" if holder else ""
        if holds_activations:
            counted = f"it held {fmt_bytes(at_peak)} when the peak's step began, counted as activations there"
            if min(at_peak, warm_up):
                counted += (
                    f" (but {fmt_bytes(min(at_peak, warm_up))} from the first step, as other: that step is "
                    "the breakdown's warm-up)"
                )
            counted += "; the estimates below are of the run with the leak fixed"
        else:
            counted = "its bytes are parameters, gradients and optimizer state, not activations"
        first.append(
            Advice(
                "fix_leak",
                at_peak,
                f"fix the leak at {leak.where()}: +{fmt_bytes(leak.bytes_per_step)} per step "
                f"({fmt_bytes(leak.retained_bytes)} in {leak.retained_tensors} tensors since step {leak.first_step}"
                f"{held_by}); {counted}",
                leak.hint or "look for references kept across steps (lists, dicts, attributes, closures)",
            )
        )
    act = max(0, act - leaked_at_peak)
    # What scales with the batch at the peak: the activations, and the
    # temporaries, unless the peak came after the step's last backward: the
    # temporaries there are the optimizer's, as large as the parameters.
    varying = act + (0 if after_backward else tmp)
    leak_note = f" (less {fmt_bytes(leaked_at_peak)} the leaks held)" if leaked_at_peak else ""
    if after_backward:
        scales = (
            f"the peak came in the optimizer's step: activations {fmt_bytes(act)}{leak_note} still live there "
            f"scale with the batch, the optimizer's temporaries ({fmt_bytes(tmp)}) do not"
        )
    else:
        scales = (
            f"activations {fmt_bytes(act)}{leak_note} and temporaries {fmt_bytes(tmp)} at the peak scale with the batch"
        )
    out: list[Advice] = []
    half = varying // 2  # what half the batch saves at the peak (bytes)
    fit_note = "; the largest batch that fits a budget: python -m memalloc run --fit BUDGET"
    if plan is not None and plan.per_sample_bytes > 0:
        # the planner's figure: its probes' peaks grow by per_sample_bytes per sample
        half = plan.per_sample_bytes * (plan.batch - plan.batch // 2)
        scales = (
            f"the planner's probes: the peak grows {fmt_bytes(plan.per_sample_bytes)} per sample; "
            f"batch {plan.batch} -> {plan.batch // 2}"
        )
        fit_note = ""
    if varying > 0 or half > 0:
        out.append(Advice("half_batch", half, scales, "half the samples per step" + fit_note))
        out.append(
            Advice(
                "grad_accumulation",
                max(0, half - max(0, params - grads)),
                "half the activations per micro-batch; every gradient is live in the second one",
                "the same samples per optimizer step; two forward/backward passes each",
            )
        )
        if gpus >= 2:
            out.append(
                Advice(
                    "ddp",
                    max(0, half - params),
                    "each of 2 GPUs trains half the batch; DDP adds gradient buckets the size of the "
                    "trainable parameters",
                    "a second GPU",
                )
            )
    ckpt = mixed = None
    # Checkpointing drops what autograd saves for backward, which is gone by
    # the optimizer's step: a peak there is not lowered by it.
    if profile is not None and profile.blocks and not after_backward:
        kept = sum(k for _, k, _ in profile.blocks)
        inputs = worst = 0
        for _, k, i in profile.blocks:  # block b recomputed: the inputs of blocks 1..b and what b keeps
            inputs += i
            worst = max(worst, inputs + k)
        # The recomputation happens in backward: gradients live at a forward
        # peak that were freed before the backward began (zero_grad between
        # forward and backward, as Lightning's closure does) are not there.
        freed = 0
        if phase == "forward" and profile.grads_at_backward is not None:
            freed = max(0, grads - profile.grads_at_backward)
        ckpt = max(0, kept - max(inputs, worst - freed))
        freed_note = (
            f", less {fmt_bytes(freed)} of gradients the peak held that were freed before the backward" if freed else ""
        )
        out.append(
            Advice(
                "checkpointing",
                ckpt,
                f"{len(profile.blocks)} repeated blocks keep {fmt_bytes(kept)} in the forward; "
                f"checkpointed, they keep their inputs ({fmt_bytes(inputs)}), {fmt_bytes(worst)} at "
                f"the worst moment of the backward's recomputation{freed_note}",
                "each block's forward runs twice (the guide: 20-30% more time)",
            )
        )
    if varying > 0:
        if after_backward:
            # the loop's own tensors (outputs, the loss) live past the backward, made in half precision
            mixed = act // 2
            why = (
                f"the activations live in the optimizer's step ({fmt_bytes(act)}: outputs and the loss the loop "
                "keeps) are made in half precision; autocast's weight copies are gone by then"
            )
        else:
            # The temporaries at a forward peak are the loss's (log_softmax, cross_entropy,
            # mse_loss: autocast runs them in fp32); at a backward peak they are gradients of
            # half-precision matmuls and convolutions, made in half precision (peak unknown: as those).
            if phase == "forward":
                t_half, t_why = 0, f"the temporaries ({fmt_bytes(tmp)}: the loss, run in fp32) stay fp32"
            else:
                t_half, t_why = tmp // 2, f"the temporaries ({fmt_bytes(tmp)}) are made in half precision"
            if profile is not None:
                # the loss casts the model's half output back to fp32: what the last module keeps saves nothing
                output = profile.output_bytes or 0
                mixed = max(0, (profile.leaf_bytes - output) // 2 + t_half - profile.cast_weight_bytes // 2)
                why = (
                    f"leaf modules keep {fmt_bytes(profile.leaf_bytes)}, half of it in half precision but for "
                    f"the model's output ({fmt_bytes(output)}), which the loss casts back to fp32; "
                    f"{fmt_bytes(profile.parent_bytes)} made by parent modules stays fp32; {t_why}; autocast "
                    f"adds half copies of {fmt_bytes(profile.cast_weight_bytes)} of weights"
                )
            else:
                mixed = max(0, act // 2 + t_half - params // 2)
                why = f"activations in half precision; {t_why}; autocast adds half copies of the weights"
        out.append(Advice("bf16_autocast", mixed, why, "none on GPUs with bf16 (Ampere and later): faster"))
        out.append(Advice("fp16_grad_scaler", mixed, why, "a GradScaler against fp16 underflow"))
        if ckpt is not None:
            left = 1.0 - (ckpt / varying)
            both = int(varying * (1.0 - max(0.0, left) * (1.0 - mixed / varying)))
            out.append(
                Advice(
                    "checkpointing_bf16",
                    both,
                    "checkpointing, then autocast on what is left",
                    "the recomputation of checkpointing",
                )
            )
    if reserved_after is not None:
        stays = b["parameters"] + b["optimizer_state"] + b["other"] + leaked_at_end
        what = "parameters, optimizer state and other" + (" and the leaks" if leaked_at_end else "")
        if held_between_steps is not None and held_between_steps >= stays:
            stays, what = held_between_steps, "what the run held allocated at the last step boundary"
        kept_reserved = profile.kept_reserved if profile is not None else None
        if kept_reserved is not None and kept_reserved >= stays:
            held = f"the {fmt_bytes(held_between_steps)} " if held_between_steps is not None else "what "
            what = f"the segments and pages that hold {held}the run kept allocated at the last step boundary"
            stays = kept_reserved
        out.append(
            Advice(
                "del_empty_cache",
                max(0, reserved_after - stays),
                f"between steps only {what} ({fmt_bytes(stays)}) must stay reserved, not {fmt_bytes(reserved_after)}",
                "the peak is unchanged; every step allocates its memory from the device again",
            )
        )
    if b["optimizer_state"] > varying:
        out.append(
            Advice(
                "optimizer_state",
                b["optimizer_state"] * 3 // 4,
                f"optimizer state ({fmt_bytes(b['optimizer_state'])}) is more than the activations",
                "an 8-bit optimizer (3/4 of it) or one sharded over GPUs (FSDP/ZeRO); not measured",
            )
        )
    return first + sorted((a for a in out if a.saves > 0), key=lambda a: -a.saves)


def to_text(advice: list[Advice], breakdown: MemoryBreakdown) -> str:
    """The advice as lines, in :func:`advise`'s order: the leaks first ("fix
    the leak at file:line: +X per step"), then largest saving first
    (memalloc/reporters/advice.py renders it)."""
    return advice_text([a.to_dict() for a in advice], breakdown.peak_total, breakdown.largest())
