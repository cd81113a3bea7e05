"""A plain training loop of ``--steps`` optimizer steps of ``--step-ms`` each, one
rank or several, no process group: what a run that is stopped half-way looks like."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step-ms", type=float, default=20.0)
args = parser.parse_args()

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    model(torch.randn(4, 8)).sum().backward()
    time.sleep(args.step_ms / 1e3)
    opt.step()
    opt.zero_grad()
print(f"steady_steps done: {args.steps} steps", flush=True)
