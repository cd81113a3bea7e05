"""A nanoGPT-style training script that never calls rankguard for performance: no
set_batch, no FLOPs. DDP on gloo, gradient accumulation, a GPTConfig on the model.

``--rankguard-init`` calls ``rankguard.init()`` (what a script does to get the in-rank
parts under plain torchrun); ``--no-config`` drops ``model.config`` (FLOPs then measured);
``--atexit-dir``: each rank's exit handler writes a file there.
"""

import argparse
import atexit
import math
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.demo.model import GPT, NanoGPTConfig  # nanoGPT's model, as written there

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--rankguard-init", action="store_true")
parser.add_argument("--no-config", action="store_true")
parser.add_argument("--atexit-dir", default=None, help="each rank's exit handler writes here")
args = parser.parse_args()
if args.atexit_dir:
    marker = os.path.join(args.atexit_dir, f"atexit_rank_{os.environ['RANK']}")
    atexit.register(lambda: open(marker, "w").close())

if args.rankguard_init:
    import rankguard

    rankguard.init()


dist.init_process_group("gloo")
torch.manual_seed(0)
cfg = NanoGPTConfig()
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
