"""A gloo training loop whose ranks crash at ``--crash-step`` on the agents started with
``CRASH_HERE=1`` (one "node" of a loopback job), in every attempt."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--crash-step", type=int, default=3)
parser.add_argument("--step-sleep", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gloo")
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    if os.environ.get("CRASH_HERE") == "1" and step == args.crash_step:
        raise RuntimeError(f"crash_here: rank {dist.get_rank()} crashes at step {step}")
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    time.sleep(args.step_sleep)
dist.barrier()
if dist.get_rank() == 0:
    print(f"crash_here done: {args.steps} steps, world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
