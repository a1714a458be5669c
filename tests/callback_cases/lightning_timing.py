"""Step time of a Lightning run with and without memalloc's MemoryMonitor
(tests/gpu/test_cuda_callback_cost.py). Arguments: OUT (the logger's root),
WITH (1: MemoryMonitor in the callbacks; 0: not), STEPS, DEVICE (host |
cuda) [VARIANT, below]. Both modes run under memalloc.enable(), so the
difference is the callback's alone (its trackers, its step boundaries, the
flight recorder and run page it adds). With ``parts``, the callback's own
pieces are timed too (the median milliseconds of each per call), so a cost
that fails its bound names where it goes. A transformer encoder in bf16 autocast with AdamW; a
callback of the script's own times each step, from one batch's start to the
next's (device synchronised there). Prints RESULT <json>: the steps' seconds; the allocator's device
allocations, frees and all-stream synchronisations over the run; with
``parts``, each piece's median per call."""

import collections
import json
import statistics
import sys
import time

import case_common

OUT, WITH, STEPS, DEVICE = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
# The optional fifth argument: "parts" (time the monitor's pieces), or one
# piece of the monitor to run alone for a cost that must be split up
# (benchmarks/device/steps.sh callbackparts): "noend" (the monitor without
# its batch-end work), "trackers" (its StepTracker and LeakTracker, no
# callback), "flight" (its flight recorder alone), "steps" (memalloc.step()
# at each batch's end alone).
VARIANT = sys.argv[5] if len(sys.argv) > 5 else ""
assert VARIANT in ("", "parts", "noend", "trackers", "flight", "steps"), VARIANT
PARTS = VARIANT == "parts"
queries = case_common.enable(DEVICE)

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import memalloc  # noqa: E402
from memalloc.features import flight, leaks, tracker  # noqa: E402
from memalloc.integrations import _monitor  # noqa: E402
from memalloc.integrations.lightning import MemoryMonitor  # noqa: E402

part_times: dict[str, list[float]] = collections.defaultdict(list)


def timed(owner, name: str, label: str) -> None:
    """Wraps owner.name so each call's seconds go to part_times[label]."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            part_times[label].append(time.perf_counter() - t)

    setattr(owner, name, wrapper)


extra: list = []  # the variant's own callback
if VARIANT == "noend":
    MemoryMonitor.on_train_batch_end = lambda *args, **kwargs: None  # type: ignore[method-assign]
elif VARIANT == "trackers":
    trackers = (tracker.StepTracker().start(), leaks.LeakTracker().start())
elif VARIANT == "flight":
    flight.start(f"{OUT}/flight-alone")
elif VARIANT == "steps":

    class Stepper(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            memalloc.step()

    extra.append(Stepper())
if PARTS:
    for owner, name in (
        (MemoryMonitor, "on_train_batch_end"),
        (_monitor.Monitor, "batch_end"),
        (_monitor.Monitor, "metrics"),
        (flight.FlightRecorder, "heartbeat"),
        (leaks.LeakTracker, "sample"),
        (leaks.LeakTracker, "report"),
        (tracker.StepTracker, "_on_step"),
    ):
        timed(owner, name, f"{getattr(owner, '__name__', owner)}.{name}")

WIDTH, LAYERS, BATCH, LENGTH = (1024, 8, 16, 512) if DEVICE == "cuda" else (64, 2, 4, 32)


class Timer(L.Callback):
    """A step's time: from its batch's start to the next batch's start (the
    device synchronised at each), so every callback's work at the step's end,
    MemoryMonitor's included, is inside it whatever the callbacks' order."""

    def __init__(self):
        self.times, self._t = [], None

    def _mark(self):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._t is not None:
            self.times.append(now - self._t)
        self._t = now

    def on_train_batch_start(self, trainer, module, batch, i):
        self._mark()

    def on_train_end(self, trainer, module):
        self._mark()


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 16 if DEVICE == "cuda" else 4, 4 * WIDTH, batch_first=True)
        self.net = torch.nn.TransformerEncoder(layer, LAYERS)

    def training_step(self, batch, i):
        (x,) = batch
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.net(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


torch.manual_seed(0)
timer = Timer()
trainer = L.Trainer(
    max_steps=STEPS,
    accelerator="gpu" if DEVICE == "cuda" else "cpu",
    devices=1,
    logger=CSVLogger(OUT),
    log_every_n_steps=1,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[timer, *([MemoryMonitor()] if WITH else []), *extra],
)
data = torch.utils.data.TensorDataset(torch.randn(BATCH * STEPS, LENGTH, WIDTH))
trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=BATCH))
stats = queries.memory_stats()
result = {
    "times": timer.times,
    "counters": {k: stats.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_sync_all_streams")},
}
if PARTS:
    result["parts_ms"] = {k: [len(v), round(statistics.median(v) * 1e3, 4)] for k, v in part_times.items()}
print("RESULT", json.dumps(result))
