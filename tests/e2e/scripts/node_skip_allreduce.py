"""``skip_allreduce.py``'s loop for the multi-node job: rank ``--skip-rank`` skips one
all-reduce (then waits), the other ranks block in it. SGD's update written out, not a
``torch.optim`` optimizer, and each step told with ``rg.step`` (what the optimizer's
hook would have counted): a rank does not import ``torch._dynamo`` (about 2 s of CPU per
rank start on a loaded machine; the job starts four ranks)."""

import argparse
import time

import torch
import torch.distributed as dist

import rankguard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--skip-step", type=int, default=6)
parser.add_argument("--skip-rank", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("gloo")
rg = rankguard.init()
rank = dist.get_rank()
model = torch.nn.Linear(16, 1)
for step in range(1, args.steps + 1):
    with rg.step(step):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        if rank == args.skip_rank and step == args.skip_step:
            time.sleep(600)  # never joins this step's all-reduce
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.add_(p.grad, alpha=-0.01)  # SGD's step
    time.sleep(0.05)
dist.destroy_process_group()
