"""Restart reliability: the crash scenario of ``restart.py`` many times in a row.

What: ``rankguard run --standalone --nproc-per-node 2 --max-restarts 1`` on the demo with
rank 1 crashing at step 5 (checkpoint every 3 steps), ``--runs`` times (default 20);
optionally (``--torchrun``) the same loop under ``python -m torch.distributed.run
--standalone --max-restarts 1`` (``--torchrun-runs``, default 10) for comparison. A run
counts as completed when the launcher exits 0 after the restarted job resumed from the
checkpoint, logged a step and finished, within ``--timeout`` seconds, leaving no process
behind. Prints completed/attempted, the median crash-to-first-step of the completed runs
(line arrival times, as in ``restart.py``) and why each failed run failed.

Why: torchrun's in-job restarts are flaky: in an earlier bench run on this kind of
machine its restart on gloo failed with the static rendezvous and hung once in init with
``--standalone``. Goal: 20/20 restarts complete.

Hygiene: every run has its own temp dir (log dir, checkpoints) and rendezvous id, a hard
timeout (SIGTERM to the launcher's process group, SIGKILL 10 s later), and afterwards any
``rankguard.launcher.worker`` / ``rankguard.demo.train`` (or torchrun) process whose
command line holds that run's temp dir is reported as left behind and SIGKILLed. Other
people's processes (same machine, other temp dirs) are never looked at or touched.

Run: ``python bench/restart_loop.py [--runs 20] [--preload] [--torchrun --torchrun-runs 10]``
(``--preload``: ``rankguard run --preload torch``; ``--smoke``: one run with
``--preload``, 1 rank, 3 steps)
(~8-12 s per completed run on a quiet machine, up to ``--timeout`` per hung one).
``--env KEY=VALUE`` runs with extra environment, for diagnosis only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

import restart
from restart import (
    PRELOAD,
    Result,
    analyse,
    finish,
    header,
    parse_env,
    progress_line,
    run_job,
    smoke_job,
)


def classify(r: Result) -> str:
    """A short failure class for the summary."""
    if r.ok:
        return "ok"
    if r.job.timed_out:
        if "resumed" in r.t:
            return "timed out after the resume"
        if "rendezvous_done" in r.t:
            return "hung after the restart (no resumed step): killed at the timeout"
        return "timed out before any restart"
    if "connectFullMesh failed" in r.why:
        reason = "Connection refused" if "Connection refused" in r.why else "connect timeout"
        return f"restarted group died in init_process_group: gloo connectFullMesh ({reason})"
    if r.job.leftovers:
        return "processes left behind"
    return f"other: {r.why[:120]}"


def loop(launcher: str, runs: int, args: argparse.Namespace, env: dict[str, str]) -> bool:
    """``runs`` crash runs; True when every one completed."""
    print(
        f"\n{launcher}: {runs} runs, crash at step {restart.FAULT_STEP}, --max-restarts 1, "
        f"timeout {args.timeout}s"
    )
    results: list[Result] = []
    for i in range(runs):
        job = run_job(launcher, "crash", timeout_s=args.timeout, extra_env=env, tag=f"loop{i}")
        res = analyse(job)
        results.append(res)
        left = ", ".join(job.leftovers) if job.leftovers else "none left"
        print(f"{i + 1:3d}{progress_line(res)[1:]} [{left}]", flush=True)
        finish(job, args.keep, res.ok)
    ok = [r for r in results if r.ok]
    figs = [r.figure for r in ok if r.figure is not None]
    print(f"\n{launcher}: {len(ok)}/{len(results)} restarts completed")
    if figs:
        print(
            f"{launcher}: crash -> first step after restart, median {statistics.median(figs):.2f}s "
            f"[{min(figs):.2f}-{max(figs):.2f}] over {len(figs)} completed run(s)"
        )
    classes = Counter(classify(r) for r in results if not r.ok)
    for reason, n in classes.most_common():
        print(f"  {n:2d} x {reason}")
    leftover_runs = sum(1 for r in results if r.job.leftovers)
    print(f"{launcher}: runs that left processes behind: {leftover_runs}")
    print(
        f"goal: {runs}/{runs} restarts complete -> {len(ok)}/{runs}: "
        + ("MEETS" if len(ok) == runs else "MISSES")
    )
    return len(ok) == runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="rankguard runs (0: none)")
    p.add_argument(
        "--preload", action="store_true", help="rankguard run --preload torch (forked ranks)"
    )
    p.add_argument("--torchrun", action="store_true", help="also loop torchrun --standalone")
    p.add_argument("--torchrun-runs", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0, help="hard limit per run (s)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE, diagnosis only")
    p.add_argument("--keep", action="store_true", help="keep every run's temp dir")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one rankguard run with --preload, 1 rank, 3 steps (seconds)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        # --preload: restart.py's smoke runs the same job without it; here the restarted
        # rank is forked from the fork server, not an interpreter importing torch
        args.runs, args.torchrun, args.preload = 1, False, True
        smoke_job()
    env = parse_env(args.env)
    header(env, smoke=args.smoke)
    all_ok = True
    if args.runs:
        all_ok = loop(PRELOAD if args.preload else "rankguard", args.runs, args, env)
    if args.torchrun and args.torchrun_runs:
        loop("torchrun", args.torchrun_runs, args, env)
    return 1 if args.smoke and not all_ok else 0


if __name__ == "__main__":
    sys.exit(main())
