"""No orphans: seconds from a SIGKILL of ``rankguard run`` to the last process of its
job gone (ranks, and ``--preload``'s fork server).

What: the demo (``rankguard.demo.train``, 2 CPU ranks, gloo, heartbeat every 0.5 s)
runs until the monitor says "running"; then the launcher gets SIGKILL (it cannot handle
it) and is reaped at once, as a shell would. The end is the first poll (every 10 ms)
that finds no live process with the run's ``RANKGUARD_RUN_ID`` in its environment.
Modes: ranks started as subprocesses (their parent is the launcher) and ``--preload
torch`` (their parent is the fork server). A run with a survivor after ``--limit``
seconds is a failure (the survivors are then killed).

Run: ``python bench/orphans.py [--repeats 5]`` (about 10 s per run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
]


def live_processes(run_id: str) -> list[int]:
    """Live (not zombie) processes with ``RANKGUARD_RUN_ID=run_id`` in their environment."""
    needle = f"RANKGUARD_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def one_run(mode: str, index: int, limit_s: float, nproc: int = 2) -> float | None:
    run_id = f"orphans-{mode}-{index}-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rankguard.cli.main", "run", "--standalone"]
        cmd += ["--nproc-per-node", str(nproc), "--rdzv-id", run_id, "--log-dir", tmp]
        for item in FAST:
            cmd += ["--set", item]
        if mode == "preload":
            cmd += ["--preload", "torch"]
        cmd += ["-m", "rankguard.demo.train", "--steps", "100000"]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        status = Path(tmp) / "heartbeat" / run_id / "status.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if json.loads(status.read_text())["state"] == "running":
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        else:
            proc.kill()
            proc.wait()
            raise SystemExit(f"{run_id}: never reached the running state")
        before = len(live_processes(run_id))  # not the launcher: it sets the variable later
        t0 = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        while live_processes(run_id):
            if time.monotonic() - t0 > limit_s:
                left = live_processes(run_id)
                for pid in left:
                    os.kill(pid, signal.SIGKILL)
                print(f"  {mode} #{index}: {len(left)} process(es) left after {limit_s} s")
                return None
            time.sleep(0.01)
        took = time.monotonic() - t0
        print(f"  {mode} #{index}: {before} worker process(es) gone {took:.3f} s after SIGKILL")
        return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit", type=float, default=30.0, help="seconds before a run fails")
    p.add_argument("--modes", default="subprocess,preload")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one run per mode, 1 rank (seconds); exit 1 if a process is left",
    )
    args = p.parse_args()
    nproc, failed = 2, False
    if args.smoke:
        args.repeats, nproc = 1, 1
    for mode in args.modes.split(","):
        times = [one_run(mode, i, args.limit, nproc) for i in range(args.repeats)]
        failed = failed or None in times
        ok = [t for t in times if t is not None]
        median = f"{statistics.median(ok):.3f} s" if ok else "-"
        span = f" ({min(ok):.3f}-{max(ok):.3f})" if ok else ""
        print(
            f"{mode}: SIGKILL -> last worker gone: median {median}{span}, "
            f"{len(ok)}/{len(times)} runs left no process within {args.limit} s"
        )
    return 1 if args.smoke and failed else 0


if __name__ == "__main__":
    sys.exit(main())
