"""Live recovery: a lost rank -> the next completed step, the steps redone and the losses
after the recovery, for every way to recover that runs here, in the same sitting.

What: ``live_recovery_job.py`` (the demo's model in DDP, 4 CPU ranks on gloo, the data of
each step and rank fixed by the seed) gets a fault on a random rank at a random step,
drawn once per run from ``--seed`` and the same for every mode; ``--runs`` runs per mode
(default 10), the modes interleaved run by run so that the load hits them alike:

- ``live``: ``rankguard run --standby-ranks 1`` with in-process restart on (soft
  timeout 3 s, hard 6 s, process-group timeout 2 s): a warm standby takes the lost
  rank's place, the survivors re-enter in their processes, the state (declared by the
  job with ``live_state``) comes from a live rank;
- ``rankguard``: ``rankguard run --max-restarts 1`` (today's group restart: every rank
  stopped and started again, the job resumes from its checkpoint, every 5 steps);
- ``rankguard+preload``: the same with ``--preload torch`` (ranks forked from a process
  that has imported torch);
- ``torchrun``: ``python -m torch.distributed.run --standalone --max-restarts 1`` (plain
  torchrun, the same checkpoint);
- ``torchft``: torchft 0.2.0's own recovery: 4 replica groups of one rank, each under its
  own ``torchrun --nproc-per-node 1 --max-restarts 1`` (the supervisor that restarts a lost
  replica group, as torchft's own examples deploy it), a ``torchft_lighthouse`` with
  ``--min_replicas 3``; the survivors go on with 3 replica groups, the restarted one
  rejoins at the next quorum with its state sent by a peer. Its losses are compared with
  an uninterrupted torchft run's (its gradient average is its own, a step with 3 replica
  groups is a different step: torchft trades that for never stopping).

Faults: ``kill`` (SIGKILL, ``--runs`` runs per mode) and ``stop`` (SIGSTOP: a hung rank,
``--hang-runs`` per mode, default 1). rankguard finds a stopped rank by its heartbeats
(``process_timeout_s`` 3 s) and ends it (fault tolerance on; the bench stops the rank
again whenever something lets it run, and the hang would be gone: a faulthandler stack
dump sends SIGCONT, as a ptrace detach does; rankguard's py-spy reads a stopped rank with
``--nonblocking`` and leaves it stopped; a rank woken by its SIGKILL to die is counted
too); torchrun sees processes
exit, not hangs: only the gloo timeout (``--pg-timeout``, 10 s here) turns the hang into a
crash of the survivors; torchft's survivors drop the stopped replica group from the quorum
after the same gloo timeout; nothing ends the stopped process (the bench does, at the end).

For a hang, rankguard's phases from its run files as well: fault -> the finding naming
the stopped rank (``findings.jsonl``'s ``detected_at_unix_ns``: the heartbeat timeout),
-> the launcher saw its process end (a live recovery's ``fault_t`` in ``restarts.jsonl``:
the stack dumps and the kill), -> the next step (the recovery).

Figures, per run, from the job's own lines (each stamped by the rank, ``time.time()``):
fault (the ``LRFAULT`` line the faulting rank prints just before it kills or stops
itself) -> the next step any rank completes (``LRSTEP``: a DDP step completes on a rank
only when every rank's gradients arrived); steps redone (the newest step completed before
the fault minus the first step completed after it, plus one); the loss of every (step,
rank) completed after the fault against the uninterrupted run's (``repr`` equal, else the
largest difference); whether the survivors kept their processes. A run counts when the
job exits 0, every rank completed the last step, nothing of the job is left running.

Goal (live): fault -> next step <= 1 s median, <= 1 step redone, every run with the
uninterrupted run's losses, ahead of torchft in the same sitting.

Not here: a lost agent of two (a whole node): ``node_loss.py`` measures hot spare, shrink
and plain torchrun for it; live recovery of a node's ranks by standbys elsewhere is not
measured by this script.

Run: ``python bench/live_recovery.py [--runs 10] [--seed 0]`` (about 15-30 s per run on
the shared 2-core machine). ``--smoke``: 2 ranks, the MLP, one SIGKILL, the group restart
and (where ``rankguard run`` has ``--standby-ranks``) live recovery with no standby
started to refill the used one, side by side with the uninterrupted run (it needs only
its losses; the full run starts it first, alone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from restart import FT_SETS, HEARTBEAT_SETS, print_failed_job, reap_leftovers

JOB = str(Path(__file__).resolve().parent / "live_recovery_job.py")
NPROC = 4
STEPS = 30
CKPT_EVERY = 5
MODEL = "demo"
PG_TIMEOUT_S = 10
# live recovery: the in-process wrapper (the survivors re-enter), its timeouts short
LIVE_SETS = [
    "inprocess_restart.enabled=true",
    "inprocess_restart.soft_timeout=3",
    "inprocess_restart.hard_timeout=6",
    "inprocess_restart.process_group_timeout=2",
]
FAULT_STEPS = (6, 24)  # the fault's step is drawn from this range (both included)
LIVE = "live"
PRELOAD = "rankguard+preload"
MODES = (LIVE, "rankguard", PRELOAD, "torchrun", "torchft")
EVENT = re.compile(r"(LRSTEP|LRFAULT|LRRESUMED) (\{[^{}]*\})")


# ---- running one job ------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    fault: str  # none | kill | stop
    rank: int
    step: int
    workdir: Path
    rc: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    lines: list[tuple[float, str]] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    resumed: int = 0  # times the stopped rank was let run and stopped again


def standby_available() -> bool:
    """Does this ``rankguard run`` have ``--standby-ranks``? Its live recovery module
    (``rankguard.live.roles``, which came with the option) is found without importing it:
    asking ``rankguard run --help`` costs an interpreter and torch's import."""
    import importlib.util

    try:
        return importlib.util.find_spec("rankguard.live.roles") is not None
    except ModuleNotFoundError:  # no rankguard.live package at all
        return False


def job_args(run: Run, *, replica_groups: int = 0) -> list[str]:
    args = [
        JOB,
        "--steps",
        str(STEPS),
        "--model",
        MODEL,
        "--ckpt-dir",
        str(run.workdir / "ckpt"),
        "--ckpt-every",
        str(CKPT_EVERY),
        "--pg-timeout",
        str(PG_TIMEOUT_S),
    ]
    if run.fault != "none":
        args += ["--fault", run.fault, "--fault-rank", str(run.rank)]
        args += ["--fault-step", str(run.step)]
    if replica_groups:
        args += ["--torchft", "--min-replicas", str(replica_groups - 1)]
    return args


def launcher_cmd(run: Run) -> list[str]:
    py = [sys.executable, "-u"]
    if run.mode == "torchrun":
        return [
            *py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(NPROC),
            "--max-restarts",
            "1",
            # the ranks' error files (the job's ``@record``) in the run's own directory
            "--log-dir",
            str(run.workdir / "logs"),
            *job_args(run),
        ]
    cmd = [*py, "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", str(NPROC), "--log-dir", str(run.workdir / "logs")]
    cmd += ["--rdzv-id", f"lr-{run.workdir.name}"]
    sets = list(HEARTBEAT_SETS)
    if run.mode == LIVE:
        cmd += ["--standby-ranks", "1"]
        sets += LIVE_SETS
    if run.fault == "stop":
        sets += FT_SETS
    else:
        cmd += ["--max-restarts", "1"]
    if run.mode == PRELOAD:
        cmd += ["--preload", "torch"]
    for item in sets:
        cmd += ["--set", item]
    return [*cmd, *job_args(run)]


def _reader(stream: IO[str], sink: list[tuple[float, str]]) -> None:
    for line in stream:
        sink.append((time.time(), line.rstrip("\n")))


def _popen(cmd: list[str], run: Run, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        cmd,
        cwd=run.workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    assert proc.stdout is not None
    threading.Thread(target=_reader, args=(proc.stdout, run.lines), daemon=True).start()
    return proc


def _wait(procs: list[subprocess.Popen[str]], deadline: float) -> tuple[list[int | None], bool]:
    codes: list[int | None] = []
    timed_out = False
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            codes.append(proc.wait())
    return codes, timed_out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def execute(run: Run, timeout_s: float) -> Run:
    run.workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + timeout_s
    done, keepers = threading.Event(), []
    watcher = threading.Thread(target=_watch_stops, args=(run, done, keepers), daemon=True)
    watcher.start()
    try:
        _execute(run, deadline)
    finally:
        done.set()
        watcher.join()
        run.resumed = sum(k.close() for k in keepers)
    run.duration_s = time.monotonic() - start
    time.sleep(0.5)  # the readers' last lines
    run.leftovers = reap_leftovers(str(run.workdir))
    return run


def _execute(run: Run, deadline: float) -> None:
    if run.mode == "torchft":
        port = _free_port()
        lighthouse = subprocess.Popen(
            [
                "torchft_lighthouse",
                "--min_replicas",
                str(NPROC - 1),
                "--bind",
                f"[::]:{port}",
                "--join_timeout_ms",
                "1000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs = []
        for r in range(NPROC):
            env = {
                "REPLICA_GROUP_ID": str(r),
                "REPLICA_GROUPS": str(NPROC),
                "TORCHFT_LIGHTHOUSE": f"http://localhost:{port}",
            }
            cmd = [sys.executable, "-u", "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc-per-node", "1", "--max-restarts", "1"]
            cmd += ["--log-dir", str(run.workdir / "logs" / f"replica_{r}")]
            procs.append(_popen([*cmd, *job_args(run, replica_groups=NPROC)], run, env))
        if run.fault == "stop":  # nothing of torchft ends a stopped process: the bench does
            _end_stopped(run, procs, deadline)
        codes, run.timed_out = _wait(procs, deadline)
        lighthouse.kill()
        lighthouse.wait()
        # the survivors' launchers; the faulted group's exits 1 when the job ends before
        # it rejoined (its quorum never comes), or is the stopped one the bench ended
        kept = [c for i, c in enumerate(codes) if run.fault == "none" or i != run.rank]
        run.rc = max((c if c is not None else 1) for c in kept)
    else:
        # the uninterrupted run's figures are its losses alone: its launcher logs every
        # stage (start, finish, the exit barrier), stamped, for a failure's printed tail
        level = "INFO" if run.fault == "none" else "WARNING"
        proc = _popen(launcher_cmd(run), run, {"LOGLEVEL": level})
        codes, run.timed_out = _wait([proc], deadline)
        run.rc = codes[0]


def _end_stopped(run: Run, procs: list[subprocess.Popen[str]], deadline: float) -> None:
    """torchft: wait until the survivors finish, then end the stopped replica group."""
    stopped = [p for i, p in enumerate(procs) if i == run.rank]
    alive = [p for i, p in enumerate(procs) if i != run.rank]
    _wait(alive, deadline)
    for proc in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        pid_file = run.workdir / "ckpt" / "pids" / f"rank_{run.rank}"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _state(pid: int) -> str | None:
    """The process's state letter (``T``: stopped), None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    return None if state in ("Z", "X") else state


class KeepStopped:
    """A hang that stays a hang: while ``pid`` lives, SIGSTOP it again whenever something
    lets it run (rankguard's stack dump attaches py-spy, whose ptrace detach resumes a
    stopped process); ``resumed`` counts how often."""

    def __init__(self, pid: int) -> None:
        self.pid, self.resumed = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stopped_once = False  # the rank stops itself just after its line
        while not self._stop.wait(0.02):
            state = _state(self.pid)
            if state is None:
                return
            stopped_once = stopped_once or state in ("T", "t")
            if stopped_once and state not in ("T", "t"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGSTOP)
                self.resumed += 1

    def close(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.resumed


def _watch_stops(run: Run, done: threading.Event, keepers: list[KeepStopped]) -> None:
    """Keep the rank that stopped itself stopped (the job's ``LRFAULT`` line names it)."""
    seen = 0
    while not done.wait(0.02):
        for _t, text in run.lines[seen:]:
            m = EVENT.search(text)
            if m and m.group(1) == "LRFAULT":
                with contextlib.suppress(json.JSONDecodeError):
                    ev = json.loads(m.group(2))
                    if ev.get("kind") == "stop":
                        keepers.append(KeepStopped(int(ev["pid"])))
            seen += 1


# ---- reading a run --------------------------------------------------------------------


def events(run: Run) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for _t, text in run.lines:
        for m in EVENT.finditer(text):
            with contextlib.suppress(json.JSONDecodeError):
                out.append((m.group(1), json.loads(m.group(2))))
    return out


def losses(run: Run) -> dict[tuple[int, int], str]:
    """(step, rank) -> loss of the newest completion of that step on that rank."""
    out: dict[tuple[int, int], tuple[float, str]] = {}
    for tag, ev in events(run):
        if tag == "LRSTEP":
            key = (int(ev["s"]), int(ev["r"]))
            if key not in out or ev["t"] >= out[key][0]:
                out[key] = (float(ev["t"]), str(ev["loss"]))
    return {k: v[1] for k, v in out.items()}


@dataclass
class Result:
    run: Run
    ok: bool
    why: str
    fault_to_step: float | None = None
    to_full: float | None = None  # torchft: fault -> first step with every replica group
    redone: int | None = None
    compared: int = 0
    equal: int = 0
    max_diff: float = 0.0
    survivors_kept_pids: bool | None = None
    faulted_came_back: bool = False  # the faulted process itself trained again
    # rankguard's phases, from its run files (seconds after the fault):
    detected: float | None = None  # the finding naming the faulted rank
    ended: float | None = None  # the launcher saw its process end (live: restarts.jsonl)


def _run_files(run: Run) -> Path | None:
    """The run directory of a ``rankguard run`` (``--log-dir``'s ``heartbeat/<run id>``)."""
    found = sorted((run.workdir / "logs" / "heartbeat").glob("*/findings.jsonl"))
    return found[0].parent if found else None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def phases(run: Run, fault: dict[str, Any]) -> tuple[float | None, float | None]:
    """Fault -> rankguard's finding naming the faulted rank (its detection time), and
    fault -> the launcher saw the process end (a live recovery's ``fault_t``: for a
    hang, after fault tolerance killed it); None where the files do not say."""
    files = _run_files(run)
    if files is None:
        return None, None
    t_f, rank = float(fault["t"]), int(fault["r"])
    detected = None
    for f in _jsonl(files / "findings.jsonl"):
        ns = f.get("detected_at_unix_ns")
        if f.get("rank") == rank and f.get("pid") == fault.get("pid") and ns:
            detected = int(ns) / 1e9 - t_f
            break
    ended = None
    for r in _jsonl(files / "restarts.jsonl"):
        if r.get("kind") == "live_recovery" and r.get("lost_pid") == fault.get("pid"):
            ended = float(r["fault_t"]) - t_f
            break
    return detected, ended


def analyse(run: Run, baseline: dict[tuple[int, int], str]) -> Result:
    evs = events(run)
    fault = next((ev for tag, ev in evs if tag == "LRFAULT"), None)
    steps = [ev for tag, ev in evs if tag == "LRSTEP"]
    finished = {int(ev["r"]) for ev in steps if int(ev["s"]) == STEPS}
    need = set(range(NPROC))
    if run.mode == "torchft":  # the survivors train on; a replica group may rejoin or not
        need -= {run.rank}
    ok = (
        run.rc == 0
        and not run.timed_out
        and fault is not None
        and need <= finished
        and not run.leftovers
    )
    why = "ok"
    if not ok:
        if run.timed_out:
            why = f"no result within {run.duration_s:.0f}s (killed)"
        elif fault is None:
            why = f"the fault was never injected (exit {run.rc})"
        elif run.leftovers:
            why = "left processes behind: " + ", ".join(run.leftovers)
        elif not need <= finished:
            why = f"exit {run.rc}; ranks that completed the last step: {sorted(finished)}"
            mesh = [x for _t, x in run.lines if "connectFullMesh failed" in x]
            if mesh:  # torchrun's restarted group, often on gloo
                why += "; the restarted group died in init: gloo connectFullMesh failed"
        else:
            why = f"exit {run.rc}"
    res = Result(run, ok, why)
    if fault is None:
        return res
    if run.mode != "torchft" and run.mode != "torchrun":
        res.detected, res.ended = phases(run, fault)
    t_f, f_step = float(fault["t"]), int(fault["s"])
    # after the fault: a step at or past the fault's, or one done again (a survivor's
    # line of the step every rank completed before the fault can arrive just after it)
    seen: set[tuple[int, int]] = set()
    before, after = [], []
    for ev in sorted(steps, key=lambda ev: ev["t"]):
        key = (int(ev["s"]), int(ev["r"]))
        redo = key in seen
        seen.add(key)
        if ev["t"] > t_f and (redo or key[0] >= f_step):
            after.append(ev)
        else:
            before.append(ev)
    if after:
        res.fault_to_step = after[0]["t"] - t_f
        last_before = max((int(ev["s"]) for ev in before), default=0)
        res.redone = max(0, last_before - int(after[0]["s"]) + 1)
        full = [ev for ev in after if ev.get("replicas", NPROC) == NPROC]
        if run.mode == "torchft" and full:
            res.to_full = full[0]["t"] - t_f
    if run.mode != "torchft" and after:
        # the ranks that did not fault: the same process before and after the fault?
        old = {int(ev["r"]): ev["pid"] for ev in before}
        new = {int(ev["r"]): ev["pid"] for ev in after}
        res.survivors_kept_pids = all(
            old.get(r) == new.get(r) for r in range(NPROC) if r != run.rank and r in new
        )
    res.faulted_came_back = any(ev["pid"] == fault["pid"] for ev in after)
    newest = losses(run)
    for ev in after:
        key = (int(ev["s"]), int(ev["r"]))
        if newest.get(key) != ev["loss"] or key not in baseline:
            continue
        res.compared += 1
        if ev["loss"] == baseline[key]:
            res.equal += 1
        else:
            res.max_diff = max(res.max_diff, abs(float(ev["loss"]) - float(baseline[key])))
    return res


# ---- report ---------------------------------------------------------------------------


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def progress_line(res: Result) -> str:
    r = res.run
    fig = f"{res.fault_to_step:6.2f}s" if res.fault_to_step is not None else "   -   "
    extra = f" (all {NPROC} replica groups {res.to_full:.2f}s)" if res.to_full is not None else ""
    if r.mode == "torchft" and res.to_full is None and res.fault_to_step is not None:
        extra = f" (replica group {r.rank} never back before the end)"
    losses_ = (
        f"losses {res.equal}/{res.compared} equal"
        + (f" (max diff {res.max_diff:.3g})" if res.equal < res.compared else "")
        if res.compared
        else "losses -"
    )
    pids = (
        ""
        if res.survivors_kept_pids is None
        else f", survivors {'kept' if res.survivors_kept_pids else 'lost'} their pids"
    )
    if res.faulted_came_back:  # a stopped rank resumed (a SIGCONT, or a ptrace detach)
        pids += ", THE FAULTED PROCESS ITSELF TRAINED ON (resumed, not replaced)"
    if r.resumed:
        pids += f", the stopped rank was let run {r.resumed}x (stopped again by the bench)"
    if r.fault == "stop" and res.detected is not None:
        pids += f"; detected {res.detected:.2f}s"
        if res.ended is not None and res.fault_to_step is not None:
            pids += (
                f", ended {res.ended:.2f}s, then next step +{res.fault_to_step - res.ended:.2f}s"
            )
    return (
        f"  {r.mode:17s} {r.fault:4s} rank {r.rank} step {r.step:2d}: fault->next step {fig}"
        f"{extra}, redone {res.redone if res.redone is not None else '-'}, {losses_}{pids}; "
        f"{r.duration_s:.0f}s, {'ok' if res.ok else 'FAILED: ' + res.why}"
    )


def summary(results: dict[tuple[str, str], list[Result]]) -> None:
    rows = []
    for (mode, fault), rs in results.items():
        good = [r for r in rs if r.ok]
        figs = [r.fault_to_step for r in good if r.fault_to_step is not None]
        full = [r.to_full for r in good if r.to_full is not None]
        redone = [r.redone for r in good if r.redone is not None]
        same = sum(1 for r in good if r.compared and r.equal == r.compared)
        kept = [r.survivors_kept_pids for r in good if r.survivors_kept_pids is not None]
        rows.append(
            [
                mode,
                "SIGKILL" if fault == "kill" else "SIGSTOP (hang)",
                f"{len(good)}/{len(rs)}",
                _fmt(figs),
                _fmt(full) if mode == "torchft" else "",
                f"{statistics.median(redone):g} / {max(redone)}" if redone else "-",
                f"{same}/{len(good)}",
                f"{sum(kept)}/{len(kept)}" if kept else "-",
                f"{sum(r.faulted_came_back for r in good)}/{len(good)}",
            ]
        )
    print_table(
        [
            "mode",
            "fault",
            "ok",
            "fault->next step s (median / max)",
            "-> all replicas",
            "redone (median / max)",
            "losses equal",
            "survivors kept pids",
            "faulted process resumed",
        ],
        rows,
    )


def hang_phases(results: dict[tuple[str, str], list[Result]]) -> None:
    """Where a hang's time goes, for rankguard's modes: detection (the heartbeat timeout,
    ``heartbeat.process_timeout_s``), acting on it (stack dumps, the kill: until the
    launcher saw the process end) and the recovery after that."""
    rows = []
    for (mode, fault), rs in results.items():
        good = [r for r in rs if r.ok and r.detected is not None]
        if fault != "stop" or not good:
            continue
        detected = [r.detected for r in good if r.detected is not None]
        acted = [
            (r.detected, r.ended, r.fault_to_step)
            for r in good
            if r.detected is not None and r.ended is not None and r.fault_to_step is not None
        ]
        rows.append(
            [
                mode,
                _fmt(detected),
                _fmt([ended - det for det, ended, _next in acted]),
                _fmt([nxt - ended for _det, ended, nxt in acted]),
            ]
        )
    if not rows:
        return
    print()
    print(f"a hang (SIGSTOP), phase by phase (heartbeat.process_timeout_s {_timeout_s()} s):")
    print_table(
        [
            "mode",
            "fault->finding s (median / max)",
            "finding->process ended s",
            "process ended->next step s",
        ],
        rows,
    )


def _timeout_s() -> str:
    sets = [x for x in HEARTBEAT_SETS if x.startswith("heartbeat.process_timeout_s=")]
    return sets[0].split("=", 1)[1] if sets else "?"


def verdict(results: dict[tuple[str, str], list[Result]], runs: int) -> None:
    live = [r for r in results.get((LIVE, "kill"), []) if r.ok]
    if not results.get((LIVE, "kill")):
        return
    figs = [r.fault_to_step for r in live if r.fault_to_step is not None]
    redone = [r.redone for r in live if r.redone is not None]
    same = sum(1 for r in live if r.compared and r.equal == r.compared)
    med = statistics.median(figs) if figs else float("inf")
    print(
        f"goal: live fault -> next step <= 1 s median -> {med:.2f}s: "
        + ("MEETS" if med <= 1.0 else "MISSES")
    )
    worst = max(redone) if redone else None
    print(
        f"goal: <= 1 step redone -> max {worst}: "
        + ("MEETS" if worst is not None and worst <= 1 else "MISSES")
    )
    print(
        f"goal: {runs}/{runs} runs with the uninterrupted run's losses -> {same}/{runs}: "
        + ("MEETS" if same == runs else "MISSES")
    )
    ft = [r.fault_to_step for r in results.get(("torchft", "kill"), []) if r.ok]
    ft_figs = [f for f in ft if f is not None]
    if ft_figs:
        med_ft = statistics.median(ft_figs)
        print(
            f"goal: ahead of torchft measured here ({med_ft:.2f}s) -> {med:.2f}s: "
            + ("MEETS" if med < med_ft else "MISSES")
        )
    else:
        print("goal: ahead of torchft -> no torchft run completed here")


def header(smoke: bool, job: str | None = None) -> None:
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"{now}, python {platform.python_version()}, torch {ver('torch')}, torchft "
        f"{ver('torchft')}, {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f}"
    )
    if job is None:
        job = (
            f"job: live_recovery_job.py --model {MODEL}, {NPROC} ranks (gloo), {STEPS} steps, "
            f"checkpoint every {CKPT_EVERY} (group restarts), --pg-timeout {PG_TIMEOUT_S}"
            + (" [smoke: not a result]" if smoke else "")
        )
    if job:
        print(job)


def torchft_available() -> str | None:
    """Why torchft cannot run here, or None."""
    try:
        with warnings.catch_warnings():  # torch.cuda's pynvml notice, on import
            warnings.simplefilter("ignore")
            import torchft  # noqa: F401
    except Exception as exc:  # an import error of any kind is the reason
        return f"torchft does not import: {exc}"
    if shutil.which("torchft_lighthouse") is None:
        return "torchft's torchft_lighthouse is not on PATH"
    return None


def main(argv: list[str] | None = None) -> int:
    global NPROC, STEPS, CKPT_EVERY, MODEL, FAULT_STEPS, LIVE_SETS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="SIGKILL runs per mode")
    p.add_argument("--hang-runs", type=int, default=1, help="SIGSTOP runs per mode")
    p.add_argument("--seed", type=int, default=0, help="draws each run's rank and step")
    p.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES)
    )
    p.add_argument("--timeout", type=float, default=180.0, help="per run (s); over: failed")
    p.add_argument("--keep", action="store_true", help="keep every run's temp dir")
    p.add_argument("--smoke", action="store_true", help="2 ranks, 1 SIGKILL, fewest modes")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: unknown {', '.join(bad)} (known: {', '.join(MODES)})")
    if args.smoke:
        NPROC, STEPS, CKPT_EVERY, MODEL, FAULT_STEPS = 2, 8, 3, "mlp", (5, 5)
        args.runs, args.hang_runs = 1, 0
        modes = [LIVE, "rankguard"]
        # no standby started to refill the used one: the job ends 3 steps after the
        # fault, before a new standby has imported torch, and the launcher would wait
        # for it to leave (up to 10 s) and end it
        LIVE_SETS = [*LIVE_SETS, "inprocess_restart.standby_refills=0"]
    header(args.smoke)
    if LIVE in modes and not standby_available():
        print("live: skipped: this rankguard run has no --standby-ranks (live recovery)")
        modes.remove(LIVE)
    elif args.smoke:  # the fewest modes: live recovery alone where it exists
        modes = [LIVE]
    ft_why = torchft_available() if "torchft" in modes else None
    if ft_why is not None:
        print(f"torchft: skipped: {ft_why}")
        modes.remove("torchft")

    rng = random.Random(args.seed)
    plan = [("kill", rng.randrange(NPROC), rng.randint(*FAULT_STEPS)) for _ in range(args.runs)]
    plan += [
        ("stop", rng.randrange(NPROC), rng.randint(*FAULT_STEPS)) for _ in range(args.hang_runs)
    ]
    drawn = ", ".join(f"{f} rank {r} step {s}" for f, r, s in plan)
    print(f"faults (seed {args.seed}): {drawn}")

    root = Path(tempfile.mkdtemp(prefix="rg-live-"))
    kinds = ["ddp", *(["torchft"] if "torchft" in modes else [])]

    def uninterrupted(kind: str) -> Run:
        mode = "torchft" if kind == "torchft" else "torchrun"
        return execute(Run(mode, "none", 0, 0, root / f"baseline-{kind}"), args.timeout)

    # --smoke: the uninterrupted run side by side with the fault's (its figures are not
    # results); otherwise before the faults, alone on the machine
    side = ThreadPoolExecutor(max_workers=1) if args.smoke else None
    pending = {k: side.submit(uninterrupted, k) for k in kinds} if side is not None else {}
    faulted: list[tuple[str, Run]] = []
    if side is not None:
        for i, (fault, rank, step) in enumerate(plan):
            for mode in modes:
                run = execute(Run(mode, fault, rank, step, root / f"{i}-{mode}"), args.timeout)
                faulted.append((mode, run))
        side.shutdown()
    baselines: dict[str, dict[tuple[int, int], str]] = {}
    for kind in kinds:
        base = pending[kind].result() if kind in pending else uninterrupted(kind)
        base_losses = losses(base)
        complete = {(s, r) for s in range(1, STEPS + 1) for r in range(NPROC)} <= set(base_losses)
        print(
            f"  uninterrupted run ({base.mode}): exit {base.rc}, {len(base_losses)} step losses, "
            f"{base.duration_s:.0f}s" + ("" if complete else ": INCOMPLETE")
        )
        show_failure(base)
        if not complete:
            _keep(base, True)
            return 1
        baselines[kind] = base_losses
        _keep(base, args.keep or base.rc != 0 or base.timed_out)

    def record(mode: str, run: Run) -> Result:
        res = analyse(run, baselines["torchft" if mode == "torchft" else "ddp"])
        results.setdefault((mode, run.fault), []).append(res)
        print(progress_line(res), flush=True)
        show_failure(run)
        _keep(run, args.keep or not res.ok)
        return res

    results: dict[tuple[str, str], list[Result]] = {}
    for mode, run in faulted:
        record(mode, run)
    if side is None:
        for i, (fault, rank, step) in enumerate(plan):
            for mode in modes:
                record(
                    mode, execute(Run(mode, fault, rank, step, root / f"{i}-{mode}"), args.timeout)
                )

    print()
    print("fault -> next completed step (s), steps redone, losses of every (step, rank)")
    print("completed after the fault against the uninterrupted run's (torchft: its own)")
    summary(results)
    hang_phases(results)
    failed = [r for rs in results.values() for r in rs if not r.ok]
    for r in failed:
        print(f"failed: {r.run.mode} {r.run.fault} rank {r.run.rank} step {r.run.step}: {r.why}")
    print()
    verdict(results, args.runs)
    if ft_why is not None:
        print(f"torchft: not measured: {ft_why}")
    with contextlib.suppress(OSError):
        root.rmdir()
    return 1 if args.smoke and failed else 0


def show_failure(run: Run) -> None:
    """A job that exited non-zero or ran past its limit: its console's tail and its
    ranks' error files, printed (the run's directory is kept as well: :func:`_keep`)."""
    if run.rc != 0 or run.timed_out:
        label = f"{run.mode} ({'uninterrupted' if run.fault == 'none' else run.fault})"
        print_failed_job(label, run.rc, run.lines, run.workdir)


def _keep(run: Run, keep: bool) -> None:
    if keep:
        print(f"    files kept: {run.workdir}")
        (run.workdir / "output.txt").write_text(
            "".join(f"{t:.3f} {text}\n" for t, text in run.lines)
        )
    else:
        shutil.rmtree(run.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
