"""A plain DDP loop that never tells rankguard its step (the optimizer hook counts) but
saves and resumes through ``rankguard.checkpoint``: after a restart it goes on from the
checkpoint's step, and so must the iteration rankguard shows."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.checkpoint import CheckpointConfig, CheckpointManager

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--save-every", type=int, default=3)
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--step-sleep", type=float, default=0.15)
args = parser.parse_args()

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = CheckpointManager(
    CheckpointConfig(save=args.checkpoint_dir, save_interval=args.save_every),
    {"model": model, "optim": opt},
)
resumed = ckpt.load_latest() or 0
if rank == 0:
    print(f"[script] starting after step {resumed}", flush=True)
gen = torch.Generator().manual_seed(rank)
for step in range(resumed + 1, args.steps + 1):
    x = torch.randn(8, 16, generator=gen)
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    ckpt.maybe_save(step)
    time.sleep(args.step_sleep)
ckpt.close()
dist.barrier()
if rank == 0:
    print(f"[script] done at step {args.steps}", flush=True)
dist.destroy_process_group()
