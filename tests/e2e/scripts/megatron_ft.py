"""A training script that uses NVRx's fault tolerance the way Megatron-LM's
``megatron/training/ft_integration.py`` does, unmodified for rankguard (it never imports
it): a ``RankMonitorClient`` set up before training, the ``setup`` section closed before
the first step, each training step after warm-up in a ``step`` section, every save in a
``checkpointing`` section, timeouts calculated after saves and at the end, the client's
state dict in ``<save>/ft_state.json``, shutdown at exit. Written for the client of
nvidia-resiliency-ext 0.4 (``init_workload_monitoring()`` takes no argument there);
``--num-warmup-iters`` passes 0.7's argument. ``--rg-checkpoint``: the saves go through
rankguard's checkpoint manager (the run's ``checkpoint`` config, e.g. Megatron Bridge's
``async_save``) instead of ``torch.save``: the one option that imports rankguard.
``--hang-rank R --hang-iter I[,J...]``: rank R sleeps 600 s inside its step at iteration
I in the first attempt, at J in the second (torch elastic's restart count), and so on.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=30)
parser.add_argument("--save", required=True)
parser.add_argument("--save-interval", type=int, default=10)
parser.add_argument("--calc-ft-timeouts", action="store_true")
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-iter", default="")  # per attempt: "12" or "12,22"
parser.add_argument("--step-sleep", type=float, default=0.01)
parser.add_argument("--num-warmup-iters", type=int, default=None)  # NVRx 0.7's argument
parser.add_argument("--rg-checkpoint", action="store_true")
args = parser.parse_args()

NUM_WARMUP_ITERS = 1
MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE = 16

os.makedirs(args.save, exist_ok=True)
ft_state_path = os.path.join(args.save, "ft_state.json")

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
hang_at = dict(enumerate(int(i) for i in args.hang_iter.split(",") if i))

cli = RankMonitorClient()
if args.num_warmup_iters is None:
    cli.init_workload_monitoring()
else:
    cli.init_workload_monitoring(num_warmup_iters=args.num_warmup_iters)
if os.path.exists(ft_state_path):
    with open(ft_state_path) as f:
        cli.load_state_dict(json.load(f))
if rank == 0:
    print(f"FT: initialized. Timeouts={cli.section_timeouts}", flush=True)
cli.start_section("setup")
setup_open = True

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
manager = None
if args.rg_checkpoint:
    from rankguard.checkpoint import CheckpointConfig, CheckpointManager

    manager = CheckpointManager(CheckpointConfig.from_run(), {"model": model, "optim": opt})
seen_iters = 0
seen_checkpoints = 0


def update_timeouts(closing: bool) -> None:
    if not args.calc_ft_timeouts:
        return
    sections = []
    if seen_iters >= MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE:
        sections.append("step")
    if seen_checkpoints > 0:
        sections.append("checkpointing")
    if sections:
        cli.calculate_and_set_section_timeouts(
            selected_sections=sections, calc_out_of_section=closing and seen_checkpoints > 0
        )
        if rank == 0:
            with open(ft_state_path, "w") as f:
                json.dump(cli.state_dict(), f)
            print(f"FT: updated timeouts saved to {ft_state_path}", flush=True)


for it in range(1, args.iters + 1):
    if setup_open:
        cli.end_section("setup")
        setup_open = False
    if seen_iters >= NUM_WARMUP_ITERS:
        cli.start_section("step")
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if rank == args.hang_rank and it == hang_at.get(restart):
        print(f"rank {rank} hangs inside its step at iteration {it}", flush=True)
        time.sleep(600)
    opt.step()
    time.sleep(args.step_sleep)
    if seen_iters >= NUM_WARMUP_ITERS:
        cli.end_section("step")
    seen_iters += 1
    if it % args.save_interval == 0:
        cli.start_section("checkpointing")
        if manager is not None:
            manager.save(it)
        elif rank == 0:
            torch.save(model.state_dict(), os.path.join(args.save, f"iter_{it}.pt"))
        dist.barrier()
        cli.end_section("checkpointing")
        seen_checkpoints += 1
        update_timeouts(closing=False)

update_timeouts(closing=True)
if manager is not None:
    manager.close()
cli.shutdown_workload_monitoring()
if rank == 0:
    print(f"done: {args.iters} iterations, restart {restart}", flush=True)
dist.destroy_process_group()
