"""HF Trainer with memalloc's MemoryCallback (tests/integration/test_callbacks.py,
tests/gpu/test_cuda_callbacks.py). Arguments: OUT (output_dir), REPORT (none |
tensorboard: report_to), WHAT (clean | leak), DEVICE (host | cuda). The test's
Truth callback, after MemoryCallback (which moves itself just after
DefaultFlowCallback), reads the queries at each step's end, sums the
optimizer's state tensors and resets the peaks; Capture keeps every logs
dict the callbacks see. Prints RESULT <json>."""

import json
import sys
import warnings

import case_common

OUT, REPORT, WHAT, DEVICE = sys.argv[1:5]
Q = case_common.enable(DEVICE)  # the queries the figures must equal

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from memalloc.integrations.transformers import MemoryCallback  # noqa: E402

STEPS = 12
kept = []


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(64, generator=g), "labels": torch.randn(16, generator=g)}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))

    def forward(self, x, labels):
        loss = torch.nn.functional.mse_loss(self.net(x), labels)
        if WHAT == "leak":
            kept.append(loss)  # LEAK-LINE
        return {"loss": loss}


class Truth(TrainerCallback):
    def __init__(self):
        self.rows = {}

    def on_train_begin(self, args, state, control, **kw):
        Q.reset_peak_memory_stats()

    def on_step_end(self, args, state, control, optimizer=None, **kw):
        self.rows[state.global_step] = {
            "allocated": Q.memory_allocated(),
            "reserved": Q.memory_reserved(),
            "peak_allocated": Q.max_memory_allocated(),
            "peak_reserved": Q.max_memory_reserved(),
            "optimizer_state": case_common.optimizer_state_bytes(optimizer, DEVICE),
        }
        Q.reset_peak_memory_stats()


class Capture(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append({"step": state.global_step, **logs})


torch.manual_seed(0)
truth, capture, callback = Truth(), Capture(), MemoryCallback()
args = TrainingArguments(
    output_dir=OUT,
    max_steps=STEPS,
    per_device_train_batch_size=32,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[] if REPORT == "none" else [REPORT],
    use_cpu=DEVICE != "cuda",
    dataloader_num_workers=0,
    disable_tqdm=True,
    seed=0,
)
trainer = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[truth, capture, callback])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trainer.train()
R = {
    "truth": truth.rows,
    "logs": capture.logs,
    "history": trainer.state.log_history,
    "order": [type(cb).__name__ for cb in trainer.callback_handler.callbacks],
    "warnings": [str(w.message) for w in caught if "memalloc" in str(w.message)],
    "lines": case_common.tagged_lines(__file__, ("# LEAK-LINE",)),
}
print("RESULT", json.dumps(R))
