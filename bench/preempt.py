"""Preemption: cost of the per-step check when no signal came, the collective it
replaces, and signal -> every rank exited with the checkpoint committed.

1. ``session.should_stop()`` with preemption on and no signal (ns per call), against an
   empty Python call: the goal is < 1 us per step.
2. The alternative: an OR-reduce of the flag (gloo ``all_reduce`` of one int, 2 ranks)
   every N steps: us per check and per step at N = 1, 10, 100.
3. A real job (``rankguard run``, 2 CPU ranks, the demo with a checkpoint directory):
   SIGTERM to the launcher mid-run -> every rank saved and exited (their ``process_end``
   records), the launcher's exit (code 14, after the monitor's drain), the committed
   step, against ``preemption.preempt_time`` (60 s); at the default heartbeat interval
   (5 s) and at 0.5 s (the stop step's lead is two intervals plus two scans plus 1 s).

Run: ``python bench/preempt.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import timeit
from datetime import timedelta
from pathlib import Path

from rankguard.checkpoint.files import COMMIT_MARKER

N_CALLS = 2_000_000


def bench_check() -> tuple[float, float]:
    from rankguard.monitor.config import HeartbeatConfig
    from rankguard.preempt import PreemptionConfig
    from rankguard.preempt.rank import RankPreemption
    from rankguard.rank.identity import RankIdentity
    from rankguard.rank.timeline import ProgressTracker
    from rankguard.session import Session

    tracker = ProgressTracker()
    pre = RankPreemption(PreemptionConfig(enable_exit_handler=True), tracker)
    pre.install()
    with tempfile.TemporaryDirectory() as d:
        session = Session(
            RankIdentity.from_env({}),
            Path(d),
            HeartbeatConfig(),
            tracker=tracker,
            publish=False,
            preemption=pre,
        )
        check = session.should_stop
        check()  # the first question turns the handler on

        def empty() -> bool:
            return False

        best = min(timeit.repeat(check, number=N_CALLS, repeat=5)) / N_CALLS * 1e9
        base = min(timeit.repeat(empty, number=N_CALLS, repeat=5)) / N_CALLS * 1e9
        session.close()
    return best, base


def _collective_worker(rank: int, port: int, n: int, out: str, world: int = 2) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    flag = torch.zeros(1, dtype=torch.int32)
    for _ in range(50):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        bool(flag.item())
    per = (time.perf_counter() - t0) / n
    if rank == 0:
        Path(out).write_text(str(per))
    dist.destroy_process_group()


def bench_collective(n: int, world: int = 2) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "per")
        if world == 1:  # --smoke: the one rank is this process (no interpreter to start)
            _collective_worker(0, port, n, out, world)
        else:
            mp.start_processes(
                _collective_worker, args=(port, n, out, world), nprocs=world, start_method="spawn"
            )
        return float(Path(out).read_text())


def _records(root: Path) -> list[dict]:
    out = []
    for path in root.glob("logs/heartbeat/*/rank_*.heartbeat.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                out.append(json.loads(line))
    return out


def bench_job(
    publish_s: float,
    after_s: float = 1.0,
    *,
    nproc: int = 2,
    trained: int = 20,
    step_sleep: float = 0.02,
    scan_s: float | None = None,
) -> dict[str, float | int | None]:
    """SIGTERM to the launcher of a training job -> the ranks' ends and the launcher's
    (``nproc`` ranks, signalled ``after_s`` after one has done ``trained`` steps; ``scan_s``:
    the monitor's scan interval, else its default)."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        ckpt = root / "ckpt"
        cmd = [
            sys.executable, "-m", "rankguard.cli.main", "run", "--standalone",
            "--nproc-per-node", str(nproc), "--log-dir", str(root / "logs"),
            "--set", "heartbeat.enabled=true",
            "--set", f"heartbeat.publish_interval_s={publish_s}",
            "--set", "preemption.enable_exit_handler=true",
            *(["--set", f"heartbeat.scan_interval_s={scan_s:g}"] if scan_s else []),
            "-m", "rankguard.demo.train", "--steps", "100000", "--step-sleep", f"{step_sleep:g}",
            "--checkpoint-dir", str(ckpt),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        # signal a job that trains, not one still setting up
        while not any(r.get("progress_seq", 0) >= trained for r in _records(root)):
            assert time.monotonic() < deadline, "no rank trains"
            time.sleep(0.2)
        time.sleep(after_s)
        t0, wall0 = time.monotonic(), time.time_ns()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - t0
        ends = [r["wall_time_ns"] for r in _records(root) if r.get("event") == "process_end"]
        steps = sorted(  # committed checkpoints: step_<N>/COMMITTED
            int(p.name[5:]) for p in ckpt.glob("step_*") if (p / COMMIT_MARKER).is_file()
        )
        return {
            "ranks_s": (max(ends) - wall0) / 1e9 if len(ends) == nproc else None,
            "exit_s": took,
            "code": code,
            "saved_step": steps[-1] if steps else None,
        }


def _n_ranks(n: int, kind: str = "") -> str:
    return f"{n} {kind}rank{'' if n == 1 else 's'}"


def main() -> int:
    import argparse

    global N_CALLS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny loops, the collective on 1 rank (this process), one 1-rank job signalled "
        "after 2 steps, its monitor scanning every 0.2 s (seconds)",
    )
    smoke = ap.parse_args().smoke
    world, nproc = 2, 2
    job_args: dict[str, float] = {}
    if smoke:
        N_CALLS = 20_000
        world, nproc = 1, 1
        # the monitor scans every 0.2 s: the stop step's lead (two scans plus 1 s) and the
        # launcher's drain shorter; the path is the same
        job_args = {"after_s": 0.2, "trained": 2, "step_sleep": 0.3, "scan_s": 0.2}
    ns, base = bench_check()
    print(f"should_stop(), no signal: {ns:.1f} ns/call (empty call {base:.1f} ns); goal < 1000 ns")
    per = bench_collective(50 if smoke else 2000, world)
    print(f"gloo all_reduce of the flag, {_n_ranks(world)}: {per * 1e6:.1f} us per check")
    for n in (1, 10, 100):
        print(f"  every {n:>3} steps: {per * 1e6 / n:.2f} us per step")
    ok = ns < 1000
    for publish_s in (0.5,) if smoke else (5.0, 0.5):
        job = bench_job(publish_s, nproc=nproc, **job_args)
        ranks = "-" if job["ranks_s"] is None else f"{job['ranks_s']:.1f} s"
        print(
            f"rankguard run, {_n_ranks(nproc, 'CPU ')}, "
            f"heartbeat.publish_interval_s={publish_s:g}: SIGTERM "
            f"-> every rank saved and exited {ranks}, launcher exit {job['exit_s']:.1f} s "
            f"(code {job['code']}, committed step {job['saved_step']}); preempt_time 60 s"
        )
        ok = ok and job["code"] == 14 and job["saved_step"] is not None
        ok = ok and (not smoke or job["ranks_s"] is not None)  # every rank's process_end
    print(f"verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
