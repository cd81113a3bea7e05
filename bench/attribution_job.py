"""An unmodified DDP training script for ``attribution.py`` (it never imports rankguard).

``--stall-rank R --stall-site SITE``: at ``--stall-step`` rank R sleeps ``--stall-s``
seconds in its ``forward`` (a forward pre-hook), ``backward`` (a backward hook of the
first layer), ``optimizer`` (an optimizer step pre-hook), ``data`` (the data iterator)
or ``outside`` (the loop, between steps). ``--slow-rank R --slowdown X --slow-site
SITE``: from ``--slow-from-s`` seconds on, rank R spends X times as long in that site
(each site sleeps ``--site-ms`` on every rank). The job runs ``--seconds`` and every
rank stops at the same step.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SITES = ("forward", "backward", "optimizer", "data", "outside")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--site-ms", type=float, default=10.0)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-site", choices=SITES, default="outside")
    p.add_argument("--stall-step", type=int, default=20)
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-site", choices=SITES, default="backward")
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-from-s", type=float, default=0.0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    start = time.monotonic()
    state = {"step": 0}

    def pause(site: str) -> None:
        ms = args.site_ms
        if (
            rank == args.slow_rank
            and site == args.slow_site
            and time.monotonic() - start >= args.slow_from_s
        ):
            ms *= args.slowdown
        time.sleep(ms / 1000)
        if rank == args.stall_rank and site == args.stall_site and state["step"] == args.stall_step:
            print(f"[attribution rank {rank}] stalls in {site} at step {state['step']}", flush=True)
            time.sleep(args.stall_s)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    net.register_forward_pre_hook(lambda *_: pause("forward"))
    net[0].register_full_backward_hook(lambda *_: pause("backward"))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.register_step_pre_hook(lambda *_: pause("optimizer"))

    def batches() -> Iterator[torch.Tensor]:
        while True:
            pause("data")
            yield torch.randn(8, 64)

    data = batches()
    end = start + args.seconds
    while True:
        done = torch.tensor([float(time.monotonic() > end)])
        dist.all_reduce(done)  # every rank stops at the same step
        if done.item():
            break
        state["step"] += 1
        x = next(data)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pause("outside")
    dist.barrier()
    if rank == 0:
        print(f"[attribution] done: {state['step']} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
