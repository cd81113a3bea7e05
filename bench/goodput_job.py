"""The goodput bench's job: ``rankguard.demo.train`` with a schedule of faults and a
wall-clock end (started by ``bench/goodput.py`` under both launchers, never alone).

The schedule (``GOODPUT_FAULTS``: JSON ``[[t, kind], ...]``, t in epoch seconds) is the
same for every launcher. On the fault rank (``--fault-rank``), the demo's per-step
hook fires the first fault not fired yet whose time has come, one per process (a
fault file in ``GOODPUT_DIR`` marks it fired, so the next attempt goes on to the next):

- ``exception``: ``RuntimeError`` out of the training step;
- ``sigkill``: the rank SIGKILLs itself;
- ``hang``: the rank sleeps inside its step (its heartbeat thread keeps beating) until
  something kills it: rankguard's progress timeout, or the peer's collective timeout;
- ``sigstop``: the rank SIGSTOPs itself (a frozen process: its heartbeat thread stops
  too, nothing in it runs again) until something kills it.

Faults fire in every in-process round too (live recovery: the survivors re-enter).
Every 10 steps all ranks agree (an all-reduce) whether ``GOODPUT_END`` (epoch seconds)
has passed; then they leave the training loop together and exit 0: the job ends on time
under every launcher (in the in-process wrapper's rounds too, its standbys released).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rankguard.demo import train

KINDS = ("exception", "sigkill", "hang", "sigstop")
CHECK_EVERY = 10  # steps between the ranks' agreement on the end
HANG_S = 3600.0


def _schedule() -> list[tuple[float, str]]:
    raw = json.loads(os.environ.get("GOODPUT_FAULTS", "[]"))
    return [(float(t), str(kind)) for t, kind in raw]


def _fire(k: int, kind: str, rank: int, step: int) -> None:
    print(f"[goodput-job rank {rank}] injecting {kind} (fault {k}) at step {step}", flush=True)
    if kind == "exception":
        raise RuntimeError(f"injected exception {k} on rank {rank} at step {step}")
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(HANG_S)
    if kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)


def scheduled(args: argparse.Namespace, rank: int, step: int, attempt: int, round_: int) -> bool:
    """The demo's per-step fault hook: the end of the job (True), then the schedule's
    faults."""
    if step % CHECK_EVERY == 0:
        over = torch.tensor([float(time.time() >= float(os.environ["GOODPUT_END"]))])
        dist.all_reduce(over, op=dist.ReduceOp.MAX)
        if over.item():
            if rank == 0:
                print(f"[goodput-job] end of the job at step {step}", flush=True)
            return True
    if rank != args.fault_rank:
        return False
    now = time.time()
    fired = Path(os.environ["GOODPUT_DIR"])
    for k, (when, kind) in enumerate(_schedule()):
        if when > now:
            return False
        marker = fired / f"fault_{k}"
        if marker.exists():
            continue
        marker.touch()
        _fire(k, kind, rank, step)
        return False
    return False


if __name__ == "__main__":
    train.inject = scheduled
    sys.exit(train.main())
