"""memalloc's figures in the HF Trainer's logs::

    import memalloc
    from memalloc.integrations.transformers import MemoryCallback

    memalloc.enable()  # first (the host backend: enable(backend="host") and host.use_for_cpu_tensors())
    trainer = Trainer(model, args, train_dataset=..., callbacks=[MemoryCallback()])

At every log of the Trainer (``logging_steps``) the figures of
memalloc/integrations/_monitor.py (``memalloc/allocated_bytes``, the peaks,
``memalloc/breakdown/<category>_bytes``, ``memalloc/leak_bytes_per_step``)
are added to the ``logs`` dict the Trainer hands its callbacks, and to its
entry of ``state.log_history`` (so trainer_state.json keeps them). The
Trainer calls its callbacks in order and puts the ``report_to`` ones
(TensorBoard, W&B, ...) before the user's, so at ``on_train_begin`` the
callback moves itself just after ``DefaultFlowCallback`` in the Trainer's
callback list (found once with ``gc.get_referrers``): the loggers then
receive the figures with the loss. At the end of ``train`` each leak found
is warned once on the main process (its line and bytes per step) and the
leak report is written to ``args.output_dir``/memalloc-leaks.json; an
out-of-memory error during ``train`` writes its report to ``args.output_dir``.
One step per optimizer step (``on_step_end``; gradient accumulation's
micro-batches are inside it).
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import DefaultFlowCallback

from memalloc.integrations._monitor import Monitor


class MemoryCallback(TrainerCallback):
    """Adds memalloc's figures to the Trainer's logs; reports leaks at the
    end of training; puts OOM reports and the run page (``index.html``) in
    ``args.output_dir``.

    Args as :class:`memalloc.integrations.lightning.MemoryMonitor`
    (``leaks``, ``leak_window``, ``warmup_steps``, ``oom_reports``).
    RuntimeError when memalloc is not enabled (memalloc.enable() must come
    before the first CUDA tensor, so the callback cannot do it for you).
    """

    def __init__(
        self, *, leaks: bool = True, leak_window: int = 100, warmup_steps: int = 1, oom_reports: bool = True
    ) -> None:
        self.monitor = Monitor(
            "MemoryCallback", leaks=leaks, leak_window=leak_window, warmup_steps=warmup_steps, oom_reports=oom_reports
        )

    @property
    def leak_report(self) -> Any:
        """The last train's :class:`memalloc.leaks.LeakReport` (None before the end of a train)."""
        return self.monitor.report

    def _move_ahead(self) -> bool:
        """Moves this callback just after DefaultFlowCallback in the list
        that holds it with one (the Trainer's callback handler's)."""
        for holder in gc.get_referrers(self):
            if isinstance(holder, list) and any(isinstance(cb, DefaultFlowCallback) for cb in holder):
                holder.remove(self)
                at = next((i for i, cb in enumerate(holder) if not isinstance(cb, DefaultFlowCallback)), len(holder))
                holder.insert(at, self)
                return True
        return False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._move_ahead()
        self.monitor.start(args.output_dir, write=state.is_world_process_zero)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.monitor.batch_start()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.monitor.batch_end()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict | None = None,
        **kwargs: Any,
    ) -> None:
        if logs is None or not self.monitor.running:
            return
        metrics = self.monitor.metrics()
        logs.update(metrics)
        history = state.log_history
        if metrics and history and history[-1].get("step") == state.global_step:
            history[-1].update(metrics)  # the entry Trainer.log appended for these logs

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        lines = self.monitor.finish()
        if state.is_world_process_zero:
            for line in lines:
                warnings.warn(line, stacklevel=2)
