"""A hang inside a collective, for ``fault_matrix.py``: every rank runs steps of
``all_reduce``; at ``--fault-step`` the fault rank sleeps ``--duration`` seconds inside
the step *before* it enters the ``all_reduce``, while the other ranks wait in it.

Run under ``rankguard run ... bench/fault_matrix_collective.py --fault-rank R``
(``--fault-node N``: R is the local rank on node N).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import rankguard


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-node", type=int, default=None)
    p.add_argument("--fault-step", type=int, default=5)
    p.add_argument("--duration", type=float, default=30.0)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    if args.fault_node is None:
        culprit = rank == args.fault_rank
    else:
        node = int(os.environ.get("RANKGUARD_NODE_RANK", os.environ.get("GROUP_RANK", "0")))
        culprit = node == args.fault_node and int(os.environ["LOCAL_RANK"]) == args.fault_rank
    rg = rankguard.init()
    x = torch.ones(4096)
    for step in range(1, args.steps + 1):
        with rg.step(step):
            x = x * 0.5 + 1.0
            time.sleep(args.step_sleep)
            if culprit and step == args.fault_step:
                print(
                    f"[collective rank {rank}] injecting fault: {args.duration} s before "
                    f"all_reduce at step {step}",
                    flush=True,
                )
                time.sleep(args.duration)
            dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"[collective] done: {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
