"""HF Trainer (real-paths case): a 2-layer GPT-2 trained for STEPS
optimizer steps, two micro-batches accumulated per step; compute_loss keeps
one 64 KiB tensor per micro-batch in a list (the planted leak). First
argument: where truth.py writes what the script knows of itself; second:
the batch size per micro-batch (default 2)."""

import sys
import tempfile

import truth

truth.enable_if_asked()

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

STEPS = 6
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 2
kept = []


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class KeepingTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        kept.append(torch.ones(16384))  # LEAK-LINE
        return super().compute_loss(model, inputs, *args, **kwargs)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64))
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out,
        max_steps=STEPS,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = KeepingTrainer(model=model, args=args, train_dataset=Data())
    truth.start(kept)
    trainer.train()
truth.finish(model, trainer.optimizer, trainer.state.global_step, batch)
