"""Soak: one job, a fault every ``--interval`` seconds (default 15), ``--faults`` of them
(default 200): the job must finish with the uninterrupted run's final loss (within 1 %),
leave no process behind and no file that does not parse; each recovery's cost is listed.

What: ``live_recovery_job.py --model mlp`` (a tiny MLP in DDP, ``--nproc`` CPU ranks on
gloo, data fixed by step and rank, a checkpoint every ``--ckpt-every`` steps) under
``rankguard run``: with ``--standby-ranks 1`` and in-process restart on (``--mode
live``: an exception re-enters in process, a lost process is replaced by a standby) or
today's group restart (``--mode rankguard``, the default and the smoke run's:
``--max-restarts`` and fault tolerance's in-job restarts both ``--faults`` + 5); both
with heartbeats on (``process_timeout_s`` 3 s) and fault tolerance on. Each fault's kind
(exception, SIGKILL, SIGSTOP) and rank are drawn from ``--seed``;
the bench finds the rank's process from the pid file the job keeps per rank, and sends
SIGUSR1 (the rank raises at its next step), SIGKILL, or SIGSTOP (never a SIGCONT: the
stopped rank stays stopped until rankguard ends it, past its timeout: the bench stops it
again if something lets it run, as py-spy's detach after a stack dump does). A fault comes
``--interval`` s after the previous one and never before the job trained again after it.
While faults remain, each step sleeps ``--step-sleep`` s and the ranks wait before the
last steps; after the last fault the job runs to its end at full speed.

Figures: per fault, fault (the bench's ``time.time()`` at the signal; for an exception
the rank's own line) -> the next step completed by the recovered job (the first step
line after it from a process started after the fault, or a step done again, or one past
the step in flight at the fault), the steps redone, and a group restart when the job's
``restarts.jsonl`` has one (kind ``process``) before the next fault (a checkpoint loaded
is not one: a standby that takes rank 0 loads it too, before ``live_state`` replaces
it); the counts of that file's kinds; then: the job's exit, its final
loss (the mean of the ranks' losses at the last step) against an uninterrupted run of the
same job (``torchrun``, no fault, the same steps), the processes of the job left after
it (0), and every ``*.json``/``*.jsonl`` under its log directory that does not parse (0).

Run: ``python bench/soak.py [--faults 200] [--interval 15] [--mode live|rankguard]``
(about ``--faults`` x ``--interval`` seconds, plus the recoveries). ``--smoke``: one fault
(seed 0's first: a SIGKILL, recovered by a group restart), 2 ranks, the uninterrupted run
beside the faulted one, not before it, and the group restart's job with ``--preload``
(``--preload torch``: its ranks, the restarted ones too, forked from one fork server): it
proves the script, not the claim.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import live_recovery as lr
from restart import FT_SETS, HEARTBEAT_SETS, print_failed_job, reap_leftovers

KINDS = ("exception", "kill", "stop")
SIGNALS = {"exception": signal.SIGUSR1, "kill": signal.SIGKILL, "stop": signal.SIGSTOP}


@dataclass
class Fault:
    kind: str
    rank: int
    t: float = 0.0
    pid: int = 0
    step_at: int = 0  # newest step completed when it was sent
    to_step: float | None = None
    redone: int | None = None
    group: list[dict[str, Any]] = field(default_factory=list)  # group restarts after it


def job_cmd(args: argparse.Namespace, workdir: Path, steps: int, mode: str) -> list[str]:
    job = [lr.JOB, "--model", "mlp", "--steps", str(steps), "--ckpt-dir", str(workdir / "ckpt")]
    job += ["--ckpt-every", str(args.ckpt_every), "--pg-timeout", "10"]
    if mode == "torchrun":
        return [
            sys.executable,
            "-u",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(args.nproc),
            "--log-dir",  # the ranks' error files (the job's ``@record``) kept beside it
            str(workdir / "logs"),
            *job,
        ]
    budget = str(args.faults + 5)
    cmd = [sys.executable, "-u", "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", str(args.nproc), "--log-dir", str(workdir / "logs")]
    cmd += ["--rdzv-id", f"soak-{workdir.name}", "--max-restarts", budget]
    if mode == lr.LIVE:
        cmd += ["--standby-ranks", "1"]
    if args.preload:
        cmd += ["--preload", "torch"]
    sets = [*HEARTBEAT_SETS, *FT_SETS]
    sets = [s for s in sets if not s.startswith("fault_tolerance.num_in_job_restarts")]
    sets.append(f"fault_tolerance.num_in_job_restarts={budget}")
    if mode == lr.LIVE:  # an exception: an in-process re-entry, a lost process: a standby
        sets += [*lr.LIVE_SETS, f"inprocess_restart.max_restarts_per_window={budget}"]
    for item in sets:
        cmd += ["--set", item]
    hold = ["--hold-file", str(workdir / "hold"), "--step-sleep", str(args.step_sleep)]
    return [*cmd, *job, *hold]


def start(cmd: list[str], workdir: Path) -> tuple[Any, list[tuple[float, str]]]:
    lines: list[tuple[float, str]] = []
    proc = lr.subprocess.Popen(
        cmd,
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LOGLEVEL": "WARNING"},
        stdout=lr.subprocess.PIPE,
        stderr=lr.subprocess.STDOUT,
        stdin=lr.subprocess.DEVNULL,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    threading.Thread(target=lr._reader, args=(proc.stdout, lines), daemon=True).start()
    return proc, lines


def step_events(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    run = lr.Run("soak", "none", 0, 0, Path("."), lines=list(lines))
    return [ev for tag, ev in lr.events(run) if tag == "LRSTEP"]


def newest_step(lines: list[tuple[float, str]]) -> tuple[int, float]:
    evs = step_events(lines)
    if not evs:
        return 0, 0.0
    last = max(evs, key=lambda ev: ev["t"])
    return int(last["s"]), float(last["t"])


def fault_times(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    run = lr.Run("soak", "none", 0, 0, Path("."), lines=list(lines))
    return [ev for tag, ev in lr.events(run) if tag == "LRFAULT"]


def cost(fault: Fault, evs: list[dict[str, Any]], pids_before: set[int]) -> None:
    """fault -> next step of the recovered job, and the steps redone."""
    seen: set[tuple[int, int]] = set()
    for ev in sorted(evs, key=lambda ev: ev["t"]):
        key = (int(ev["s"]), int(ev["r"]))
        redo = key in seen
        seen.add(key)
        if ev["t"] <= fault.t:
            continue
        if redo or ev["pid"] not in pids_before or key[0] > fault.step_at + 1:
            fault.to_step = ev["t"] - fault.t
            fault.redone = max(0, fault.step_at - key[0] + 1)
            return


def invalid_files(root: Path) -> tuple[int, list[str]]:
    checked, bad = 0, []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".json", ".jsonl"):
            continue
        checked += 1
        data = path.read_bytes()
        try:
            if path.suffix == ".json":
                json.loads(data)
            else:
                for line in data.splitlines():
                    if line.strip():
                        json.loads(line)
        except ValueError:
            bad.append(str(path.relative_to(root)))
    return checked, bad


def restart_lines(logs: Path) -> list[dict[str, Any]]:
    """The job's ``restarts.jsonl`` lines (every kind), each with its unix time ``t``:
    ``process`` (a group restart), ``live_recovery`` (a standby took a rank),
    ``inprocess`` (every rank re-entered in its process)."""
    out = []
    for path in sorted(logs.rglob("restarts.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                rec["t"] = datetime.fromisoformat(str(rec["wall_time"])).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            out.append(rec)
    return sorted(out, key=lambda r: float(r["t"]))


def final_loss(lines: list[tuple[float, str]], steps: int) -> float | None:
    last: dict[int, tuple[float, float]] = {}
    for ev in step_events(lines):
        if int(ev["s"]) == steps:
            r = int(ev["r"])
            if r not in last or ev["t"] >= last[r][0]:
                last[r] = (float(ev["t"]), float(ev["loss"]))
    return statistics.fmean(v[1] for v in last.values()) if last else None


def baseline(proc: Any, lines: list[tuple[float, str]], steps: int, workdir: Path) -> float | None:
    """The uninterrupted run's end: its final loss, said with its exit (and, when that
    is not 0, its console's tail and its ranks' error files)."""
    proc.wait()
    time.sleep(0.3)
    loss = final_loss(lines, steps)
    print(f"uninterrupted run (torchrun): exit {proc.returncode}, final loss {loss}")
    if proc.returncode != 0:
        print_failed_job("uninterrupted run (torchrun)", proc.returncode, lines, workdir)
    return loss


_READY = re.compile(r"new standby pid (\d+) ready \(([\d.]+) s after its start\)")
_REFILLED = re.compile(r"new standby pid (\d+) started in place of")


def standby_starts(lines: list[tuple[float, str]]) -> str:
    """The refilled standbys' starts: the launcher's start -> the standby at its wait
    (the launcher's ``ready`` lines), and how many never got there."""
    started = {m.group(1) for _, x in lines if (m := _REFILLED.search(x))}
    ready = {m.group(1): float(m.group(2)) for _, x in lines if (m := _READY.search(x))}
    if not started:
        return "refilled standbys: none started"
    figs = list(ready.values())
    said = (
        f"start -> waiting median {statistics.median(figs):.2f}s, max {max(figs):.2f}s"
        if figs
        else "none ready"
    )
    return (
        f"refilled standbys: {len(started)} started, {len(ready)} ready ({said}), "
        f"{len(started - set(ready))} never ready (used, or ended, before)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=200)
    p.add_argument("--interval", type=float, default=15.0, help="seconds between faults")
    p.add_argument("--seed", type=int, default=0, help="draws each fault's kind and rank")
    p.add_argument("--mode", choices=[lr.LIVE, "rankguard"], default=None)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--step-sleep", type=float, default=0.2, help="while faults remain")
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--recovery-timeout", type=float, default=120.0, help="per fault (s)")
    p.add_argument("--keep", action="store_true", help="keep the run's temp dir")
    p.add_argument(
        "--preload",
        action="store_true",
        help="rankguard run --preload torch: its ranks, the restarted ones too, forked from a "
        "fork server that imported torch once",
    )
    p.add_argument(
        "--smoke", action="store_true", help="1 fault, 2 ranks; --preload for the group restart"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.faults, args.interval, args.nproc = 1, 2.0, 2
        # the group restart's ranks forked, not interpreters importing torch (as a user
        # who restarts groups would run it); --mode live as it is run
        args.preload = args.preload or args.mode != lr.LIVE
    live_ok = lr.standby_available()
    mode = args.mode or "rankguard"
    lr.header(args.smoke, job="")
    if mode == lr.LIVE and not live_ok:
        raise SystemExit("--mode live: this rankguard run has no --standby-ranks")
    if not live_ok:
        print("live: not available (this rankguard run has no --standby-ranks)")
    elif mode != lr.LIVE:
        print("live: not run (--mode live runs it)")
    steps = int(args.faults * args.interval / args.step_sleep * 1.2) + 50
    rng = random.Random(args.seed)
    plan = [Fault(rng.choice(KINDS), rng.randrange(args.nproc)) for _ in range(args.faults)]
    print(
        f"soak: {mode}{' --preload torch' if args.preload else ''}, {args.nproc} ranks, MLP, "
        f"{steps} steps (a step sleeps "
        f"{args.step_sleep} s while faults remain), checkpoint every {args.ckpt_every}; "
        f"{args.faults} faults {args.interval:g} s apart, seed {args.seed}"
        + (" [smoke: one fault, not a result]" if args.smoke else "")
    )

    root = Path(tempfile.mkdtemp(prefix="rg-soak-"))
    base_dir = root / "baseline"
    base_dir.mkdir()
    base_proc, base_lines = start(job_cmd(args, base_dir, steps, "torchrun"), base_dir)
    if not args.smoke:  # --smoke: it runs beside the faulted job (not a result)
        base_loss = baseline(base_proc, base_lines, steps, base_dir)

    work = root / "soak"
    work.mkdir()
    (work / "hold").touch()
    t0 = time.time()
    proc, lines = start(job_cmd(args, work, steps, mode), work)
    pid_dir = work / "ckpt" / "pids"
    stuck = ""
    keepers: list[lr.KeepStopped] = []
    for i, fault in enumerate(plan):
        # the next fault: an interval after the previous one, once the job trains again
        ready = time.monotonic() + (args.interval if i else 0.0)
        deadline = time.monotonic() + args.interval + args.recovery_timeout
        prev = plan[i - 1] if i else None
        while time.monotonic() < deadline and proc.poll() is None:
            step, t_step = newest_step(lines)
            recovered = prev is None or (t_step > prev.t + 0.5 and step > prev.step_at)
            if step >= 2 and recovered and time.monotonic() >= ready:
                break
            time.sleep(0.1)
        else:
            stuck = f"fault {i + 1}: the job did not train again (exit {proc.poll()})"
            break
        try:
            fault.pid = int((pid_dir / f"rank_{fault.rank}").read_text())
        except (OSError, ValueError):
            stuck = f"fault {i + 1}: no pid file for rank {fault.rank}"
            break
        fault.step_at = newest_step(lines)[0]
        fault.t = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(fault.pid, SIGNALS[fault.kind])
        if fault.kind == "stop":  # a hang that stays one until rankguard ends the rank
            keepers.append(lr.KeepStopped(fault.pid))
        print(
            f"  fault {i + 1:3d} +{fault.t - t0:6.1f}s {fault.kind:9s} rank {fault.rank} "
            f"pid {fault.pid} after step {fault.step_at}",
            flush=True,
        )
    (work / "hold").unlink(missing_ok=True)
    try:
        rc = proc.wait(timeout=args.recovery_timeout + steps * 0.05)
    except lr.subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        stuck = stuck or "the job did not end after the last fault (killed)"
    resumed = sum(k.close() for k in keepers)
    if args.smoke:
        base_loss = baseline(base_proc, base_lines, steps, base_dir)
    time.sleep(0.5)
    leftovers = reap_leftovers(str(work))

    evs = step_events(lines)
    raised = {int(ev["pid"]): float(ev["t"]) for ev in fault_times(lines)}
    run = lr.Run("soak", "none", 0, 0, Path("."), lines=list(lines))
    # a group restart is the launcher's (restarts.jsonl ``process``), not a checkpoint
    # loaded: a standby that takes rank 0 loads it too before live_state replaces it
    restarts = restart_lines(work / "logs")
    groups = [r for r in restarts if r.get("kind") == "process"]
    loaded = sorted(
        (float(ev["t"]), int(ev["s"])) for tag, ev in lr.events(run) if tag == "LRRESUMED"
    )
    for i, fault in enumerate(plan):
        if not fault.t:
            continue
        if fault.kind == "exception" and fault.pid in raised:
            fault.t = raised[fault.pid]  # the rank's own line: when it raised
        before = {int(ev["pid"]) for ev in evs if ev["t"] <= fault.t}
        cost(fault, evs, before)
        fig = f"{fault.to_step:.2f}s" if fault.to_step is not None else "-"
        end = plan[i + 1].t if i + 1 < len(plan) and plan[i + 1].t else float("inf")
        fault.group = [r for r in groups if fault.t < float(r["t"]) < end]
        how = ""
        if fault.group:
            t0_group = float(fault.group[0]["t"])
            ckpt = [s for t, s in loaded if t > t0_group]
            how = f", group restart ({fault.group[0].get('cause')})" + (
                f" from the checkpoint of step {ckpt[0]}" if ckpt else ""
            )
        print(
            f"  recovery {i + 1:3d}: {fault.kind:9s} rank {fault.rank}: fault -> next step "
            f"{fig}, redone {fault.redone if fault.redone is not None else '-'}{how}"
        )
    sent = [f for f in plan if f.t]
    kinds: dict[str, int] = {}
    for rec in restarts:
        kinds[str(rec.get("kind"))] = kinds.get(str(rec.get("kind")), 0) + 1
    live = sum(1 for f in sent if f.to_step is not None and not f.group)
    print(
        f"restarts.jsonl: {kinds.get('live_recovery', 0)} live recoveries (a standby took "
        f"the rank), {kinds.get('inprocess', 0)} in-process re-entries, "
        f"{kinds.get('process', 0)} group restarts; faults recovered live (no group "
        f"restart before the next fault): {live} of {len(sent)}"
    )
    loss = final_loss(lines, steps)
    checked, bad = invalid_files(work / "logs")
    print()
    for kind in KINDS:
        figs = [f.to_step for f in sent if f.kind == kind and f.to_step is not None]
        redone = [f.redone for f in sent if f.kind == kind and f.redone is not None]
        if figs:
            print(
                f"{kind:9s}: {len(figs)} recovered, fault -> next step median "
                f"{statistics.median(figs):.2f}s, max {max(figs):.2f}s; redone median "
                f"{statistics.median(redone):g}, max {max(redone)}"
            )
    print(standby_starts(lines))
    diff = (
        abs(loss - base_loss) / abs(base_loss)
        if loss is not None and base_loss is not None
        else None
    )
    recovered = sum(1 for f in sent if f.to_step is not None)
    print(f"faults sent {len(sent)}/{args.faults}, recovered {recovered}; {stuck or 'no stall'}")
    print(f"job exit {rc}, {time.time() - t0:.0f}s")
    if rc != 0:
        print_failed_job(f"soak job ({mode})", rc, lines, work)
    if resumed:
        print(f"stopped ranks let run again before their end: {resumed}x (stopped again)")
    print(
        f"final loss {loss} vs uninterrupted {base_loss}: "
        + (f"{diff * 100:.3f} % apart" if diff is not None else "no final loss")
    )
    print(f"orphans (processes of the job left): {len(leftovers)} {', '.join(leftovers)}")
    print(f"invalid files: {len(bad)} of {checked} JSON/JSONL {' '.join(bad[:5])}")
    ok = (
        rc == 0
        and not stuck
        and len(sent) == args.faults
        and recovered == len(sent)
        and diff is not None
        and diff <= 0.01
        and not leftovers
        and not bad
    )
    print(
        "goal: finishes, final loss within 1 %, 0 orphans, 0 invalid files -> "
        + ("MEETS" if ok else "MISSES")
    )
    if args.keep or not ok:
        (work / "output.txt").write_text("".join(f"{t:.3f} {x}\n" for t, x in lines))
        print(f"files kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if args.smoke and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
