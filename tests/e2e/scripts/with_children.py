"""Each rank starts a child of its own (a 300 s sleep, as a script starts a helper) and
writes its pid to ``<pid dir>/child_<rank>``, then: ``--end normal`` trains a few steps
and exits 0; ``--end crash`` has rank 1 raise after them, through torch elastic's usual
entry point (``@record``: the error file torchrun's failure summary reads); ``--end
never`` trains until it is stopped. ``--listeners FILE``: once the process group is up,
rank 0 writes every listening TCP socket of the job (the launcher and all its
descendants) to FILE.

The child is this interpreter (not ``sleep`` from ``PATH``): a job may run with a
``PATH`` that holds nothing else."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def crash() -> None:
    raise RuntimeError("rank 1 fails here")


parser = argparse.ArgumentParser()
parser.add_argument("--end", choices=("normal", "crash", "never"), required=True)
parser.add_argument("--pid-dir", required=True)
parser.add_argument("--listeners", default=None)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
if args.listeners:
    from listeners import listeners  # beside this script

    dist.barrier()
    if rank == 0:
        Path(args.listeners).write_text(json.dumps(listeners(os.getppid())))
    dist.barrier()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
tmp = Path(args.pid_dir) / f".child_{rank}"
tmp.write_text(str(child.pid))
tmp.rename(Path(args.pid_dir) / f"child_{rank}")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while args.end == "never" or step < 5:
    step += 1
    loss = model(torch.randn(2, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    time.sleep(0.1)
if args.end == "crash" and rank == 1:
    crash()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done, child {child.pid} left running", flush=True)
