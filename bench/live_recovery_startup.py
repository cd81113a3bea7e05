"""Start-up with standbys: launch -> the group's first step with ``--standby-ranks 0``
and ``--standby-ranks 1``, with and without ``--preload torch``, runs alternated.

What: ``live_recovery_job.py --model mlp`` (``--nproc`` CPU ranks on gloo, DDP) under
``rankguard run --standalone`` with in-process restart on (``bench/live_recovery.py``'s
``LIVE_SETS``) and heartbeats on, ``--steps`` steps, no fault. Figure: the launcher's
start -> the first ``LRSTEP`` line of step 1 (any rank; the job prints it after the
first optimizer step), and the whole run's wall. With 1 standby the standby is a worker
process started with the ranks (torch elastic's local world is the ranks + the
standbys): on a loaded machine it competes with them for the CPUs while they start.

Run: ``python bench/live_recovery_startup.py [--repeats 5] [--nproc 4]``; the order of
the four configurations is rotated each repeat. ``--smoke``: one run, 2 ranks, 3 steps,
1 standby with ``--preload torch`` (it proves the script, not the claim). Figures are
wall seconds that grow with the machine's load (``os.getloadavg``, printed with each
run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import live_recovery as lr
from restart import HEARTBEAT_SETS, reap_leftovers


def launch_cmd(workdir: Path, nproc: int, steps: int, standbys: int, preload: bool) -> list[str]:
    cmd = [sys.executable, "-u", "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "--log-dir", str(workdir / "logs")]
    cmd += ["--rdzv-id", f"st-{workdir.name}", "--standby-ranks", str(standbys)]
    if preload:
        cmd += ["--preload", "torch"]
    for item in [*HEARTBEAT_SETS, *lr.LIVE_SETS]:
        cmd += ["--set", item]
    job = [lr.JOB, "--model", "mlp", "--steps", str(steps), "--ckpt-dir", str(workdir / "ckpt")]
    return [*cmd, *job, "--pg-timeout", str(lr.PG_TIMEOUT_S)]


def one(nproc: int, steps: int, standbys: int, preload: bool, timeout_s: float) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="rg-lrstart-"))
    lines: list[tuple[float, str]] = []
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.Popen(
        launch_cmd(workdir, nproc, steps, standbys, preload),
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LOGLEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    reader = threading.Thread(target=lr._reader, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        rc = proc.wait()
    wall = time.time() - t0
    reader.join(5)
    reap_leftovers(str(workdir))
    shutil.rmtree(workdir, ignore_errors=True)
    run = lr.Run("start", "none", 0, 0, workdir, lines=list(lines))
    firsts = [ev["t"] for tag, ev in lr.events(run) if tag == "LRSTEP" and int(ev["s"]) == 1]
    first = min(firsts) - t0 if firsts else float("nan")
    if rc != 0 or not firsts:
        print("".join(f"    {x}\n" for _, x in lines[-20:]), end="")
    return {"first_step_s": first, "wall_s": wall, "rc": rc, "load": load}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0, help="per run (s)")
    p.add_argument("--no-plain", action="store_true", help="only the --preload runs")
    p.add_argument("--smoke", action="store_true", help="1 run: 2 ranks, 1 standby, --preload")
    args = p.parse_args(argv)
    lr.header(args.smoke, job="")
    configs = [(k, pre) for pre in (True, False) for k in (0, 1)]
    if args.no_plain:
        configs = [c for c in configs if c[1]]
    if args.smoke:
        args.repeats, args.nproc, args.steps, configs = 1, 2, 3, [(1, True)]
    got: dict[tuple[int, bool], list[dict[str, float]]] = {c: [] for c in configs}
    for i in range(args.repeats):
        shift = i % len(configs)
        for k, pre in configs[shift:] + configs[:shift]:
            res = one(args.nproc, args.steps, k, pre, args.timeout)
            got[(k, pre)].append(res)
            print(
                f"  run {i + 1}: standbys {k}{' --preload torch' if pre else ''}: launch -> "
                f"first step {res['first_step_s']:.2f}s, wall {res['wall_s']:.1f}s, exit "
                f"{res['rc']:g}, load {res['load']:.2f}",
                flush=True,
            )
    print()
    for (k, pre), runs in got.items():
        firsts = [r["first_step_s"] for r in runs if r["rc"] == 0 and r["first_step_s"] > 0]
        if not firsts:
            print(f"standbys {k}{' --preload torch' if pre else ''}: no run completed")
            continue
        print(
            f"standbys {k}{' --preload torch' if pre else '':16s}: launch -> first step median "
            f"{statistics.median(firsts):.2f}s, min {min(firsts):.2f}s, max {max(firsts):.2f}s "
            f"({len(firsts)} of {len(runs)} runs)"
        )
    failed = any(r["rc"] != 0 or not r["first_step_s"] > 0 for runs in got.values() for r in runs)
    return 1 if args.smoke and failed else 0


if __name__ == "__main__":
    sys.exit(main())
