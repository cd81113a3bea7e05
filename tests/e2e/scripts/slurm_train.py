"""Training loop of the Slurm end-to-end tests (gloo, CPU): ``preempt_train.py``'s loop
for the options a Slurm job takes, with the plain SGD update written out instead of a
``torch.optim`` optimizer (the steps are told with ``rg.step``, not counted by the
optimizer's hook), so that a rank does not import ``torch._dynamo`` (about 2 s of CPU
per rank start on a loaded machine; a job of four runs starts eight ranks).

Each rank saves its own file (rankguard.preempt.TorchFileSaver) and resumes from the
newest step that every rank saved. Events go to ``<ckpt-dir>/events.jsonl``, one line
each (start, crash, saved, done). Options make one rank crash at a step in a Slurm
job's first run (its requeued runs go on), or step without the sleep once the job was
requeued N times.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import rankguard
from rankguard.preempt import TorchFileSaver

LR = 0.01


def log(path: Path, **event: object) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


def common_latest(root: Path, world: int) -> int | None:
    steps = [set(TorchFileSaver(root, r, dict).steps()) for r in range(world)]
    both = set.intersection(*steps) if steps else set()
    return max(both) if both else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument(
        "--sleep-runs",
        type=int,
        default=-1,
        help="the step sleep in a Slurm job's first N runs only (later runs step at full speed)",
    )
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--crash-step", type=int, default=-1, help="a Slurm job's first run only")
    p.add_argument("--crash-rank", type=int, default=1)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rg = rankguard.init()
    root = Path(args.ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    events = root / "events.jsonl"
    model = torch.nn.Linear(8, 8)
    saver = TorchFileSaver(root, rank, lambda: {"model": model.state_dict()})

    start = 1
    latest = common_latest(root, world)
    if latest is not None:
        blob = torch.load(saver.directory / f"step_{latest}.pt", weights_only=False)
        model.load_state_dict(blob["state"]["model"])
        start = latest + 1
    slurm_run = int(os.environ.get("SLURM_RESTART_COUNT") or 0)  # 0: not requeued yet
    step_sleep = args.step_sleep if args.sleep_runs < 0 or slurm_run < args.sleep_runs else 0.0
    log(events, event="start", rank=rank, start=start, pid=os.getpid(), slurm_run=slurm_run)

    step = start - 1
    for step in range(start, args.steps + 1):
        if step == args.crash_step and rank == args.crash_rank and slurm_run == 0:
            log(events, event="crash", rank=rank, step=step)
            raise RuntimeError(f"slurm_train: rank {rank} crashes at step {step}")
        with rg.step(step):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for prm in model.parameters():
                    dist.all_reduce(prm.grad)
                    prm.add_(prm.grad, alpha=-LR)  # SGD's step
            time.sleep(step_sleep)
        if args.ckpt_every and step % args.ckpt_every == 0:
            with rg.checkpoint(f"step_{step}"):
                saver.save(step)
        if rg.should_stop():
            with rg.checkpoint(f"preempt_{step}"):
                saver.save(step)
            log(events, event="saved", rank=rank, step=step, preempted=rg.preempted)
            if rg.preempted:
                rg.exit_preempted()
            break
    log(events, event="done", rank=rank, step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
