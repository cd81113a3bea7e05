"""A nanoGPT-style training script, unmodified for rankguard (it never imports it).

As in nanoGPT's train.py: a plain loop, DDP, the master process alone evaluates with
``estimate_loss()`` under ``torch.no_grad()`` and saves ``ckpt.pt`` with ``torch.save``
while the other ranks go on to the next step and wait in its all-reduce. The slow parts
stand in for a big validation set (``--eval-sleep`` per evaluation) and a slow disk
(``--save-sleep`` spread over the checkpoint's writes).
"""

import argparse
import io
import os
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--max-iters", type=int, default=20)
parser.add_argument("--eval-interval", type=int, default=10)
parser.add_argument("--eval-iters", type=int, default=4)
parser.add_argument("--eval-sleep", type=float, default=0.0)
# nanoGPT's own train.py evaluates at iteration 0 too, before the first step
parser.add_argument("--eval-at-start", action="store_true")
parser.add_argument("--save-sleep", type=float, default=0.0)
parser.add_argument("--out-dir", default="out")
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--batch-size", type=int, default=4)
args = parser.parse_args()

dist.init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
master_process = ddp_rank == 0
torch.manual_seed(1337 + ddp_rank)
vocab_size = 64


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, 32)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU())
        self.lm_head = torch.nn.Linear(64, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.mlp(self.wte(idx)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_batch(split):
    data = torch.randint(vocab_size, (args.batch_size, args.block_size + 1))
    if split == "val":
        time.sleep(args.eval_sleep / args.eval_iters)  # a big validation set
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


model = TinyLM()
raw_model = model
model = DDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            _, loss = raw_model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


class SlowDisk(io.FileIO):
    """A busy network filesystem: the first writes take ``--save-sleep`` in all."""

    budget = 0.0

    def write(self, b):
        pause = min(self.budget, args.save_sleep / 4)
        self.budget -= pause
        time.sleep(pause)
        return super().write(b)


iter_num = 0
X, Y = get_batch("train")
while True:
    if iter_num % args.eval_interval == 0 and master_process and (iter_num or args.eval_at_start):
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if iter_num % args.eval_interval == 0 and master_process and iter_num > 0:
        checkpoint = {
            "model": raw_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iter_num": iter_num,
        }
        os.makedirs(args.out_dir, exist_ok=True)
        print(f"saving checkpoint to {args.out_dir}", flush=True)
        with SlowDisk(os.path.join(args.out_dir, "ckpt.pt"), "w") as fh:
            fh.budget = args.save_sleep
            torch.save(checkpoint, fh)
    logits, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > args.max_iters:
        break

dist.barrier()
if master_process:
    print(f"nanogpt_style done: {iter_num} iterations", flush=True)
dist.destroy_process_group()
