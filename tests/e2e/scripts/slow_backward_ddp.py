"""An unmodified DDP script (it never imports rankguard) whose ``--slow-rank`` spends
``--slowdown`` times as long in backward as the others: a backward hook of the first
layer sleeps ``--backward-ms`` on every rank, times the slowdown on the slow one."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=20.0)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slowdown", type=float, default=1.5)
parser.add_argument("--backward-ms", type=float, default=40.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
pause = args.backward_ms / 1000 * (args.slowdown if rank == args.slow_rank else 1.0)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
net[0].register_full_backward_hook(lambda *_: time.sleep(pause))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.monotonic() + args.seconds
steps = 0
while True:
    done = torch.tensor([float(time.monotonic() > end)])
    dist.all_reduce(done)  # every rank stops at the same step
    if done.item():
        break
    loss = model(torch.randn(8, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
dist.barrier()
if rank == 0:
    print(f"slow_backward_ddp done: {steps} steps", flush=True)
dist.destroy_process_group()
