"""The demo training job: a small GPT on synthetic tokens, data-parallel, under
``rankguard run`` (``rankguard demo`` launches it). Runs on CPU with gloo, or on GPUs
with NCCL when CUDA is available.

Faults (``--fault``) are injected on ``--fault-rank`` at ``--fault-step``:

- ``stall``: the main thread blocks inside the step (after the optimizer step, before
  the step ends) for ``--fault-duration`` seconds; the heartbeat thread keeps beating;
- ``stop``: the rank SIGSTOPs itself; a detached helper sends SIGCONT after
  ``--fault-duration`` seconds;
- ``crash``: the rank raises an exception (the job then fails);
- ``slow``: the rank's steps take ``--slowdown`` times longer.

With ``inprocess_restart.enabled=true`` the training loop is wrapped with
:func:`rankguard.inprocess.wrap`: a crash or a stall (past ``soft_timeout``) re-enters the
loop in the same processes, from the model and optimizer still in memory (the ranks agree
on the step with an ``all_reduce(MIN)``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import rankguard
import rankguard.inprocess as ip
from rankguard.demo.model import GPTConfig, TinyGPT, synthetic_batch
from rankguard.perf.flops import ModelShape, analytic_flops_per_step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--step-sleep", type=float, default=0.05, help="extra seconds per step")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-seconds", type=float, default=0.0, help="extra save time")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--fault", choices=["none", "stall", "stop", "crash", "slow"], default="none")
    p.add_argument(
        "--fault-rank", type=int, default=1, help="global rank (local with --fault-node)"
    )
    p.add_argument("--fault-node", type=int, default=None, help="fault LOCAL rank on this node")
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--fault-duration", type=float, default=8.0)
    p.add_argument(
        "--fault-attempt", type=int, default=0, help="inject in this attempt (restart count)"
    )
    p.add_argument("--slowdown", type=float, default=1.5)
    p.add_argument("--pg-timeout", type=float, default=120.0, help="collective timeout (s)")
    p.add_argument(
        "--flops",
        choices=["analytic", "measured", "none"],
        default="analytic",
        help="how the performance monitor gets FLOPs per step (Megatron's formula, "
        "FlopCounterMode over one step, or not at all)",
    )
    return p.parse_args(argv)


def is_fault_rank(args: argparse.Namespace, rank: int) -> bool:
    if args.fault_node is None:
        return rank == args.fault_rank
    node = int(os.environ.get("RANKGUARD_NODE_RANK", os.environ.get("GROUP_RANK", "0")))
    return node == args.fault_node and int(os.environ.get("LOCAL_RANK", "0")) == args.fault_rank


def inject(args: argparse.Namespace, rank: int, step: int, attempt: int) -> None:
    if args.fault in ("none", "slow") or not is_fault_rank(args, rank) or step != args.fault_step:
        return
    if attempt != args.fault_attempt:
        return  # by default the fault happens in the first attempt only
    print(f"[demo rank {rank}] injecting fault {args.fault!r} at step {step}", flush=True)
    if args.fault == "stall":
        time.sleep(args.fault_duration)
    elif args.fault == "stop":
        subprocess.Popen(
            ["sh", "-c", f"sleep {args.fault_duration}; kill -CONT {os.getpid()}"],
            start_new_session=True,
        )
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.fault == "crash":
        raise RuntimeError(f"injected crash on rank {rank} at step {step}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    memory: dict[str, Any] = {}  # what survives an in-process restart
    ipr = ip.run_config()
    if ipr is not None and ipr.enabled:  # the wrapper creates the group in every round
        return int(ip.wrap(train, config=ipr)(args, device, memory))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout))
    code = train(args, device, memory)
    dist.destroy_process_group()
    return code


def train(args: argparse.Namespace, device: torch.device, memory: dict[str, Any]) -> int:
    cuda = device.type == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    rank, world = dist.get_rank(), dist.get_world_size()
    rg = rankguard.init()
    round_ = ip.restart_count()  # in-process restarts so far (0 without the wrapper)
    cfg = GPTConfig()
    if not memory:
        torch.manual_seed(0)
        net = TinyGPT(cfg).to(device)
        memory.update(
            net=net,
            opt=torch.optim.AdamW(net.parameters(), lr=3e-3),
            gen=torch.Generator().manual_seed(1234 + rank),
            step=0,
        )
        memory["gen_state"] = memory["gen"].get_state()
    net, opt, gen = memory["net"], memory["opt"], memory["gen"]
    model = DDP(net, device_ids=[local_rank] if cuda else None)  # holds this round's group
    rg.set_batch(samples=args.batch_size, tokens=args.batch_size * cfg.seq_len)
    if args.flops == "analytic":
        rg.set_flops_per_step(
            analytic_flops_per_step(demo_shape(cfg), args.batch_size * world),
            "analytic: Megatron GPT formula",
        )
    elif args.flops == "measured" and round_ == 0:
        x, y = synthetic_batch(cfg, args.batch_size, torch.Generator().manual_seed(0), device)
        rg.measure_flops(model.module, (x,), loss_fn=lambda logits: _ce(logits, y))
    base = args.step_sleep
    first = 1
    if round_ > 0:  # from memory: every rank takes the step all of them completed
        done = torch.tensor([memory["step"]], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        first = int(done.item()) + 1
        gen.set_state(memory["gen_state"])  # the data of the steps not completed, again
        if rank == 0:
            print(f"[demo] in-process restart {round_}: resuming at step {first}", flush=True)
    elif args.checkpoint_dir:
        latest = latest_checkpoint(args.checkpoint_dir)
        if latest is not None:
            state = torch.load(latest, map_location=device, weights_only=True)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            first = int(state["step"]) + 1
            if rank == 0:
                print(
                    f"[demo] resumed from {os.path.basename(latest)} (restart {rg.restart_count})",
                    flush=True,
                )
    step = first - 1
    for step in range(first, args.steps + 1):
        with rg.step(step):
            with rg.data_loading():
                x, y = synthetic_batch(cfg, args.batch_size, gen, device)
            with rg.compute():  # this rank's own work (straggler detection measures it)
                cpu0 = time.thread_time()
                loss = _loss(model, x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if args.fault == "slow" and is_fault_rank(args, rank):
                    _busy(time.thread_time() - cpu0, args.slowdown)
            opt.step()
            memory["step"], memory["gen_state"] = step, gen.get_state()
            if base:
                time.sleep(base)
            if round_ == 0:  # an in-process re-entry runs clean
                inject(args, rank, step, rg.restart_count)
        if rank == 0 and (step == 1 or step % args.log_every == 0):
            print(f"[demo] step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        stop = rg.should_stop()  # every rank agrees on this step (stop_if_detected)
        if stop or (args.checkpoint_every and step % args.checkpoint_every == 0):
            with rg.checkpoint(f"step_{step}"):
                if rank == 0 and args.checkpoint_dir:
                    save_checkpoint(
                        args.checkpoint_dir,
                        step,
                        {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
                    )
                time.sleep(args.checkpoint_seconds)
                dist.barrier()
        if stop:
            if rank == 0:
                print(f"[demo] stopping at step {step}: {rg.stop_reason}", flush=True)
            break
    dist.barrier()
    if rank == 0:
        print(f"[demo] done: {step} steps on {world} rank(s)", flush=True)
    return 0


def save_checkpoint(directory: str, step: int, state: dict) -> str:
    """Atomic: write a temp file, fsync, rename; a torn file is never a checkpoint."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step}.pt")
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def latest_checkpoint(directory: str) -> str | None:
    """The newest complete ``step_<n>.pt`` (temp files are never complete)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    steps = [
        int(n[5:-3])
        for n in names
        if n.startswith("step_") and n.endswith(".pt") and n[5:-3].isdigit()
    ]
    return os.path.join(directory, f"step_{max(steps)}.pt") if steps else None


def _busy(cpu_s: float, slowdown: float) -> None:
    """A slower device: spend (slowdown - 1) x the step's compute on the CPU."""
    end = time.thread_time() + cpu_s * (slowdown - 1.0)
    x = torch.ones(64, 64)
    while time.thread_time() < end:
        x = x @ x
        x.clamp_(max=1.0)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _loss(model: DDP, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _ce(model(x), y)


def demo_shape(cfg: GPTConfig) -> ModelShape:
    """The demo model in the terms of Megatron's formula (MHA, GELU MLP 4h, causal)."""
    return ModelShape(
        family="gpt",
        num_layers=cfg.n_layers,
        hidden_size=cfg.d_model,
        seq_length=cfg.seq_len,
        vocab_size=cfg.vocab_size,
        num_attention_heads=cfg.n_heads,
    )


if __name__ == "__main__":
    sys.exit(main())
