"""A Hugging Face Trainer script with rankguard's one line (the callback): a tiny GPT-2
built from a config, random tokens, an evaluation and a save that takes ``--save-s``."""

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from rankguard.integrations.hf import RankguardCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--save-s", type=float, default=0.0)
parser.add_argument("--eval-s", type=float, default=0.0)
args = parser.parse_args()

SEQ, VOCAB = 16, 64


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, delay_s=0.0):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))
        self.delay_s = delay_s

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        time.sleep(self.delay_s)  # a slow evaluation set
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SlowSaveTrainer(Trainer):
    def save_model(self, *a, **kw):
        time.sleep(args.save_s)  # a large model's checkpoint
        super().save_model(*a, **kw)


torch.manual_seed(0)
config = GPT2Config(
    n_layer=2,
    n_embd=32,
    n_head=2,
    vocab_size=VOCAB,
    n_positions=SEQ,
    bos_token_id=0,
    eos_token_id=0,
)
trainer = SlowSaveTrainer(
    model=GPT2LMHeadModel(config),
    args=TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=args.steps,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=6,
        save_strategy="steps",
        save_steps=8,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
    ),
    train_dataset=Tokens(512),
    eval_dataset=Tokens(8, delay_s=args.eval_s / 8),
    callbacks=[RankguardCallback()],
)
trainer.train()
logged = [h for h in trainer.state.log_history if "rankguard/tokens_per_sec" in h]
if trainer.is_world_process_zero():
    print(f"hf_trainer_callback done: logged {logged[-1] if logged else None}", flush=True)
