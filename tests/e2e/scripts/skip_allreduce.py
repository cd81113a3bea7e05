"""A training loop whose rank 1 (``--skip-rank``) skips one all-reduce (then waits): the
other ranks block in it."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--skip-step", type=int, default=6)
parser.add_argument("--skip-rank", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, args.steps + 1):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if rank == args.skip_rank and step == args.skip_step:
        time.sleep(600)  # never joins this step's all-reduce
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    time.sleep(0.05)
dist.destroy_process_group()
