"""A training loop for ``hang_classes.py`` that hangs one way (it never imports rankguard).

Each step: forward, backward, then one all-reduce of the flattened gradients (collective
number ``step`` of the default group: the loop issues no other). At ``--at-step`` the
loop hangs as ``--kind`` says, at ``--rank``:

``did_not_join``
    that rank sleeps instead of joining the step's all-reduce; the others wait in it.
``mismatch``
    that rank calls an all-gather where the others call the all-reduce (gloo aborts the
    process on an all-reduce of other sizes: a crash, not a hang); none completes.
``communication_stall``
    every rank calls a reduce of the same size with itself as the root: every rank
    joined the same collective and each waits for bytes no peer sends, as over a dead
    link (on loopback gloo no link can be cut while the ranks run on).
``compute_hang``
    every rank sleeps in its own work before the step's all-reduce.
``stall_sigstop``
    the communication stall the other way: that rank enters the step's all-reduce, and
    1.5 s later (its peers still 3 s away from it) stops its own process (SIGSTOP): every
    rank joined, none completes, and the stopped rank publishes nothing more.

The injecting rank (rank 0 for the kinds of every rank) writes ``--mark`` (JSON, written
whole then renamed): the wall time of the injection and the collective's number.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

KINDS = ("did_not_join", "mismatch", "communication_stall", "compute_hang", "stall_sigstop")


def _mark(path: str, kind: str, rank: int, step: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"kind": kind, "rank": rank, "seq": step, "at_unix": time.time()}, fh)
    os.replace(tmp, path)
    print(f"[hang_classes rank {rank}] injects {kind} at collective #{step}", flush=True)


def _stop_self(path: str, rank: int, step: int) -> None:
    _mark(path, "stall_sigstop", rank, step)
    os.kill(os.getpid(), signal.SIGSTOP)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at-step", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--mark", required=True)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    every = args.kind in ("communication_stall", "compute_hang")
    injector = rank == (0 if every else args.rank)
    for step in range(1, 10_000):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        grads = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
        hang = step == args.at_step
        if hang and args.kind == "stall_sigstop":
            if injector:  # stopped inside the all-reduce, before its peers join it
                threading.Timer(1.5, _stop_self, (args.mark, rank, step)).start()
            else:
                time.sleep(3.0)
        elif hang and injector:
            _mark(args.mark, args.kind, args.rank if not every else -1, step)
        if hang and (args.kind == "compute_hang" or (injector and args.kind == "did_not_join")):
            time.sleep(600)  # in its own work, outside any collective
        if hang and args.kind == "mismatch" and injector:
            dist.all_gather([torch.empty_like(grads) for _ in range(world)], grads)
        elif hang and args.kind == "communication_stall":
            dist.reduce(grads, dst=rank)
        else:
            dist.all_reduce(grads)
        opt.step()
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
