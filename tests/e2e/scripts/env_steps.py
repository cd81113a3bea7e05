"""A plain DDP training script that records environment variables: ``--env NAME``
(repeatable) are written to ``<out>/rank_<RANK>.json``, then ``--steps`` optimizer steps
(gloo). It never imports rankguard."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--env", action="append", default=[])
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

rank = int(os.environ["RANK"])
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
tmp = out / f".rank_{rank}.json"
tmp.write_text(json.dumps({name: os.environ.get(name) for name in args.env}))
tmp.replace(out / f"rank_{rank}.json")

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
