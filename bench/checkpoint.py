"""Checkpoint stall, steps lost on a crash, and restore time (rankguard.checkpoint).

What, in one run on CPU:

1. The real stall per save, every path on the same state, in one run: an MLP of
   ``--params`` parameters, an EMA copy of it and AdamW's moments (16 bytes per
   parameter: 1.21 GB by default). Every step is a forward/backward, ``optimizer.step()``
   and an EMA update of the copy in place (``torch._foreach_lerp_``): the loop changes
   the state right after a save returns, as real loops do. Per save:

   - ``blocked``: the time in the save call;
   - ``extra``: what the following steps took beyond the median step without a save
     (``--base-steps`` steps measured right before each save), summed over the steps
     run while the write was in flight (at least ``--follow``): a copy moved out of the
     call, or the background write competing for the cores, shows here;
   - ``total`` = blocked + extra, and its share of the sync save's total.

   Paths (``--paths``): ``sync`` (``CheckpointManager.save`` with ``async_save=false``:
   DCP ``save``, manifest, commit); ``rankguard async (thread)`` and ``(process)``
   (``async_save=true`` and DCP's thread or checkpoint process); ``rankguard async
   (thread, idle)`` (the thread writer with ``async_write_priority=idle``: its write in
   ``SCHED_IDLE`` for at most ``--idle-max-s``); DCP's ``async_save`` called directly with
   its default staging (a new ``DefaultStager`` each call: copy in the call) and with
   ``StagingOptions(use_async_staging=True)`` (one ``DefaultStager`` kept across saves:
   the copy runs in DCP's staging thread; the loop waits for ``staging_completion``
   before its first change of the state, the optimizer step after the next
   forward/backward, as DCP requires: that wait is in ``extra``). The other
   ``StagingOptions`` (pinned memory, non-blocking copies) need a GPU
   (``bench/gpu_check.py``). The first save of each path allocates its buffers (and
   starts DCP's process): shown, not counted. The paths' saves are alternated, one
   save of each path a round, so that every path sees the same load of the machine;
   ``write``: from the save call to the checkpoint durable (committed or, for DCP's
   direct calls, written).

   Every figure is for a checkpoint that passed the consistency check in the same run:
   at the save call (outside the timed part) the CRC-32 of every tensor's bytes and a
   copy of every other item are taken; after the write the checkpoint is loaded with
   ``dcp.load`` into fresh tensors and must match exactly. A path with a mismatch is
   printed as INCONSISTENT and the run exits 1.
2. Steps lost on a crash: a loop of ``--steps`` small steps saving the persistent tier
   every ``--every`` steps, or the local tier every step (async); a crash at every step
   in turn loses ``step - last_committed`` steps; the mean and max are measured from the
   manager's ``last_committed`` at that instant.
3. Restore time with 2 ranks (forked processes on gloo, each with a ``--restore-params``
   model): ``load_latest`` from each rank's own local shard, from a peer's replica (one
   node's local directory deleted), and from the persistent tier (both deleted).
4. CPU per async save (``--parts cpu``): rankguard's thread writer and DCP's two options
   on the same state, the loop idle: the process's CPU time (every thread's) from the
   save call to the end of the write, the copy included: what a save takes from the
   training's cores, a figure the machine's load hardly moves (the wall times of part
   1 it does). Every checkpoint is checked as in part 1. The process writer is left
   out (its CPU is in another process).

Run: ``python bench/checkpoint.py`` (about 10-15 minutes on 2 loaded cores; needs ~5 GB
of memory and ~3 GB of disk under ``--dir``, removed at the end).
``python bench/checkpoint.py --smoke``: a 1 M parameter state, one save per path, the
thread paths only, parts 1 and 4 only (seconds; CI runs it).
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

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


class Loop:
    """The training loop of part 1: model, EMA copy, AdamW; one step at a time."""

    def __init__(self, params: int, width: int) -> None:
        layers = max(1, params // (width * width))
        torch.manual_seed(0)

        def mlp() -> torch.nn.Module:
            return torch.nn.Sequential(
                *[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
            )

        self.model, self.ema = mlp(), mlp()
        self.ema.load_state_dict(self.model.state_dict())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.params = list(self.model.parameters())
        self.ema_params = list(self.ema.parameters())
        self.x = torch.randn(16, width)
        self.step()  # allocates the moments

    @property
    def state(self) -> dict[str, Any]:
        return {"model": self.model, "ema": self.ema, "optim": self.opt}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds (as the manager and the direct DCP calls save it)."""
        return {
            "model": get_model_state_dict(self.model),
            "ema": get_model_state_dict(self.ema),
            "optim": get_optimizer_state_dict(self.model, self.opt),
        }

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self.state_dict()))

    def step(self, before_change: Callable[[], None] | None = None) -> float:
        """forward, backward, optimizer step, EMA update; its seconds.
        ``before_change`` runs before the first change of the state."""
        t0 = time.perf_counter()
        self.model(self.x).pow(2).mean().backward()
        if before_change is not None:
            before_change()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_lerp_(self.ema_params, self.params, 0.01)
        return time.perf_counter() - t0


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def fingerprint(obj: Any) -> Any:
    """The CRC-32 (with dtype and shape) of every tensor's bytes; other items copied."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        return ("tensor", str(t.dtype), tuple(t.shape), zlib.crc32(data))
    if isinstance(obj, dict):
        return {k: fingerprint(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [fingerprint(v) for v in obj]
    return copy.deepcopy(obj)


def empty_like(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj)
    if isinstance(obj, dict):
        return {k: empty_like(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [empty_like(v) for v in obj]
    return copy.deepcopy(obj)


def loads_as(path: Path, loop: Loop, expected: Any) -> bool:
    """``path``'s checkpoint, loaded into fresh tensors, matches ``expected``."""
    target = empty_like(loop.state_dict())
    dcp.load(target, checkpoint_id=str(path))
    return fingerprint(target) == expected


class Saver:
    """One way to save: ``start(step)`` returns when the save call returns; ``done()``
    tells whether the write finished; ``finish()`` waits for it and returns the
    checkpoint's directory; ``before_change`` is what the loop must call before its
    first change of the state after a save (DCP's async staging only)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before_change: Callable[[], None] | None = None

    def start(self, step: int) -> None:
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def finish(self, step: int) -> Path:
        raise NotImplementedError

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Ours(Saver):
    def __init__(self, root: Path, loop: Loop, **kw: Any) -> None:
        super().__init__(root)
        config = CheckpointConfig(save=str(root), most_recent_k=1, **kw)
        self.m = CheckpointManager(config, loop.state, job_id="bench", session=False)

    def start(self, step: int) -> None:
        self.m.save(step)

    def done(self) -> bool:
        return not self.m.in_flight

    def finish(self, step: int) -> Path:
        self.m.wait()
        assert self.m.last_committed["persistent"] == step
        return self.root / f"step_{step:09d}"

    def close(self) -> None:
        self.m.close()
        super().close()


class Direct(Saver):
    """``dcp.async_save`` called directly (no manifest, no commit)."""

    def __init__(self, root: Path, loop: Loop, options: StagingOptions | None) -> None:
        super().__init__(root)
        self.loop = loop
        self.stager = DefaultStager(options) if options is not None else None
        self.upload: Future[Any] | None = None
        self.staging: Future[Any] | None = None

    def start(self, step: int) -> None:
        response = dcp.async_save(
            self.loop.state_dict(),
            checkpoint_id=str(self.root / f"step_{step:09d}"),
            async_stager=self.stager,
        )
        if isinstance(response, Future):
            self.upload, self.staging = response, None
            self.before_change = None
        else:
            self.upload, self.staging = response.upload_completion, response.staging_completion
            self.before_change = self._wait_staging

    def _wait_staging(self) -> None:
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def done(self) -> bool:
        return self.upload is None or self.upload.done()

    def finish(self, step: int) -> Path:
        assert self.upload is not None
        self.upload.result()
        old = self.root / f"step_{step - 1:09d}"
        shutil.rmtree(old, ignore_errors=True)
        return self.root / f"step_{step:09d}"

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()
        super().close()


class Sync(Ours):
    def done(self) -> bool:
        return True


PATHS = ("sync", "thread", "idle", "process", "dcp-default", "dcp-async")


def stall_paths(args: argparse.Namespace, loop: Loop) -> list[tuple[str, Callable[[Path], Saver]]]:
    """The paths of part 1 that ``--paths`` names, in the table's order."""
    idle = {"async_write_priority": "idle", "async_idle_max_s": args.idle_max_s}
    every: dict[str, tuple[str, Callable[[Path], Saver]]] = {
        "sync": ("sync", lambda d: Sync(d, loop, async_save=False)),
        "thread": (
            "rankguard async (thread)",
            lambda d: Ours(d, loop, async_save=True, async_write_priority="normal"),
        ),
        "idle": (
            "rankguard async (thread, idle)",
            lambda d: Ours(d, loop, async_save=True, **idle),
        ),
        "process": (
            "rankguard async (process)",
            lambda d: Ours(d, loop, async_save=True, async_checkpointer_type="process"),
        ),
        "dcp-default": ("DCP async_save, default staging", lambda d: Direct(d, loop, None)),
        "dcp-async": (
            "DCP async_save, use_async_staging",
            lambda d: Direct(d, loop, StagingOptions(False, False, True, False)),
        ),
    }
    wanted = args.paths.split(",")
    unknown = sorted(set(wanted) - set(PATHS))
    if unknown or "sync" not in wanted:
        raise SystemExit(f"--paths: names from {list(PATHS)}, sync among them; got {unknown}")
    return [every[name] for name in PATHS if name in wanted]


def save_once(args: argparse.Namespace, loop: Loop, path: Saver, step: int) -> dict[str, Any]:
    """One save of ``path`` in the loop: blocked, extra, write (to durable), steps, and
    whether the checkpoint holds the state at the call."""
    # measured right before each save: the machine's load drifts between saves
    base = statistics.median(loop.step() for _ in range(args.base_steps))
    expected = fingerprint(loop.state_dict())  # the state at the save call
    t0 = time.perf_counter()
    path.start(step)
    blocked = time.perf_counter() - t0
    extra, steps = 0.0, 0
    hook = path.before_change
    while steps < args.follow or (not path.done() and steps < args.max_follow):
        extra += loop.step(hook) - base
        hook = None
        steps += 1
    saved = path.finish(step)
    write = time.perf_counter() - t0
    ok = loads_as(saved, loop, expected)
    return {"base": base, "blocked": blocked, "extra": extra, "write": write, "n": steps, "ok": ok}


def stall(args: argparse.Namespace, root: Path) -> bool:
    loop = Loop(args.params, args.width)
    size = loop.nbytes()
    print(
        f"\n1. Real stall per save: {size / 1e9:.2f} GB of state ({args.params / 1e6:.0f} M "
        "parameters, an EMA copy, AdamW moments); each step: forward/backward, AdamW step, "
        "EMA update in place; the paths' saves alternated (one save of each path a round)"
    )
    savers = [
        (label, make(root / f"path{i}")) for i, (label, make) in enumerate(stall_paths(args, loop))
    ]
    rows: dict[str, dict[str, list[float]]] = {}
    consistent: dict[str, list[bool]] = {}
    for n in range(args.repeats + 1):
        step = 10 * (n + 1)
        for label, path in savers:
            got = save_once(args, loop, path, step)
            consistent.setdefault(label, []).append(got["ok"])
            print(
                f"   round {n} {label}: step {got['base']:.2f} s, blocked {got['blocked']:.3f} s, "
                f"extra {got['extra']:.3f} s over {got['n']} steps, write {got['write']:.2f} s, "
                f"{'consistent' if got['ok'] else 'INCONSISTENT'}, load "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if n == 0:  # allocates the buffers (and starts DCP's process)
                print(
                    f"   {label}: first save {got['blocked']:.2f} s blocked (warm-up, not "
                    f"counted){'' if got['ok'] else ', INCONSISTENT'}"
                )
                continue
            row = rows.setdefault(
                label, {k: [] for k in ("base", "blocked", "extra", "write", "n")}
            )
            for key in ("base", "blocked", "write"):
                row[key].append(got[key])
            row["extra"].append(max(got["extra"], 0.0))
            row["n"].append(float(got["n"]))
    for _, path in savers:
        path.close()
    return stall_table(args, rows, consistent)


def stall_table(
    args: argparse.Namespace,
    rows: dict[str, dict[str, list[float]]],
    consistent: dict[str, list[bool]],
) -> bool:
    sync_total = statistics.median(
        b + e for b, e in zip(rows["sync"]["blocked"], rows["sync"]["extra"], strict=True)
    )
    print(f"   median of {args.repeats} save(s) per path; 'extra': following steps beyond")
    print("   the median step without a save (negative sums count as 0); 'write': the save")
    print("   call to the checkpoint durable (committed)")
    print(
        f"   {'path':<34} {'step s':>6} {'blocked s':>9} {'extra s':>8} {'total s':>8} "
        f"{'% sync':>7} {'write s':>8} {'steps':>5}  check"
    )
    totals: dict[str, float] = {}
    for label, row in rows.items():
        b, e = statistics.median(row["blocked"]), statistics.median(row["extra"])
        t = statistics.median(x + y for x, y in zip(row["blocked"], row["extra"], strict=True))
        totals[label] = t
        checks = consistent[label]
        verdict = f"{sum(checks)}/{len(checks)} consistent"
        print(
            f"   {label:<34} {statistics.median(row['base']):6.2f} {b:9.3f} {e:8.3f} {t:8.3f} "
            f"{100 * t / sync_total:6.1f}% {statistics.median(row['write']):8.2f} "
            f"{statistics.median(row['n']):5.0f}  {verdict}"
        )
    bad = [label for label, checks in consistent.items() if not all(checks)]
    dcp = [t for label, t in totals.items() if label.startswith("DCP")]
    dcp_best = min(dcp) if dcp else None
    for label in ("rankguard async (thread)", "rankguard async (thread, idle)"):
        if label not in totals:
            continue
        ours = totals[label]
        versus = (
            ""
            if dcp_best is None
            else f"; DCP's best option {dcp_best:.3f} s (rankguard "
            f"{'below' if ours < dcp_best else 'NOT below'} it)"
        )
        print(
            f"   verdict: {label} total stall {ours:.3f} s = {100 * ours / sync_total:.1f}% "
            f"of the sync save (goal <= 5%: {'met' if ours <= 0.05 * sync_total else 'NOT met'})"
            f"{versus}"
        )
    if bad:
        print(f"   INCONSISTENT checkpoints: {bad}")
    return not bad


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


def _process_cpu() -> float:
    """This process's CPU time, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_per_save(args: argparse.Namespace, root: Path) -> bool:
    """Part 4: the CPU one async save costs the process, with the loop idle."""
    loop = Loop(args.params, args.width)
    print(
        f"\n4. CPU per async save, the loop idle: {loop.nbytes() / 1e9:.2f} GB; the "
        "process's CPU (all threads) from the save call to the end of the write"
    )
    makers: list[tuple[str, Callable[[Path], Saver]]] = [
        ("rankguard async (thread)", lambda d: Ours(d, loop, async_save=True)),
        ("DCP async_save, default staging", lambda d: Direct(d, loop, None)),
        (
            "DCP async_save, use_async_staging",
            lambda d: Direct(d, loop, StagingOptions(False, False, True, False)),
        ),
    ]
    ok = True
    for i, (label, make) in enumerate(makers):
        path = make(root / f"cpu{i}")
        cpus, checks = [], []
        for n in range(args.repeats + 1):
            step = 10 * (n + 1)
            loop.step()
            expected = fingerprint(loop.state_dict())
            c0 = _process_cpu()
            path.start(step)
            if path.before_change is not None:
                path.before_change()
            saved = path.finish(step)
            cpu = _process_cpu() - c0
            checks.append(loads_as(saved, loop, expected))
            if n:  # the first allocates the buffers
                cpus.append(cpu)
        path.close()
        ok = ok and all(checks)
        print(
            f"   {label:<34} median {statistics.median(cpus):5.2f} s "
            f"({', '.join(f'{c:.2f}' for c in cpus)})  {sum(checks)}/{len(checks)} consistent"
        )
    print(f"   load average after: {os.getloadavg()[0]:.1f}")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--params", type=int, default=72 * 2**20, help="parameters (x16 bytes)")
    p.add_argument("--width", type=int, default=2048, help="width of the MLP's layers")
    p.add_argument("--restore-params", type=int, default=16 * 2**20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--base-steps", type=int, default=5, help="steps timed without a save")
    p.add_argument("--follow", type=int, default=3, help="steps timed after a save, at least")
    p.add_argument("--max-follow", type=int, default=60, help="... at most (write in flight)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--parts", default="restore,stall,cpu,lost", help="which parts to run")
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"part 1's paths, from {','.join(PATHS)} (sync needed: the reference)",
    )
    p.add_argument(
        "--idle-max-s", type=float, default=30.0, help="the idle path's async_idle_max_s"
    )
    p.add_argument("--smoke", action="store_true", help="seconds: a tiny state, no restore")
    args = p.parse_args()
    if args.smoke:
        args.params, args.width, args.repeats = 2**20, 256, 1
        args.base_steps, args.follow, args.steps, args.every = 2, 1, 6, 3
        args.parts = "stall,cpu"
        args.paths = "sync,thread,idle,dcp-default,dcp-async"
    root = Path(tempfile.mkdtemp(prefix="rg-ckpt-bench-", dir=args.dir))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU(s), scratch {root}")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    parts = set(args.parts.split(","))
    ok = True
    try:
        if "restore" in parts:
            restore(args, root)  # forks: before this process starts threads
        import torch.distributed as dist

        # one rank, as a job would have: DCP's checkpoint process joins its group
        dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=0, world_size=1)
        if "stall" in parts:
            ok = stall(args, root)
        if "cpu" in parts:
            ok = cpu_per_save(args, root) and ok
        if "lost" in parts:
            steps_lost(args, root)
        dist.destroy_process_group()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
