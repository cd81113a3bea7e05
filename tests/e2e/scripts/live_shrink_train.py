"""A data-parallel training script for live recovery with no standby left: the job goes
on with fewer ranks in process.

A linear model, SGD with momentum (its optimizer state must survive), the gradient
all-reduced by hand. A step is ``GLOBAL_BATCH`` samples whatever the world size: each
rank takes ``elastic.batch_rule=keep_global``'s accumulation (``RunEnv.batch_plan``,
read at every round from ``RANK``/``WORLD_SIZE`` as the wrapper gives them) and the
samples ``step * GLOBAL_BATCH + rank * accumulation + k``: the loss of every step is the
one of a run without faults, before and after a rank is lost.

``--kill RANK:STEP``: the process started as RANK SIGKILLs itself after completing STEP
(first round only). Results go to ``--out DIR/rank_<launch rank>.json`` (a standby's:
the ``RANK`` it started with, outside the training world).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import rankguard.inprocess as ip
from rankguard.rank import runenv

DIM = 8
GLOBAL_BATCH = 12
LR = 0.05

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--kill", default="")
p.add_argument("--step-s", type=float, default=0.0, help="sleep after each step")
p.add_argument("--out", required=True)
args = p.parse_args()

launched = int(os.environ["RANK"])
kill_rank, kill_step = (int(v) for v in args.kill.split(":")) if args.kill else (-1, -1)


def sample(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1, 1, DIM) * (1 + i % 5) / 5
    return x, torch.tensor([float(i % 7) / 7])


memory: dict = {}  # what survives a re-entry
losses: dict[str, float] = {}
rounds: list[dict] = []


def train() -> list[float]:
    if not memory:
        net = torch.nn.Linear(DIM, 1, bias=False)
        torch.nn.init.zeros_(net.weight)
        memory.update(net=net, opt=torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9))
        memory["step"] = 0
    net, opt = memory["net"], memory["opt"]
    memory["step"] = ip.live_state(model=net, optimizer=opt, step=memory["step"])
    env = runenv.current()  # RANK and WORLD_SIZE as the wrapper gives them this round
    rank, world = env.rank, env.world_size
    plan = env.batch_plan(GLOBAL_BATCH, 1)
    info = ip.current()
    rounds.append(
        {
            "round": ip.restart_count(),
            "rank": rank,
            "world": world,
            "dist": [dist.get_rank(), dist.get_world_size()],
            "accumulation": plan.accumulation_steps,
            "cause": info.cause if info else None,
            "step": memory["step"],
        }
    )
    while memory["step"] < args.steps:
        s = memory["step"]
        with ip.atomic():
            opt.zero_grad()
            total = torch.zeros(1)
            for k in range(plan.accumulation_steps):
                x, y = sample(s * GLOBAL_BATCH + rank * plan.accumulation_steps + k)
                loss = ((net(x) - y) ** 2).sum() / GLOBAL_BATCH
                loss.backward()
                total += loss.detach()
            for param in net.parameters():
                dist.all_reduce(param.grad)
            dist.all_reduce(total)
            opt.step()
            memory["step"] = s + 1
            losses[str(s)] = float(total)
        if args.step_s:
            time.sleep(args.step_s)
        if (launched, s + 1) == (kill_rank, kill_step) and ip.restart_count() == 0:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    return [float(v) for v in net.weight.detach().reshape(-1)]


config = ip.InProcessRestartConfig(
    enabled=True,
    soft_timeout=10.0,
    hard_timeout=30.0,
    monitor_thread_interval=0.1,
    heartbeat_interval=0.2,
    heartbeat_timeout=3.0,
    barrier_timeout=30.0,
    standby_ranks=1,
    live_shrink=True,
)
final = ip.wrap(train, config=config)()
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{launched}.json"), "w") as f:
    env = [os.environ["RANK"], os.environ["WORLD_SIZE"]]
    json.dump({"final_w": final, "losses": losses, "rounds": rounds, "env": env}, f)
