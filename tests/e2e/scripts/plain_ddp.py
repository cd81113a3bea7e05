"""An unmodified torchrun-style training script: it never imports rankguard."""

import argparse
import atexit
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--atexit-dir", default=None, help="each rank's exit handler writes here")
args = parser.parse_args()
if args.atexit_dir:
    marker = os.path.join(args.atexit_dir, f"atexit_rank_{os.environ['RANK']}")
    atexit.register(lambda: open(marker, "w").close())

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
if dist.get_rank() == 0:
    print(
        f"plain_ddp done: {args.steps} steps, world {dist.get_world_size()}, "
        f"local_rank {os.environ['LOCAL_RANK']}",
        flush=True,
    )
dist.destroy_process_group()
