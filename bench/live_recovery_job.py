"""One rank of the live recovery benchmarks (started by ``bench/live_recovery.py`` and
``bench/soak.py``), the same script under every launcher.

A small deterministic data-parallel job: the demo's model (``rankguard.demo.model``,
``--model demo``) or a tiny MLP (``--model mlp``, the soak's: thousands of cheap steps),
in DDP on gloo. The batch of step ``s`` on rank ``r`` is a function of ``(--seed, s, r)``
alone, so a rank that takes over rank ``r`` at step ``s``, or a group that resumes at step
``s``, trains on exactly the data an uninterrupted run does at that step. After each
optimizer step every rank prints ``LRSTEP {"s", "r", "loss", "t", "pid"}`` (its own
loss before the update, ``repr`` exact), which the benches compare with an uninterrupted
run's.

Recovery state, by launcher:

- ``torchrun`` / ``rankguard run`` (group restart): rank 0 saves model, optimizer and
  step every ``--ckpt-every`` steps (written to a temp file and renamed); a restarted
  group resumes from it;
- ``rankguard run --standby-ranks K --set inprocess_restart.enabled=true`` (live
  recovery): the loop runs inside ``rankguard.inprocess.wrap`` and declares its state
  with ``rankguard.inprocess.live_state`` (model, optimizer, step); a standby that takes
  a lost rank's place gets it from a live rank and trains on from the step it returns;
- ``--torchft``: one replica group per launcher (``torchrun --nproc-per-node 1``), joined
  by torchft's ``Manager`` (lighthouse in ``TORCHFT_LIGHTHOUSE``); torchft's own per-step
  quorum and live state transfer from a peer; a new replica group rejoins at the quorum's
  step.

Faults: ``--fault kill|stop|exception|node`` on ``--fault-rank`` at the start of step
``--fault-step`` (before its forward), once per job (a marker file in ``--ckpt-dir``
keeps a redone step from faulting again); ``--fault-rank`` and ``--fault-step`` may be
comma-separated lists of the same length, one fault each (the shrink bench: a second
SIGKILL once the standby is used). The rank prints ``LRFAULT {"kind", "r", "s", "t",
"pid", "i"}`` first (``i``: which fault of the list). ``node``: the rank stops itself
(SIGSTOP) after its line, and the bench ends its whole node (its launcher, every
process under it) at once: a lost agent. The soak injects from outside instead: SIGKILL
and SIGSTOP by pid
(``pids/rank_<r>`` in ``--ckpt-dir``, rewritten by whichever process holds the rank),
and an exception by ``SIGUSR1`` (raised at the rank's next step).

``--global-batch G`` (the shrink bench): every step trains on the same ``G`` samples
whatever the world size (drawn from ``(--seed, step)``), each rank its contiguous
share by its rank in the round's world, in micro-batches of ``--batch-size`` with
gradient accumulation (DDP's ``no_sync`` but for the last): a job that goes on with
fewer ranks keeps the global batch and its gradient (the mean over the ``G`` samples);
the rank prints the mean loss of its share.

``--hold-file F``: while F exists each step sleeps ``--step-sleep`` seconds and the ranks
wait before step ``--steps`` - 2 (the soak keeps the job alive until its last fault).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "error")
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--model", choices=["demo", "mlp"], default="demo")
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--ckpt-dir", required=True)
p.add_argument("--ckpt-every", type=int, default=5)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--hold-file", default=None)
p.add_argument("--fault", choices=["none", "kill", "stop", "exception", "node"], default="none")
p.add_argument("--fault-rank", default="1", help="a rank, or a comma-separated list")
p.add_argument("--fault-step", default="10", help="a step, or a list as --fault-rank")
p.add_argument("--global-batch", type=int, default=0, help="0: --batch-size per rank")
p.add_argument("--pg-timeout", type=float, default=30.0)
p.add_argument("--torchft", action="store_true", help="a replica group of torchft")
p.add_argument("--min-replicas", type=int, default=2)
args = p.parse_args()
FAULTS = list(
    zip(
        (int(x) for x in args.fault_rank.split(",")),
        (int(x) for x in args.fault_step.split(",")),
        strict=True,
    )
)

CKPT_DIR = Path(args.ckpt_dir)
PIDS = CKPT_DIR / "pids"
PIDS.mkdir(parents=True, exist_ok=True)
STATE = CKPT_DIR / "state.pt"
torch.set_num_threads(1)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    if args.model == "demo":
        from rankguard.demo.model import GPTConfig, TinyGPT

        return TinyGPT(GPTConfig())
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    if args.model == "demo":
        from rankguard.demo.model import GPTConfig, synthetic_batch

        return synthetic_batch(GPTConfig(), args.batch_size, gen, torch.device("cpu"))
    x = torch.randn(args.batch_size, 16, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if args.model == "demo":
        return nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    return nn.functional.mse_loss(out, y)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


_raise_next = False


def _on_usr1(_signum: int, _frame: Any) -> None:
    global _raise_next
    _raise_next = True


signal.signal(signal.SIGUSR1, _on_usr1)


def maybe_fault(rank: int, step: int) -> None:
    global _raise_next
    if _raise_next:
        _raise_next = False
        emit("LRFAULT", kind="exception", r=rank, s=step)
        raise RuntimeError(f"injected exception on rank {rank} at step {step}")
    if args.fault == "none" or (rank, step) not in FAULTS:
        return
    i = FAULTS.index((rank, step))
    try:  # once per job: a redone step does not fault again
        marker = CKPT_DIR / ("fault_done" if i == 0 else f"fault_done_{i}")
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    emit("LRFAULT", kind=args.fault, r=rank, s=step, i=i)
    if args.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.fault in ("stop", "node"):  # node: the bench ends the node now
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        raise RuntimeError(f"injected exception on rank {rank} at step {step}")


def emit(tag: str, **fields: Any) -> None:
    fields.setdefault("t", time.time())
    fields.setdefault("pid", os.getpid())
    sys.stdout.write(f"{tag} {json.dumps(fields)}\n")  # one write: lines of ranks never mix
    sys.stdout.flush()


def hold(step: int) -> None:
    if args.hold_file is None or not os.path.exists(args.hold_file):
        return
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if step == args.steps - 2:
        while os.path.exists(args.hold_file):
            time.sleep(0.1)


def shares(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``--global-batch``: this rank's micro-batches of step ``step``'s global batch (the
    same ``G`` samples whatever the world size), its contiguous share by rank."""
    g, mb = args.global_batch, args.batch_size
    if g % (world * mb):
        raise SystemExit(f"--global-batch {g} is not {world} rank(s) x micro-batches of {mb}")
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + 7919)
    if args.model == "demo":
        from rankguard.demo.model import GPTConfig, synthetic_batch

        x, y = synthetic_batch(GPTConfig(), g, gen, torch.device("cpu"))
    else:
        x = torch.randn(g, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
    per = g // world
    lo = rank * per
    return [(x[i : i + mb], y[i : i + mb]) for i in range(lo, lo + per, mb)]


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    """One optimizer step; the rank's loss (before the update)."""
    opt.zero_grad(set_to_none=True)
    if not args.global_batch:
        x, y = batch(step, rank)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        return loss.item()
    micro = shares(step, rank, dist.get_world_size())
    total = 0.0
    for i, (x, y) in enumerate(micro):
        last = i == len(micro) - 1
        sync = getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or sync is None else sync():
            part = loss_of(model, x, y) / len(micro)
            part.backward()
        total += part.item()
    opt.step()
    return total


def save(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = STATE.with_name(f".state.{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, STATE)


def run_ddp() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    net = build_model()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    first = 1
    if STATE.exists():
        ckpt = torch.load(STATE, weights_only=True)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        first = int(ckpt["step"]) + 1
        if rank == 0:
            emit("LRRESUMED", s=int(ckpt["step"]), source="checkpoint")
    write_atomic(PIDS / f"rank_{rank}", str(os.getpid()))
    model = ddp(net, opt, rank)
    for step in range(first, args.steps + 1):
        hold(step)
        maybe_fault(rank, step)
        loss = train_step(model, opt, step, rank)
        emit("LRSTEP", s=step, r=rank, loss=repr(loss))
        if rank == 0 and args.ckpt_every and step % args.ckpt_every == 0:
            save(net, opt, step)
    dist.destroy_process_group()


def ddp(net: nn.Module, opt: torch.optim.Optimizer, rank: int) -> nn.Module:
    """``net`` in DDP, its gradient buckets already in their final order: DDP lays them
    out in parameter order for its first backward and by the order the gradients were
    ready after it, and the layout changes how gloo adds them up (the last bits). Without
    this backward (on data no step trains on; no optimizer step) the first step after
    every (re)start would differ from the uninterrupted run's in the last bits."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net)
    x, y = batch(0, rank)
    loss_of(model, x, y).backward()
    opt.zero_grad(set_to_none=True)
    return model


def _inprocess() -> bool:
    """Is rankguard's in-process restart on for this run (``rankguard run --set
    inprocess_restart.enabled=true``; never under torchrun)?"""
    import rankguard.inprocess as ip

    config = ip.run_config()
    return config is not None and config.enabled


def run_live() -> None:
    """The same loop in rankguard's in-process wrapper (it forms the group each round),
    its state declared for live recovery."""
    import rankguard.inprocess as ip

    def train(memory: dict[str, Any]) -> None:
        rank = dist.get_rank()  # a standby that took a rank has that rank's number
        if not memory:
            net = build_model()
            memory.update(net=net, opt=torch.optim.AdamW(net.parameters(), lr=3e-3), step=0)
            if STATE.exists():  # a group restart (no standby was left): the checkpoint
                ckpt = torch.load(STATE, weights_only=True)
                net.load_state_dict(ckpt["model"])
                memory["opt"].load_state_dict(ckpt["opt"])
                memory["step"] = int(ckpt["step"])
                if rank == 0:
                    emit("LRRESUMED", s=memory["step"], source="checkpoint")
        net, opt = memory["net"], memory["opt"]
        # the one line: the replicated state, and the step every rank continues after
        memory["step"] = ip.live_state(model=net, optimizer=opt, step=memory["step"])
        write_atomic(PIDS / f"rank_{rank}", str(os.getpid()))
        model = ddp(net, opt, rank)
        for step in range(memory["step"] + 1, args.steps + 1):
            hold(step)
            maybe_fault(rank, step)
            with ip.atomic():
                loss = train_step(model, opt, step, rank)
                memory["step"] = step
            emit("LRSTEP", s=step, r=rank, loss=repr(loss))
            if rank == 0 and args.ckpt_every and step % args.ckpt_every == 0:
                save(net, opt, step)

    ip.wrap(train, config=ip.run_config())({})


def run_torchft() -> None:
    """torchft's own recovery. Gradients are averaged by ``Manager.allreduce`` per
    parameter, not torchft's ``DistributedDataParallel``: in torchft 0.2.0 its comm hook
    fails an ``assert`` on the survivors when a peer dies inside the allreduce (the
    error is recorded, the hook then finds no future), which ends every survivor."""
    from torchft import Manager, ProcessGroupGloo

    replica = int(os.environ["REPLICA_GROUP_ID"])
    net = build_model()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)

    def load_state_dict(sd: dict[str, Any]) -> None:
        net.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    def state_dict() -> dict[str, Any]:
        return {"model": net.state_dict(), "opt": opt.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.pg_timeout)),
        min_replica_size=args.min_replicas,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{replica}",
        timeout=timedelta(seconds=args.pg_timeout),
        use_async_quorum=False,
    )
    write_atomic(PIDS / f"rank_{replica}", str(os.getpid()))
    # the first quorum holds every replica group (the later ones: whoever is alive)
    while len(list(PIDS.glob("rank_*"))) < int(os.environ.get("REPLICA_GROUPS", "1")):
        time.sleep(0.05)
    params = [q for q in net.parameters() if q.requires_grad]
    while manager.current_step() < args.steps:
        opt.zero_grad(set_to_none=False)
        manager.start_quorum()  # a new replica group gets its state from a peer here
        step = manager.current_step() + 1
        hold(step)
        maybe_fault(replica, step)
        x, y = batch(step, replica)
        loss = loss_of(net, x, y)
        loss.backward()
        for work in [manager.allreduce(q.grad) for q in params if q.grad is not None]:
            work.wait()
        if manager.should_commit():
            opt.step()
            emit(
                "LRSTEP",
                s=step,
                r=replica,
                loss=repr(loss.item()),
                replicas=manager.num_participants(),
            )
    manager.shutdown(wait=False)


@record  # an exception's traceback lands in the rank's error file (torchrun --log-dir)
def main() -> None:
    if args.torchft:
        run_torchft()
    elif _inprocess():
        run_live()
    else:
        run_ddp()


main()
sys.exit(0)
