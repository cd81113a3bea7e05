"""A gloo loop whose rank 1 leaves after a few steps with exit code 0 while rank 0 goes
on: rank 0's next all-reduce fails with "Connection closed by peer"."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(400):
    if rank == 1 and step == 5:
        sys.exit(0)
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
