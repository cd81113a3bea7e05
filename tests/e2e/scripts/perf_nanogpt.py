"""A nanoGPT-style training script that never calls rankguard for performance: no
set_batch, no FLOPs. DDP on gloo, gradient accumulation, a GPTConfig on the model.

``--rankguard-init`` calls ``rankguard.init()`` (what a script does to get the in-rank
parts under plain torchrun); ``--no-config`` drops ``model.config`` (FLOPs then measured).
"""

import argparse
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--rankguard-init", action="store_true")
parser.add_argument("--no-config", action="store_true")
args = parser.parse_args()

if args.rankguard_init:
    import rankguard

    rankguard.init()


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


dist.init_process_group("gloo")
torch.manual_seed(0)
cfg = GPTConfig()
raw = GPT(cfg)
if args.no_config:
    del raw.config
model = DDP(raw)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(args.steps):
    for micro in range(args.accum):
        x = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.block_size))
        model.require_backward_grad_sync = micro == args.accum - 1
        _, loss = model(x, x)
        (loss / args.accum).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
assert math.isfinite(loss.item())
dist.barrier()
if dist.get_rank() == 0:
    print(f"perf_nanogpt done: {args.steps} steps", flush=True)
dist.destroy_process_group()
