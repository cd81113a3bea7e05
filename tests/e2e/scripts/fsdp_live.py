"""An FSDP2 job declaring its sharded state for live recovery: the model sharded with
``fully_shard`` (gloo, CPU), its optimizer, the rank's RNG and data position in a
checkpoint manager with a local tier saved every step, declared once with
``ip.live_state(checkpoint=manager, step=...)``. ``--kill-at RANK:STEP``: that rank's
process SIGKILLs itself after STEP (and its local save, every rank's save and record of
STEP done: a barrier first), in the first round. Each step's
loss (the mean over the ranks) and the rank's random draw go to ``--out/<pid>.jsonl``."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import rankguard.inprocess as ip
from rankguard.checkpoint import CheckpointConfig, CheckpointManager, DataPosition, RNGState

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--kill-at", default="")
p.add_argument("--out", required=True)
p.add_argument("--local-dir", required=True)
args = p.parse_args()
BATCH = 8  # the global batch, split over the ranks
KILLS = [tuple(int(n) for n in item.split(":")) for item in args.kill_at.split(",") if item]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=gen)
    return x, torch.tanh(x[:, :1] - x[:, 1:2]) + 0.5


def net() -> torch.nn.Module:
    with torch.random.fork_rng():  # the rank's own stream is left as it is
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


@ip.wrap
def train(memory: dict[str, Any]) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    if not memory:  # a new process: a standby that took a rank too
        torch.manual_seed(100 + rank)
        memory.update(step=0, pos=DataPosition())
    if "ckpt" in memory:  # the last round's manager: its group is gone
        memory.pop("ckpt").close()
    model = net()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    pos = memory["pos"]
    config = CheckpointConfig(
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=args.local_dir,
        non_persistent_save_interval=1,
    )
    ckpt = memory["ckpt"] = CheckpointManager(
        config, {"model": model, "optim": opt, "rng": RNGState(), "data": pos}
    )
    memory["step"] = done = ip.live_state(checkpoint=ckpt, step=memory["step"])
    for step in range(done + 1, args.steps + 1):
        x, y = batch(pos.index + 1)
        per = BATCH // world
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        with ip.atomic():
            opt.zero_grad()
            loss = ((model(xs) - ys) ** 2).mean()
            loss.backward()
            opt.step()
            draw = torch.rand(1).item()
            pos.index += 1
            memory["step"] = step
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        ckpt.maybe_save(step)
        rec = {"step": step, "rank": rank, "loss": float(mean) / world, "draw": draw}
        with (Path(args.out) / f"{os.getpid()}.jsonl").open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if ip.restart_count() == 0 and any(step == s for _r, s in KILLS):
            dist.barrier()  # a survivor interrupted between its save and record left it out
            if (rank, step) in KILLS:
                os.kill(os.getpid(), signal.SIGKILL)
    memory.pop("ckpt").close()
    return 0


train({})
