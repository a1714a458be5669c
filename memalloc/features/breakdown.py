"""Where the memory goes: live bytes by category, now and at the step's peak.

:func:`memory_breakdown` answers what torch.profiler's memory timeline
answers (parameters, gradients, optimizer state, activations, temporaries,
other) from the allocator's own counters, with no profiler and no code
beyond :func:`memalloc.enable`: the allocator stamps each block with the
training phase it was allocated in and decides its category at the
landmark where its fate is known (csrc/profiler/breakdown.h, memalloc/features/phases.py):

==================  =========================================================
``parameters``      storages of ``nn.Parameter`` s (and of optimizers' params)
``gradients``       made by ``backward()``, still live when ``optimizer.step()``
                    starts or the step ends
``optimizer_state`` made by ``optimizer.step()``, live after the step
``activations``     made after the step began, still live when ``backward()``
                    starts: what autograd saved, the loss, the batch
``temporaries``     made during a step and freed before its landmark
                    (workspaces, intermediate results)
``other``           made before training (buffers, data kept on the device),
                    or kept past a step without a backward using it; and the
                    allocator's rounding (below)
==================  =========================================================

A block counts in its category with the bytes that were asked for (a
tensor's storage bytes), so a category holds what its tensors hold; the
rest of the block, the allocator's rounding (sizes rounded up to 512 B or
to a power-of-two division, a cached block handed out whole because too
little of it would be left to split), counts as ``other``. The categories
add up to the allocated bytes.

Before the first step: what setup allocates (the model, the data, an
evaluation under ``torch.no_grad()``) is ``other``; the first forward of a
module with trainable parameters under grad begins the first step, so a
first-step out-of-memory report splits its forward into activations and
temporaries like any step's. What the first forward made and still holds
when the first step ends (a library's workspace made on first use, as
cuBLAS's on a GPU) is ``other`` from then on, at that step's peak too.
"""

from __future__ import annotations

import dataclasses

from memalloc import _C
from memalloc.core import _state
from memalloc.core._device import DeviceLike, device_index
from memalloc.core._format import fmt_bytes
from memalloc.features import phases
from memalloc.reporters import advice, notebook

CATEGORIES: tuple[str, ...] = phases.CATEGORIES


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Live bytes by category on one device (all values in bytes).

    ``now``: what is live now; a block whose fate is not known yet counts
    under the category it gets if it survives (``now_provisional`` bytes of
    them: a forward block as ``activations``, a backward block as
    ``gradients``, an optimizer block as ``optimizer_state``).
    ``peak``: the split when allocated bytes peaked in the last finished step
    (``peak_step`` its number: memalloc.iteration.steps() at its boundary, or, where no
    boundaries are marked, how many steps the first optimizer has taken),
    fully resolved; before the first step ends,
    the peak so far (``peak_step`` None, ``peak_provisional`` bytes not yet
    resolved).
    """

    device: int
    phase: str
    now: dict[str, int]
    now_provisional: int
    peak: dict[str, int]
    peak_step: int | None
    peak_provisional: int

    @property
    def now_total(self) -> int:
        """Allocated bytes now (the sum of ``now``)."""
        return sum(self.now.values())

    @property
    def peak_total(self) -> int:
        """Allocated bytes at the peak (the sum of ``peak``)."""
        return sum(self.peak.values())

    def largest(self) -> str:
        """The category holding the most bytes at the peak."""
        return max(CATEGORIES, key=lambda c: self.peak[c])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"now_total": self.now_total, "peak_total": self.peak_total}

    @classmethod
    def from_dict(cls, d: dict) -> MemoryBreakdown:
        """The breakdown :meth:`to_dict` wrote (its totals are recomputed)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

    def to_text(self) -> str:
        """A table: one row per category, bytes and share now and at the
        peak (memalloc/reporters/advice.py renders it)."""
        return advice.breakdown_text(self.to_dict(), CATEGORIES)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        where = f"step {self.peak_step}'s peak" if self.peak_step is not None else "peak so far"
        big = self.largest()
        return (
            f"<memalloc MemoryBreakdown device {self.device}: {fmt_bytes(self.now_total)} allocated now, "
            f"{fmt_bytes(self.peak_total)} at {where} (largest: {big} {fmt_bytes(self.peak[big])})>"
        )

    def _repr_html_(self) -> str:
        """What Jupyter shows: the table as HTML (memalloc/reporters/notebook.py)."""
        return notebook.breakdown_html(self.to_dict(), CATEGORIES)


def memory_breakdown(device: DeviceLike = None, allocator: _C.Allocator | None = None) -> MemoryBreakdown:
    """Live bytes by category on ``device`` now and at the step's peak, from
    ``allocator`` (default: the installed one). Marks the storages of known
    parameters first (memalloc.phases.mark_parameters), so a model built
    or moved since the last step is counted as parameters."""
    a = _state.allocator_or_installed(allocator)
    index = device_index(device, a.backend_name)
    if phases.installed():
        phases.mark_parameters(a)
    raw = a.breakdown(index)
    last = raw["last"]
    peak = last if last is not None else raw["peak"]
    return MemoryBreakdown(
        device=index,
        phase=raw["phase"],
        now=dict(raw["now"]["split"]),
        now_provisional=sum(raw["now"]["unresolved"].values()),
        peak=dict(peak["split"]),
        peak_step=int(raw["last_step"]) if last is not None else None,
        peak_provisional=sum(peak["unresolved"].values()),
    )
