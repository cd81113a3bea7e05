"""A Hugging Face Trainer script, unmodified for rankguard (it never imports it).

A tiny GPT-2 built from a config (no download) on random tokens, evaluated and saved
every few steps. ``compute_metrics`` is slow (``--eval-sleep``: a metric computed with a
slow tool), and a callback copies each checkpoint to remote storage (``--save-sleep``).
"""

import argparse
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", required=True)
parser.add_argument("--max-steps", type=int, default=12)
parser.add_argument("--eval-steps", type=int, default=6)
parser.add_argument("--save-steps", type=int, default=6)
parser.add_argument("--eval-sleep", type=float, default=0.0)
parser.add_argument("--save-sleep", type=float, default=0.0)
args = parser.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int = 16, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def compute_metrics(eval_pred):
    time.sleep(args.eval_sleep)  # e.g. a slow external scorer
    return {"n": float(len(eval_pred.label_ids))}


class UploadCheckpoint(TrainerCallback):
    """Copies every saved checkpoint to remote storage (slow)."""

    def on_save(self, args_, state, control, **kwargs):
        time.sleep(args.save_sleep)


config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
model = GPT2LMHeadModel(config)
training_args = TrainingArguments(
    output_dir=args.output_dir,
    max_steps=args.max_steps,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    eval_strategy="steps",
    eval_steps=args.eval_steps,
    save_strategy="steps",
    save_steps=args.save_steps,
    logging_steps=args.eval_steps,
    report_to=[],
    use_cpu=True,
    ddp_backend="gloo",
    dataloader_num_workers=0,
    disable_tqdm=True,
)
trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=RandomTokens(256),
    eval_dataset=RandomTokens(16, seed=1),
    compute_metrics=compute_metrics,
    callbacks=[UploadCheckpoint()],
)
trainer.train()
if trainer.is_world_process_zero():
    print(f"hf_trainer done: {trainer.state.global_step} steps", flush=True)
