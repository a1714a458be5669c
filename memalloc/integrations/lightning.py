"""memalloc's figures in Lightning's loggers::

    import memalloc
    from memalloc.integrations.lightning import MemoryMonitor

    memalloc.enable()  # first (the host backend: enable(backend="host") and host.use_for_cpu_tensors())
    trainer = L.Trainer(callbacks=[MemoryMonitor()], logger=CSVLogger("logs"))

At every logging step (``Trainer(log_every_n_steps=...)``) the figures of
memalloc/integrations/_monitor.py (``memalloc/allocated_bytes``, the peaks,
``memalloc/breakdown/<category>_bytes``, ``memalloc/leak_bytes_per_step``)
go to every logger of the trainer (``logger.log_metrics``, as Lightning's
``DeviceStatsMonitor`` does: as ints, not as float32 tensors). At the end of
``fit`` each leak found is warned once on rank zero (its line and bytes per
step) and the leak report is written to ``trainer.log_dir``/memalloc-leaks.json;
an out-of-memory error during ``fit`` writes its report to ``trainer.log_dir``.
Works with automatic and manual optimization: the callback marks one step
per training batch (see _monitor.py). Imports ``lightning`` (not
``pytorch_lightning``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from memalloc.integrations._monitor import Monitor


def _should_log(trainer: Trainer) -> bool:
    # Lightning's rule for logging steps (log_every_n_steps), read as DeviceStatsMonitor reads it
    connector = getattr(trainer, "_logger_connector", None)
    if connector is not None and hasattr(connector, "should_update_logs"):
        return bool(connector.should_update_logs)
    n = trainer.log_every_n_steps
    return n > 0 and (trainer.fit_loop.epoch_loop._batches_that_stepped + 1) % n == 0


class MemoryMonitor(Callback):
    """Logs memalloc's figures through the trainer's loggers; reports leaks
    at the end of fit; puts OOM reports and the run page (``index.html``:
    steps, breakdown, the flame graph of the peak) in the trainer's log
    folder.

    Args:
        leaks: track leaks (a :class:`memalloc.LeakTracker`: one sample of
            the live blocks per step) and log ``memalloc/leak_bytes_per_step``.
        leak_window: steps the leak rules judge (the last ones).
        warmup_steps: steps of the window the leak rules skip.
        oom_reports: write out-of-memory reports to ``trainer.log_dir``.

    RuntimeError when memalloc is not enabled (memalloc.enable() must come
    before the first CUDA tensor, so the callback cannot do it for you).
    """

    def __init__(
        self, *, leaks: bool = True, leak_window: int = 100, warmup_steps: int = 1, oom_reports: bool = True
    ) -> None:
        super().__init__()
        self.monitor = Monitor(
            "MemoryMonitor", leaks=leaks, leak_window=leak_window, warmup_steps=warmup_steps, oom_reports=oom_reports
        )

    @property
    def leak_report(self) -> Any:
        """The last fit's :class:`memalloc.leaks.LeakReport` (None before the end of a fit)."""
        return self.monitor.report

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = trainer.log_dir  # a collective call: every rank asks
        self.monitor.start(folder, write=trainer.is_global_zero)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.monitor.batch_start()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.monitor.batch_end()
        if not trainer.loggers or not _should_log(trainer):
            return
        metrics = self.monitor.metrics()
        if metrics:
            step = trainer.fit_loop.epoch_loop._batches_that_stepped
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for line in self.monitor.finish():
            rank_zero_warn(line)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.monitor.abort()
