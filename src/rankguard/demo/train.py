"""The demo training job: a small GPT on synthetic tokens, data-parallel, under
``rankguard run`` (``rankguard demo`` launches it). Runs on CPU with gloo, or on GPUs
with NCCL when CUDA is available.

Faults (``--fault``) are injected on ``--fault-rank`` at ``--fault-step``:

- ``stall``: the main thread blocks inside the step (after the optimizer step, before
  the step ends) for ``--fault-duration`` seconds; the heartbeat thread keeps beating;
- ``wedge``: the same, with the in-process restart's interrupt signal blocked (a C call
  that never returns): only the hard timeout ends it;
- ``stop``: the rank SIGSTOPs itself; a detached helper sends SIGCONT after
  ``--fault-duration`` seconds (it ends at once if the rank is gone before);
- ``crash``: the rank raises an exception (the job then fails);
- ``slow``: the rank's steps take ``--slowdown`` times longer;
- ``preempt``: the rank sends the exit signal (SIGTERM) to its launcher, as a scheduler
  would: every rank saves the agreed step and the launcher exits 14 (requeue me).
- ``nan``: the rank's loss is NaN once (the re-run in place is fine: a transient fault);
- ``nan-persistent``: the loss is NaN at that step every time (exit 16, then the same
  after the resume: a data or model problem);
- ``nan-bad-gpu``: NaN every time in the first attempt only, as a faulty GPU would give
  (exit 16, then a different result after the resume: exit 17).

The NaN faults need ``rerun_state_machine.rerun_mode=validate_results`` (``rankguard demo``
sets it) and ``--checkpoint-dir`` for the resume.

Checkpoints go through ``rankguard.checkpoint`` (the ``checkpoint`` section of the run's
config, or ``--checkpoint-dir``/``--checkpoint-every``, ``--async-save`` and the local
tier's ``--local-checkpoint-dir``/``--local-checkpoint-every``); after an in-job restart
the job resumes from the newest complete checkpoint of either tier.
A slow evaluation (``--eval-every N --eval-seconds S``) and a slow save
(``--checkpoint-every N --save-seconds S``) show that neither is taken for a hang: the
evaluation is recognised by its function's name (``evaluate``, no rankguard call), the
save by the checkpoint library; each has its own timeout.

With ``inprocess_restart.enabled=true`` the training loop is wrapped with
:func:`rankguard.inprocess.wrap`: a crash or a stall (past ``soft_timeout``) re-enters the
loop in the same processes, from the model and optimizer still in memory (the ranks agree
on the step with an ``all_reduce(MIN)``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
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
from rankguard.checkpoint import CheckpointConfig, CheckpointManager, PerRank, RNGState
from rankguard.demo.model import GPTConfig, TinyGPT, synthetic_batch
from rankguard.perf.flops import ModelShape, analytic_flops_per_step
from rankguard.rank import runenv
from rankguard.rerun.state import RerunState

NAN_FAULTS = ("nan", "nan-persistent", "nan-bad-gpu")
FAULTS = ("none", "stall", "wedge", "stop", "crash", "slow", "preempt", *NAN_FAULTS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="samples per optimizer step, all ranks: gradient accumulation by the run's "
        "elastic.batch_rule at the current world size (0: one micro-batch per step)",
    )
    p.add_argument("--step-sleep", type=float, default=0.05, help="extra seconds per step")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=0, help="persistent, every N steps")
    p.add_argument(
        "--checkpoint-seconds",
        "--save-seconds",
        dest="checkpoint_seconds",
        type=float,
        default=0.0,
        help="extra save time (seconds) at each checkpoint",
    )
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--eval-batches", type=int, default=2, help="batches per evaluation")
    p.add_argument(
        "--eval-seconds", type=float, default=0.0, help="extra time (seconds) per evaluation"
    )
    p.add_argument("--checkpoint-dir", default=None, help="persistent checkpoints")
    p.add_argument("--async-save", action="store_true", help="write in the background")
    p.add_argument("--local-checkpoint-dir", default=None, help="node-local checkpoints")
    p.add_argument("--local-checkpoint-every", type=int, default=0)
    p.add_argument("--replication", type=int, default=1, help="copies of each local shard")
    p.add_argument("--fault", choices=FAULTS, default="none")
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
    p.add_argument(
        "--kill-at",
        action="append",
        default=[],
        metavar="RANK:STEP",
        help="the process holding RANK SIGKILLs itself after STEP (repeatable; the first "
        "attempt only, never a process that started after STEP)",
    )
    p.add_argument(
        "--no-live-state",
        action="store_true",
        help="do not declare the live state (a standby cannot take a lost rank's place)",
    )
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
    env = runenv.current()
    return env.node == args.fault_node and env.local_rank == args.fault_rank


def inject_nan(
    args: argparse.Namespace,
    rank: int,
    step: int,
    restart: int,
    rerunning: bool,
    resumed: bool = False,
) -> bool:
    """Is this attempt's loss NaN (the ``nan*`` faults)? ``resumed``: this is the re-run
    after the resume, another attempt even where torch's restart count did not move (an
    agent that restarted its group for a node waiting to join before it saw its own
    rank's exit 16 keeps count 0)."""
    if args.fault not in NAN_FAULTS or not is_fault_rank(args, rank) or step != args.fault_step:
        return False
    if args.fault == "nan":
        return restart == args.fault_attempt and not rerunning
    if args.fault == "nan-persistent":
        return True
    return restart == args.fault_attempt and not resumed  # nan-bad-gpu


def inject(args: argparse.Namespace, rank: int, step: int, attempt: int, round_: int) -> bool:
    """The per-step fault hook, after each step (``attempt``: the group's restarts,
    ``round_``: the in-process restarts). True ends the training loop after this step
    without a save (a replacement hook must say it on every rank at the same step)."""
    if round_ > 0:  # an in-process re-entry runs clean
        return False
    if (
        args.fault in ("none", "slow", *NAN_FAULTS)
        or not is_fault_rank(args, rank)
        or step != args.fault_step
    ):
        return False
    if attempt != args.fault_attempt:
        return False  # by default the fault happens in the first attempt only
    print(f"[demo rank {rank}] injecting fault {args.fault!r} at step {step}", flush=True)
    if args.fault == "stall":
        time.sleep(args.fault_duration)
    elif args.fault == "stop":
        # the helper ends with the rank (killed meanwhile) and holds none of its output:
        # a caller reading the job's output to its end (the launcher's pipe) is not kept
        # waiting the fault's duration after the job ended
        me, ticks = os.getpid(), max(1, math.ceil(args.fault_duration / 0.25))
        wait = f"i=0; while [ $i -lt {ticks} ] && kill -0 {me}; do sleep 0.25; i=$((i+1)); done"
        subprocess.Popen(
            ["sh", "-c", f"{wait}; kill -CONT {me}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.fault == "wedge":  # a C call that never returns: no interrupt lands
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN + 4})
        time.sleep(args.fault_duration)
    elif args.fault == "crash":
        raise RuntimeError(f"injected crash on rank {rank} at step {step}")
    elif args.fault == "preempt":
        pid = runenv.current().launcher_pid
        if pid is None:
            raise SystemExit("--fault preempt needs `rankguard run` (no launcher to signal)")
        os.kill(pid, signal.SIGTERM)
    return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = runenv.current().local_rank
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    memory: dict[str, Any] = {}  # what survives an in-process restart
    ipr = ip.run_config()
    if ipr is not None and ipr.enabled:  # the wrapper creates the group in every round
        code = int(ip.wrap(train, config=ipr)(args, device, memory))
    else:
        dist.init_process_group(
            "nccl" if cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout)
        )
        code = train(args, device, memory)
        dist.destroy_process_group()
    if memory.get("preempted"):
        rankguard.init().exit_preempted()  # the launcher exits 14: requeue, resume
    return code


def train(args: argparse.Namespace, device: torch.device, memory: dict[str, Any]) -> int:
    cuda = device.type == "cuda"
    local_rank = runenv.current().local_rank
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
            born=None,  # the first step this process runs
        )
        memory["gen_state"] = memory["gen"].get_state()
    net, opt, gen = memory["net"], memory["opt"], memory["gen"]
    accum = 1
    if args.global_batch:  # an elastic job's step follows its current world size
        plan = rg.batch_plan(args.global_batch, args.batch_size)
        accum = plan.accumulation_steps
        if rank == 0:
            print(
                f"[demo] batch plan: {world} rank(s), {accum} micro-batch(es) of "
                f"{args.batch_size} per step, global batch {plan.global_batch} ({plan.rule})",
                flush=True,
            )
    if not args.no_live_state:  # before DDP, which broadcasts rank 0's weights
        agreed = ip.live_state(model=net, optimizer=opt, step=memory["step"])
        if agreed != memory["step"]:  # a standby that took a rank, or a rank one step behind
            _data_at(gen, rank, agreed * accum, cfg, args.batch_size, device)
            memory["step"], memory["gen_state"] = agreed, gen.get_state()
    model = DDP(net, device_ids=[local_rank] if cuda else None)  # holds this round's group
    rg.set_batch(samples=args.batch_size * accum, tokens=args.batch_size * accum * cfg.seq_len)
    if args.flops == "analytic":
        rg.set_flops_per_step(
            analytic_flops_per_step(demo_shape(cfg), args.batch_size * accum * world),
            "analytic: Megatron GPT formula",
        )
    elif args.flops == "measured" and round_ == 0:
        x, y = synthetic_batch(cfg, args.batch_size, torch.Generator().manual_seed(0), device)
        rg.measure_flops(model.module, (x,), loss_fn=lambda logits: _ce(logits, y))
    base = args.step_sleep
    first = 1
    previous = memory.pop("ckpt", None)
    if previous is not None:  # the last round's manager: its group is gone with it
        try:
            previous.close()
        except Exception as exc:
            print(f"[demo rank {rank}] previous round's checkpoint write failed: {exc}")
    ckpt = checkpoints(args, {"model": model, "optim": opt, "rng": RNGState(), "data": _Gen(gen)})
    memory["ckpt"] = ckpt
    if round_ > 0:  # from memory: every rank takes the step all of them completed
        done = torch.tensor([memory["step"]], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        first = int(done.item()) + 1
        gen.set_state(memory["gen_state"])  # the data of the steps not completed, again
        if rank == 0:
            print(f"[demo] in-process restart {round_}: resuming at step {first}", flush=True)
    elif ckpt is not None:
        resumed = ckpt.load_latest()
        if resumed is not None:
            first = resumed + 1
            if rank == 0:
                tier = ckpt.record.loaded.tier if ckpt.record.loaded is not None else None
                print(
                    f"[demo] resumed from step {resumed} ({tier}) (restart {rg.restart_count})",
                    flush=True,
                )
    step = first - 1
    if memory["born"] is None:
        memory["born"] = first
    # before an exit 16 the rerun state machine saves through the same manager
    saver = ckpt if ckpt is not None and ckpt.save_dir is not None else None
    rerun = rg.rerun(checkpoint=saver, state_dir=args.checkpoint_dir)
    batches = rerun.replay(iter(lambda: synthetic_batch(cfg, args.batch_size, gen, device), None))
    for step in range(first, args.steps + 1):
        with rg.step(step):
            # an in-process restart ends a round before this step or after it, never in
            # its middle: each rank's weights, optimizer and data stay those of one step
            with ip.atomic():
                for _ in rerun.iteration(step, batches):  # twice when a check fails
                    with rg.data_loading():
                        x, y = next(batches)
                    with rg.compute():  # this rank's own work (straggler detection measures it)
                        cpu0 = time.thread_time()
                        opt.zero_grad(set_to_none=True)
                        # the other micro-batches of the step first, without DDP's
                        # all-reduce: DDP wants every no_sync forward and backward done
                        # before the forward whose backward reduces
                        for _ in range(accum - 1):
                            xa, ya = next(batches)
                            with model.no_sync():
                                (_loss(model, xa, ya) / accum).backward()
                        loss = _loss(model, x, y)
                        resumed = rerun.state is RerunState.RERUN_FROM_CHECKPOINT
                        if inject_nan(args, rank, step, rg.restart_count, rerun.rerunning, resumed):
                            loss = loss * float("nan")
                        rerun.validate_loss(loss)
                        (loss / accum if accum > 1 else loss).backward()
                        if args.fault == "slow" and is_fault_rank(args, rank):
                            _busy(time.thread_time() - cpu0, args.slowdown)
                if rerun.accepted:
                    opt.step()
                memory["step"], memory["gen_state"] = step, gen.get_state()
            if base:
                time.sleep(base)
            ended = inject(args, rank, step, rg.restart_count, round_)
            if _kill_now(args, rank, step, memory["born"], rg.restart_count):
                print(f"[demo rank {rank}] SIGKILL of pid {os.getpid()} after step {step}")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)  # lost: a standby takes over, or a restart
        if rank == 0 and (step == 1 or step % args.log_every == 0):
            print(f"[demo] step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        if ended:  # every rank's hook said so at this step
            break
        if args.eval_every and step % args.eval_every == 0:
            val = evaluate(model, cfg, args, device)
            if rank == 0:
                print(f"[demo] step {step} eval loss {val:.4f}", flush=True)
        stop = rg.should_stop()  # every rank agrees on this step (stragglers, preemption)
        due = bool(args.checkpoint_every) and step % args.checkpoint_every == 0
        saved = ckpt.maybe_save(step) if ckpt is not None else False
        if stop and ckpt is not None and not saved and ckpt.save_dir is not None:
            ckpt.save(step, blocking=True)  # the agreed step, written before leaving
            saved = True
        if (saved or due) and args.checkpoint_seconds:  # a slower disk (no directory: only this)
            with rg.checkpoint(f"step_{step}_extra"):
                time.sleep(args.checkpoint_seconds)
        if stop:
            if rank == 0:
                print(f"[demo] stopping at step {step}: {rg.stop_reason}", flush=True)
            break
    if ckpt is not None:
        ckpt.close()  # waits for the last background write
        memory.pop("ckpt", None)
    dist.barrier()
    if rank == 0:
        print(f"[demo] done: {step} steps on {world} rank(s)", flush=True)
    memory["preempted"] = rg.preempted
    return 0


def _kill_now(args: argparse.Namespace, rank: int, step: int, born: int, attempt: int) -> bool:
    """``--kill-at RANK:STEP``: in the first attempt, by a process that ran that step."""
    return f"{rank}:{step}" in args.kill_at and born <= step and attempt == 0


def _data_at(
    gen: torch.Generator,
    rank: int,
    batches: int,
    cfg: GPTConfig,
    batch_size: int,
    device: torch.device,
) -> None:
    """The rank's data generator positioned after ``batches`` batches (a standby that
    took this rank: the same data as the rank it replaced would have drawn)."""
    gen.manual_seed(1234 + rank)
    for _ in range(batches):
        synthetic_batch(cfg, batch_size, gen, device)


def evaluate(model: DDP, cfg: GPTConfig, args: argparse.Namespace, device: torch.device) -> float:
    """Mean loss over a few held-out batches, averaged over the ranks; plus
    ``--eval-seconds`` of extra time (a slow validation set)."""
    model.eval()
    gen = torch.Generator().manual_seed(99)
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for _ in range(args.eval_batches):
            x, y = synthetic_batch(cfg, args.batch_size, gen, device)
            total += _loss(model.module, x, y)
        time.sleep(args.eval_seconds)
    dist.all_reduce(total)
    model.train()
    return float(total) / (args.eval_batches * dist.get_world_size())


class _Gen(PerRank):
    """The rank's data generator: the batches after a resume are the ones it would have
    drawn."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.gen.get_state()}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.gen.set_state(state_dict["state"])


def checkpoints(args: argparse.Namespace, state: dict) -> CheckpointManager | None:
    """The run's ``checkpoint`` config with the command line's settings on top; None
    when neither tier has a directory."""
    cfg = CheckpointConfig.from_run() or CheckpointConfig()
    changes: dict = {}
    if args.checkpoint_dir:
        changes["save"] = args.checkpoint_dir
    if args.checkpoint_every and (args.checkpoint_dir or cfg.save):
        changes["save_interval"] = args.checkpoint_every
    if args.async_save:
        changes["async_save"] = True
    if args.local_checkpoint_dir:
        changes["non_persistent_ckpt_type"] = "local"
        changes["non_persistent_local_ckpt_dir"] = args.local_checkpoint_dir
        changes["non_persistent_save_interval"] = args.local_checkpoint_every or None
    if args.replication > 1:
        changes.update(replication=True, replication_factor=args.replication)
    cfg = dataclasses.replace(cfg, **changes)
    if not (cfg.save or cfg.load or cfg.local_enabled):
        return None
    if cfg.save_interval is not None and not cfg.save:
        cfg = dataclasses.replace(cfg, save_interval=None)
    return CheckpointManager(cfg, state)


def _busy(cpu_s: float, slowdown: float) -> None:
    """A slower device: spend (slowdown - 1) x the step's compute on the CPU."""
    end = time.thread_time() + cpu_s * (slowdown - 1.0)
    x = torch.ones(64, 64)
    while time.thread_time() < end:
        x = x @ x
        x.clamp_(max=1.0)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
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
