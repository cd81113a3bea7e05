"""A gloo training loop whose ranks crash at ``--crash-step`` on the agents started with
``CRASH_HERE=1`` (one "node" of a loopback job), in every attempt, after that many steps.
SGD's update written out, not a ``torch.optim`` optimizer, and each step told with
``rg.step`` (what the optimizer's hook would have counted): a rank does not import
``torch._dynamo`` (about 2 s of CPU per rank start on a loaded machine; the exclusion
job starts five ranks)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

import rankguard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--crash-step", type=int, default=3)
parser.add_argument("--step-sleep", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gloo")
rg = rankguard.init()
model = torch.nn.Linear(8, 1)
for step in range(args.steps):
    if os.environ.get("CRASH_HERE") == "1" and step == args.crash_step:
        raise RuntimeError(f"crash_here: rank {dist.get_rank()} crashes at step {step}")
    with rg.step(step + 1):  # the count of steps done, as the optimizer's hook counts
        loss = model(torch.randn(4, 8)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.add_(p.grad, alpha=-0.01)  # SGD's step
    time.sleep(args.step_sleep)
dist.barrier()
if dist.get_rank() == 0:
    print(f"crash_here done: {args.steps} steps, world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
