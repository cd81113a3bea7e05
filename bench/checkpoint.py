"""Checkpoint stall, steps lost on a crash, and restore time (rankguard.checkpoint).

What, in one run on CPU:

1. Stall per save, a model with >= 1 GB of state (an MLP of ``--params`` parameters and
   its AdamW moments): the time the training loop is blocked by one save, median of
   ``--repeats``:

   - ``sync``: ``CheckpointManager.save`` with ``async_save=false`` (DCP ``save``,
     manifest, commit): the baseline;
   - ``rankguard async (thread)`` / ``(process)``: ``async_save=true``: the loop waits
     for the copy into the cached host buffers only, and that copy overlaps the next
     ``--step-s`` seconds of compute (the next forward/backward; the optimizer step after
     it waits for the copy: that wait is counted as blocked); DCP's thread (or its
     checkpoint process) writes, rankguard commits in the background; ``copy first``:
     the same with ``stage_in_background=false`` (the save returns after the copy);
   - ``DCP async_save``: ``torch.distributed.checkpoint.async_save`` called directly
     with its defaults (no manifest, no commit), the path to match.

   Each async save is followed by the time until its write is committed (``wait``), and
   the step time of the matmul loop that runs while that write is in flight, next to the
   same loop with no write (how much the background write slows training on 2 cores).
   The first save of each path allocates its buffers (and starts DCP's process): shown,
   not counted.
2. Steps lost on a crash: a loop of ``--steps`` small steps saving the persistent tier
   every ``--every`` steps, or the local tier every step (async); a crash at every step
   in turn loses ``step - last_committed`` steps; the mean and max are measured from the
   manager's ``last_committed`` at that instant, and the local tier's cost per step
   (blocked time) is measured on the 1 GB state too.
3. Restore time with 2 ranks (forked processes on gloo, each with a ``--restore-params``
   model): ``load_latest`` from each rank's own local shard, from a peer's replica (one
   node's local directory deleted), and from the persistent tier (both deleted).

Run: ``python bench/checkpoint.py`` (about 3-5 minutes on 2 cores; needs ~6 GB of memory
and ~5 GB of disk under ``--dir``, removed at the end).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from rankguard.checkpoint import CheckpointConfig, CheckpointManager


def model_and_opt(params: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 4096
    layers = max(1, params // (width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # allocate the moments
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return total


def matmul_steps(seconds: float, size: int = 512) -> float:
    """Run small compute steps (a stand-in for the next forward and backward) for about
    ``seconds``; the mean seconds per step."""
    a = torch.randn(size, size)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a)
        n += 1
    return (time.perf_counter() - t0) / max(n, 1)


def stall(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    model, opt = model_and_opt(args.params)
    size = state_bytes(model, opt)
    print(f"state: {size / 1e9:.2f} GB ({args.params / 1e6:.0f} M parameters + AdamW moments)")
    state = {"model": model, "optim": opt}
    base_step = matmul_steps(1.0)
    rows: dict[str, dict[str, list[float]]] = {}

    def record(label: str, blocked: float, write: float, step: float | None) -> None:
        row = rows.setdefault(label, {"blocked": [], "write": [], "step": []})
        row["blocked"].append(blocked)
        row["write"].append(write)
        if step is not None:
            row["step"].append(step)

    # rankguard: sync, async (copy overlapping the next step, or not), async process
    for label, kw in (
        ("sync", {"async_save": False}),
        ("rankguard async (thread)", {"async_save": True}),
        ("rankguard async, copy first", {"async_save": True, "stage_in_background": False}),
        ("rankguard async (process)", {"async_save": True, "async_checkpointer_type": "process"}),
    ):
        d = root / label.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
        m = CheckpointManager(
            CheckpointConfig(save=str(d), most_recent_k=1, **kw), state, job_id="bench"
        )
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            m.save(i + 1)
            blocked = time.perf_counter() - t0
            step = None
            if kw["async_save"]:
                m.stats["staging_wait_s"] = None
                step = matmul_steps(args.step_s)  # the next forward and backward
                opt.step()  # no gradients: only the pre-step hook's wait for the copy
                blocked += m.stats["staging_wait_s"] or 0.0
            m.wait()
            write = time.perf_counter() - t0
            if i == 0:  # allocates the host buffers (and starts DCP's process)
                print(f"   {label}: first save {blocked:.2f} s blocked (warm-up, not counted)")
                continue
            record(label, blocked, write, step)
        m.close()
        shutil.rmtree(d, ignore_errors=True)

    # DCP's own async_save, called directly
    for i in range(args.repeats):
        d = root / f"dcp_{i}"
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(d))
        blocked = time.perf_counter() - t0
        step = matmul_steps(args.step_s)
        future.result()
        record("DCP async_save (direct)", blocked, time.perf_counter() - t0, step)
        shutil.rmtree(d, ignore_errors=True)

    sync = statistics.median(rows["sync"]["blocked"])
    dcp_blocked = statistics.median(rows["DCP async_save (direct)"]["blocked"])
    print(f"\n1. Stall per save ({size / 1e9:.2f} GB state, median of {args.repeats})")
    print(
        f"   {args.step_s:g} s of compute after each save (the next forward/backward); "
        f"a compute step with no write in flight: {base_step * 1e3:.1f} ms"
    )
    print(f"   {'path':<28} {'blocked s':>9} {'% of sync':>9} {'write s':>8} {'step ms':>8}")
    for label, row in rows.items():
        b = statistics.median(row["blocked"])
        w = statistics.median(row["write"])
        s = f"{statistics.median(row['step']) * 1e3:8.1f}" if row["step"] else f"{'-':>8}"
        print(f"   {label:<28} {b:9.3f} {100 * b / sync:8.1f}% {w:8.2f} {s}")
    ours = statistics.median(rows["rankguard async (thread)"]["blocked"])
    worse = "no worse" if ours <= dcp_blocked * 1.1 else "worse"
    print(
        f"   verdict: rankguard async blocks {100 * ours / sync:.1f}% of the sync save "
        f"(goal <= 5%: {'met' if ours <= 0.05 * sync else 'NOT met'}); "
        f"DCP's own path {dcp_blocked:.3f} s (rankguard {worse})"
    )
    local = root / "local_every_step"
    m = CheckpointManager(
        CheckpointConfig(
            non_persistent_ckpt_type="local",
            non_persistent_local_ckpt_dir=str(local),
            non_persistent_save_interval=1,
            non_persistent_most_recent_k=1,
            async_save=True,
        ),
        state,
        job_id="bench",
    )
    blocked, writes = [], []
    for i in range(args.repeats + 1):
        t0 = time.perf_counter()
        m.save(i + 1, tier="local")  # waits for the previous step's write first
        b = time.perf_counter() - t0
        m.stats["staging_wait_s"] = None
        matmul_steps(args.step_s)
        opt.step()
        b += m.stats["staging_wait_s"] or 0.0
        if i:
            blocked.append(b)
            writes.append(m.stats["last"]["local"]["write_s"])
    m.close()
    shutil.rmtree(local, ignore_errors=True)
    print(
        f"   local tier every step ({args.step_s:g} s steps): "
        f"{statistics.median(blocked):.3f} s blocked per step (the wait for the previous "
        f"step's write, the copy's sync part and the optimizer step's wait for the copy); "
        f"a local write takes {statistics.median(writes):.2f} s"
    )
    return {"sync": sync, "ours": ours, "dcp": dcp_blocked}


def steps_lost(args: argparse.Namespace, root: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optim": opt}
    print(f"\n2. Steps lost by a crash at each of {args.steps} steps (small model, 20 ms steps)")
    for label, kw in (
        (f"persistent every {args.every} (async)", {"save_interval": args.every}),
        (
            "local every step (async)",
            {"non_persistent_save_interval": 1, "non_persistent_ckpt_type": "local"},
        ),
    ):
        d = root / "lost"
        m = CheckpointManager(
            CheckpointConfig(
                save=str(d / "p"),
                non_persistent_local_ckpt_dir=str(d / "l"),
                async_save=True,
                **kw,
            ),
            state,
            job_id="bench",
        )
        lost = []
        for step in range(1, args.steps + 1):
            time.sleep(0.02)  # the step
            m.maybe_save(step)
            committed = max((s for s in m.last_committed.values() if s is not None), default=0)
            # a crash now, before the next step ends, loses the steps since the last commit
            lost.append(step - committed)
        m.close()
        shutil.rmtree(d, ignore_errors=True)
        print(f"   {label:<32} mean {statistics.mean(lost):5.2f}  max {max(lost)}")


def _restore_rank(rank: int, world: int, root: Path, params: int) -> dict[str, float]:
    import torch.distributed as dist

    model, opt = model_and_opt(params)
    state = {"model": model, "optim": opt}

    def config() -> CheckpointConfig:
        return CheckpointConfig(
            save=str(root / "p"),
            non_persistent_ckpt_type="local",
            non_persistent_local_ckpt_dir=str(root / f"node{rank}"),
            non_persistent_save_interval=1,
            replication=True,
            replication_factor=2,
        )

    m = CheckpointManager(config(), state, job_id="bench", local_world_size=1)
    m.save(1)
    m.save(2, tier="local")
    m.close()
    out = {}
    for label in ("local", "replica", "persistent"):
        dist.barrier()
        if rank == 1 and label == "replica":
            shutil.rmtree(root / "node1")
        if label == "persistent":
            shutil.rmtree(root / f"node{rank}", ignore_errors=True)
        dist.barrier()
        m = CheckpointManager(config(), state, job_id="bench", local_world_size=1)
        t0 = time.perf_counter()
        step = m.load_latest()
        out[label] = time.perf_counter() - t0
        out[label + "_step"] = float(step or 0)
        m.close()
    return out


def restore(args: argparse.Namespace, root: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.factories import run_ranks

    results = run_ranks(
        2,
        _restore_rank,
        root / "restore",
        args.restore_params,
        store_dir=root,
        timeout_s=900,
        pg_timeout_s=600,
    )
    mb = args.restore_params * 12 / 1e6
    print(f"\n3. Restore time, 2 ranks, {mb:.0f} MB of state per rank (max over ranks)")
    for label, what in (
        ("local", "each rank's own local shard"),
        ("replica", "rank 1 from rank 0's replica (node 1's directory gone)"),
        ("persistent", "persistent tier (both local directories gone)"),
    ):
        t = max(r[label] for r in results)
        steps = sorted({int(r[label + "_step"]) for r in results})
        print(f"   {label:<11} {t:6.2f} s  step {steps}  {what}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--params", type=int, default=96 * 2**20, help="parameters (x12 bytes)")
    p.add_argument("--restore-params", type=int, default=16 * 2**20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step-s", type=float, default=2.0, help="compute after each save")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--parts", default="restore,stall,lost", help="which parts to run")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rg-ckpt-bench-", dir=args.dir))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU(s), scratch {root}")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    parts = set(args.parts.split(","))
    try:
        if "restore" in parts:
            restore(args, root)  # forks: before this process starts threads
        import torch.distributed as dist

        # one rank, as a job would have: DCP's checkpoint process joins its group
        dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=0, world_size=1)
        if "stall" in parts:
            stall(args, root)
        if "lost" in parts:
            steps_lost(args, root)
        dist.destroy_process_group()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
