"""A plain DDP training script that records environment variables: ``--env NAME``
(repeatable) are written to ``<out>/rank_<RANK>.json``, then ``--steps`` optimizer steps
(gloo). It never imports rankguard.

``--pid-dir DIR``: each rank first starts a child of its own (a 300 s sleep, as a script
starts a helper; this interpreter, not ``sleep`` from ``PATH``) and writes its pid to
``DIR/child_<rank>``, and leaves it running when it exits. ``--listeners FILE``: once the
process group is up, rank 0 writes every listening TCP socket of the job (the launcher
and all its descendants) to FILE."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--env", action="append", default=[])
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--pid-dir", default=None)
parser.add_argument("--listeners", default=None)
args = parser.parse_args()

rank = int(os.environ["RANK"])
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
tmp = out / f".rank_{rank}.json"
tmp.write_text(json.dumps({name: os.environ.get(name) for name in args.env}))
tmp.replace(out / f"rank_{rank}.json")

dist.init_process_group("gloo")
if args.listeners:
    from listeners import listeners  # beside this script

    dist.barrier()
    if rank == 0:
        Path(args.listeners).write_text(json.dumps(listeners(os.getppid())))
    dist.barrier()
if args.pid_dir:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pid_tmp = Path(args.pid_dir) / f".child_{rank}"
    pid_tmp.write_text(str(child.pid))
    pid_tmp.rename(Path(args.pid_dir) / f"child_{rank}")
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
