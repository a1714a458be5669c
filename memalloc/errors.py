"""Every exception of memalloc's own, in one place.

Each is a subclass of the builtin exception a caller would catch for it
(``ValueError``, ``RuntimeError``, ``AssertionError``), so code written for
torch's errors keeps catching them:

- ``MemallocError`` (a ``RuntimeError``): the allocator's state refuses a
  call; ``DriverError`` is one of its kinds.
- ``InvalidArgumentError`` (a ``ValueError``): an argument torch would
  refuse too, or a config key or value memalloc does not know; the message
  names the argument and what it accepts.
- ``InvalidPointerError`` (a ``ValueError``): a pointer freed or queried that this allocator did
  not hand out (or already took back).
- ``DriverError`` (a ``MemallocError``): the device driver (or the host backend's simulation of
  it) failed a call; the message names the call and the driver's error.
- ``PlannerError`` (a ``ValueError``): :func:`memalloc.largest_batch` cannot
  answer (a probe did not fit, the recording lost events, a bad budget).
- ``LeakError`` (an ``AssertionError``): a :func:`memalloc.leak_check` block
  leaked more than allowed; its ``report`` says where.

torch's own out-of-memory error stays ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

from memalloc._C import DriverError, InvalidArgumentError, InvalidPointerError, MemallocError
from memalloc.features.planner import PlannerError
from memalloc.reporters.leak_report import LeakError

__all__ = [
    "DriverError",
    "InvalidArgumentError",
    "InvalidPointerError",
    "LeakError",
    "MemallocError",
    "PlannerError",
]
