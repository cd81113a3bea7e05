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

Live recovery alone, after the others' faults are drawn (the same ``--seed`` gives the same
SIGKILL and SIGSTOP runs as without them), one run of each per row:

- ``node`` (``--node-runs``, default 3): a lost agent of two. Two ``rankguard run
  --nnodes 2 --nproc-per-node 2 --standby-ranks 2`` on a c10d rendezvous on 127.0.0.1
  whose store the bench hosts (``is_host=false``: the lost node does not take it along),
  the in-process store heartbeats every 0.2 s (timeout 4 s), as the two-node end-to-end
  test runs them. A rank of node 1 (node 0 decides; its own loss is today's path) prints
  its line and stops itself; the bench SIGKILLs that rank's launcher and every process
  under it at once. Node 0's standbys take both ranks; the survivors are ranks 0 and 1.
  Against it: today's hot spare and shrink of a node (``node_loss.py``, not rerun here);
- ``shrink`` (``--shrink-runs``, default 3): no standby left. ``--standby-ranks 1`` with
  ``inprocess_restart.standby_refills=0`` and ``shrink_when_no_standby=true``; the job
  trains a global batch of 24 (``--global-batch``: 4 ranks x 3 micro-batches of 2, the
  same samples whatever the world size); a SIGKILL takes the standby, a second SIGKILL
  of another rank later leaves none: the job goes on with 3 ranks in process (4
  micro-batches each). Its figures are the second fault's; each step's loss of the
  global batch after it (the mean of the 3 ranks' losses) against the uninterrupted
  4-rank run's of the same global batch, within a relative 1e-5 (the same samples and
  gradient, added in another order: not bit-equal).

The ``restarts.jsonl`` kinds of every rankguard run are listed (``process``: a group
restart; ``live_recovery``; ``shrink``): a live run that fell back to a group restart
says so.

Run: ``python bench/live_recovery.py [--runs 10] [--seed 0]`` (about 15-60 s per run on
the shared 2-core machine). ``--smoke``: 2 ranks, the MLP, one SIGKILL, the group restart
and (where ``rankguard run`` has ``--standby-ranks``) live recovery with no standby
started to refill the used one, its ranks and standby forked (``--preload torch``),
side by side with the uninterrupted run (it needs only its losses; the full run starts
it first, alone); no node or shrink run unless asked
(``--smoke --node-runs 1 --shrink-runs 1``: one agent and one standby per node; a shrink
from 2 ranks to 1).
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
# a lost agent of two: each node 2 ranks and 2 standbys (enough for the other node's
# ranks), the survivors' store heartbeats as the two-node end-to-end test sets them
NODE_SETS = ["inprocess_restart.heartbeat_interval=0.2", "inprocess_restart.heartbeat_timeout=4"]
# no standby left: the one standby is not refilled; the second SIGKILL drops its rank
SHRINK_SETS = [
    "inprocess_restart.standby_refills=0",
    "inprocess_restart.shrink_when_no_standby=true",
]
SHRINK_STEPS = ((6, 15), (18, 24))  # the shrink runs' first and second fault's steps
GLOBAL_BATCH, MICRO_BATCH = 24, 2  # the shrink runs': 4 ranks x 3 x 2, then 3 x 4 x 2
SHRINK_RTOL = 1e-5  # a step's loss of the smaller world against the full world's
LIVE = "live"
PRELOAD = "rankguard+preload"
# --smoke: the live run's ranks and standby forked too (``--preload torch``), not three
# interpreters each importing torch (bench/goodput.py's live-preload mode, measured there)
LIVE_PRELOAD = False
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
    # shrink: the second fault (the first uses the standby); node: the launchers' pids
    rank2: int = 0
    step2: int = 0
    launchers: list[int] = field(default_factory=list)
    lost_launcher: int | None = None  # node: the launcher the bench ended with its node


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
    if run.fault == "shrink":
        args += ["--fault", "kill", "--fault-rank", f"{run.rank},{run.rank2}"]
        args += ["--fault-step", f"{run.step},{run.step2}"]
    elif run.fault != "none":
        args += ["--fault", run.fault, "--fault-rank", str(run.rank)]
        args += ["--fault-step", str(run.step)]
    if run.fault == "shrink" or run.mode == "baseline-shrink":
        args += ["--global-batch", str(GLOBAL_BATCH), "--batch-size", str(MICRO_BATCH)]
    if replica_groups:
        args += ["--torchft", "--min-replicas", str(replica_groups - 1)]
    return args


def launcher_cmd(run: Run) -> list[str]:
    py = [sys.executable, "-u"]
    if run.mode in ("torchrun", "baseline-shrink"):
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
        if run.fault == "shrink":
            sets += SHRINK_SETS
    if run.fault == "stop":
        sets += FT_SETS
    else:
        cmd += ["--max-restarts", "1"]
    if run.mode == PRELOAD or (run.mode == LIVE and LIVE_PRELOAD):
        cmd += ["--preload", "torch"]
    for item in sets:
        cmd += ["--set", item]
    return [*cmd, *job_args(run)]


def node_cmd(run: Run, node: int, port: int) -> list[str]:
    """One of the two agents of a lost-node run: ``rankguard run --nnodes 2`` on a c10d
    rendezvous on loopback whose store the bench hosts (a lost node does not take it
    along), 2 ranks and 2 standbys per node."""
    cmd = [sys.executable, "-u", "-m", "rankguard.cli.main", "run"]
    cmd += ["--nnodes", "2", "--nproc-per-node", str(NPROC // 2)]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--rdzv-id", f"lr-{run.workdir.name}", "--rdzv-conf", "is_host=false"]
    cmd += ["--max-restarts", "1", "--standby-ranks", str(NPROC // 2)]
    cmd += ["--log-dir", str(run.workdir / "logs" / f"node{node}")]
    for item in [*HEARTBEAT_SETS, *LIVE_SETS, *NODE_SETS]:
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
    elif run.fault == "node":
        _execute_nodes(run, deadline)
    else:
        # the uninterrupted run's figures are its losses alone: its launcher logs every
        # stage (start, finish, the exit barrier), stamped, for a failure's printed tail
        level = "INFO" if run.fault == "none" else "WARNING"
        proc = _popen(launcher_cmd(run), run, {"LOGLEVEL": level})
        codes, run.timed_out = _wait([proc], deadline)
        run.rc = codes[0]


def _execute_nodes(run: Run, deadline: float) -> None:
    """Two agents on one rendezvous; the faulting rank's node is ended by the watcher
    (:func:`_end_node`); the run's exit status is the surviving agent's."""
    with warnings.catch_warnings():  # torch.cuda's pynvml notice, on import
        warnings.simplefilter("ignore")
        from torch.distributed import TCPStore

    port = _free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    try:
        procs = [_popen(node_cmd(run, i, port), run, {"LOGLEVEL": "WARNING"}) for i in range(2)]
        run.launchers = [proc.pid for proc in procs]
        codes, run.timed_out = _wait(procs, deadline)
    finally:
        del store
    kept = [c for proc, c in zip(procs, codes, strict=True) if proc.pid != run.lost_launcher]
    run.rc = max((c if c is not None else 1) for c in kept) if run.lost_launcher else 1


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _end_node(run: Run, pid: int) -> None:
    """A lost agent: the launcher above ``pid`` and every process under it, SIGKILLed
    (the launcher stopped first, so that it starts nothing more)."""
    parents = _parents()
    top = pid
    while top and top not in run.launchers:
        top = parents.get(top, 0)
    if not top:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(top, signal.SIGSTOP)
    parents = _parents()
    tree, grew = {top}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree} - tree
        grew = bool(more)
        tree |= more
    run.lost_launcher = top
    for p in [top, *sorted(tree - {top})]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


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
                    elif ev.get("kind") == "node":
                        _end_node(run, int(ev["pid"]))
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
    restarts: list[str] = field(default_factory=list)  # restarts.jsonl's kinds, in order


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


def restart_kinds(run: Run) -> list[str]:
    """The kinds of the run's ``restarts.jsonl`` lines (every node's log dir: node 0
    writes the job's), a shrink's ``live_recovery`` as ``shrink``: ``process`` is a
    group restart."""
    out = []
    for path in sorted((run.workdir / "logs").glob("**/restarts.jsonl")):
        for line in _jsonl(path):
            kind = str(line.get("kind", "?"))
            out.append("shrink" if kind == "live_recovery" and line.get("shrink") else kind)
    return out


def analyse(run: Run, baseline: dict[tuple[int, int], str]) -> Result:
    evs = events(run)
    # a shrink run's figures are its second fault's (no standby left then)
    which = 1 if run.fault == "shrink" else 0
    fault = next((ev for tag, ev in evs if tag == "LRFAULT" and int(ev.get("i", 0)) == which), None)
    steps = [ev for tag, ev in evs if tag == "LRSTEP"]
    finished = {int(ev["r"]) for ev in steps if int(ev["s"]) == STEPS}
    need = set(range(NPROC - 1 if run.fault == "shrink" else NPROC))
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
        res.restarts = restart_kinds(run)
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
        # the ranks that did not fault: the same processes before and after the fault?
        # (a shrink renumbers them, a lost node takes its two ranks along)
        old = {int(ev["r"]): ev["pid"] for ev in before}
        lost = {int(fault["r"])}
        if run.fault == "node":
            half = NPROC // 2
            lost = set(range(int(fault["r"]) // half * half, (int(fault["r"]) // half + 1) * half))
        res.survivors_kept_pids = {p for r, p in old.items() if r not in lost} <= {
            ev["pid"] for ev in after
        }
    res.faulted_came_back = any(ev["pid"] == fault["pid"] for ev in after)
    if run.fault == "shrink":
        _compare_means(res, after, baseline)
        return res
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


def step_means(lines: list[dict[str, Any]]) -> dict[int, tuple[int, float]]:
    """Step -> (ranks, the mean of their losses): the loss of the step's global batch
    (each rank's share is the same size)."""
    per: dict[int, dict[int, float]] = {}
    for ev in sorted(lines, key=lambda ev: ev["t"]):  # the newest completion wins
        per.setdefault(int(ev["s"]), {})[int(ev["r"])] = float(ev["loss"])
    return {s: (len(v), statistics.fmean(v.values())) for s, v in per.items()}


def _compare_means(
    res: Result, after: list[dict[str, Any]], baseline: dict[tuple[int, int], str]
) -> None:
    """A shrink: each step after the fault, the smaller world's loss of the global batch
    against the full world's (the uninterrupted run of the same global batch): equal
    within :data:`SHRINK_RTOL` (the same samples and gradient, summed in another order)."""
    ref = step_means([{"s": s, "r": r, "loss": v, "t": 0.0} for (s, r), v in baseline.items()])
    for step, (ranks, mean) in sorted(step_means(after).items()):
        if step not in ref or ranks != NPROC - 1:
            continue
        res.compared += 1
        diff = abs(mean - ref[step][1]) / max(abs(ref[step][1]), 1e-12)
        res.max_diff = max(res.max_diff, diff)
        res.equal += diff <= SHRINK_RTOL


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
    if r.fault == "shrink" and res.compared:
        losses_ = (
            f"step losses {res.equal}/{res.compared} within {SHRINK_RTOL:g} of the full "
            f"world's (max rel diff {res.max_diff:.2g})"
        )
    pids = (
        ""
        if res.survivors_kept_pids is None
        else f", survivors {'kept' if res.survivors_kept_pids else 'lost'} their pids"
    )
    if res.faulted_came_back:  # a stopped rank resumed (a SIGCONT, or a ptrace detach)
        pids += ", THE FAULTED PROCESS ITSELF TRAINED ON (resumed, not replaced)"
    if res.restarts:
        counts = {k: res.restarts.count(k) for k in dict.fromkeys(res.restarts)}
        pids += "; restarts.jsonl: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    if r.resumed:
        pids += f", the stopped rank was let run {r.resumed}x (stopped again by the bench)"
    if r.fault == "stop" and res.detected is not None:
        pids += f"; detected {res.detected:.2f}s"
        if res.ended is not None and res.fault_to_step is not None:
            pids += (
                f", ended {res.ended:.2f}s, then next step +{res.fault_to_step - res.ended:.2f}s"
            )
    where = f"rank {r.rank} step {r.step:2d}"
    if r.fault == "shrink":
        where += f", then rank {r.rank2} step {r.step2:2d}"
    return (
        f"  {r.mode:17s} {r.fault:4s} {where}: fault->next step {fig}"
        f"{extra}, redone {res.redone if res.redone is not None else '-'}, {losses_}{pids}; "
        f"{r.duration_s:.0f}s, {'ok' if res.ok else 'FAILED: ' + res.why}"
    )


FAULT_LABELS = {
    "kill": "SIGKILL",
    "stop": "SIGSTOP (hang)",
    "node": "lost agent of 2",
    "shrink": "no standby: shrink",
}


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
                FAULT_LABELS[fault],
                f"{len(good)}/{len(rs)}",
                _fmt(figs),
                _fmt(full) if mode == "torchft" else "",
                f"{statistics.median(redone):g} / {max(redone)}" if redone else "-",
                f"{same}/{len(good)}",
                f"{sum(kept)}/{len(kept)}" if kept else "-",
                f"{sum(r.faulted_came_back for r in good)}/{len(good)}",
                f"{sum('process' in r.restarts for r in good)}/{len(good)}"
                if mode not in ("torchrun", "torchft")
                else "",
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
            "group restart",
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
    for fault in ("node", "shrink"):
        verdict_of(fault, results.get((LIVE, fault), []))


def verdict_of(fault: str, rs: list[Result]) -> None:
    """The same goal for a lost agent of two and a shrink (losses: the uninterrupted
    run's; a shrink's within :data:`SHRINK_RTOL` of the full world's)."""
    if not rs:
        return
    good = [r for r in rs if r.ok]
    figs = [r.fault_to_step for r in good if r.fault_to_step is not None]
    med = statistics.median(figs) if figs else float("inf")
    redone = [r.redone for r in good if r.redone is not None]
    worst = max(redone) if redone else None
    same = sum(1 for r in good if r.compared and r.equal == r.compared)
    group = sum("process" in r.restarts for r in rs)
    meets = med <= 1.0 and worst is not None and worst <= 1 and same == len(rs)
    print(
        f"goal, {FAULT_LABELS[fault]}: fault -> next step {med:.2f}s median, max "
        f"{worst} redone, {same}/{len(rs)} runs with the losses, {group} group restart(s): "
        + ("MEETS" if meets else "MISSES")
    )


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
    global NPROC, STEPS, CKPT_EVERY, MODEL, FAULT_STEPS, LIVE_SETS, SHRINK_STEPS, LIVE_PRELOAD
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="SIGKILL runs per mode")
    p.add_argument("--hang-runs", type=int, default=1, help="SIGSTOP runs per mode")
    p.add_argument(
        "--node-runs", type=int, default=None, help="lost-agent-of-two runs (live; 3, smoke 0)"
    )
    p.add_argument(
        "--shrink-runs", type=int, default=None, help="no-standby-left runs (live; 3, smoke 0)"
    )
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
        SHRINK_STEPS = ((3, 3), (5, 5))
        modes = [LIVE, "rankguard"]
        # no standby started to refill the used one: the job ends 3 steps after the
        # fault, before a new standby has imported torch, and the launcher would wait
        # for it to leave (up to 10 s) and end it
        LIVE_SETS = [*LIVE_SETS, "inprocess_restart.standby_refills=0"]
        LIVE_PRELOAD = True
    # the smoke run: none unless asked (each is a launch or two, tens of seconds in CI)
    for name in ("node_runs", "shrink_runs"):
        if getattr(args, name) is None:
            setattr(args, name, 0 if args.smoke else 3)
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
    # drawn after the others: the same --seed gives the same SIGKILL and SIGSTOP runs
    # as before these existed. node: a rank of node 1 (node 0 decides, and its loss is
    # today's path: docs/live_recovery.md); shrink: two SIGKILLs of different ranks
    live_only: list[tuple[str, Any, Any]] = []
    if LIVE in modes:
        half = NPROC // 2
        live_only += [
            ("node", half + rng.randrange(half), rng.randint(*FAULT_STEPS))
            for _ in range(args.node_runs)
        ]
        for _ in range(args.shrink_runs):
            first, second = rng.sample(range(NPROC), 2)
            steps = rng.randint(*SHRINK_STEPS[0]), rng.randint(*SHRINK_STEPS[1])
            live_only.append(("shrink", (first, second), steps))
    drawn = ", ".join(f"{f} rank {r} step {s}" for f, r, s in [*plan, *live_only])
    print(f"faults (seed {args.seed}): {drawn}")

    root = Path(tempfile.mkdtemp(prefix="rg-live-"))
    kinds = ["ddp", *(["torchft"] if "torchft" in modes else [])]
    kinds += ["shrink"] if any(f == "shrink" for f, _r, _s in live_only) else []

    def uninterrupted(kind: str) -> Run:
        mode = {"torchft": "torchft", "shrink": "baseline-shrink"}.get(kind, "torchrun")
        return execute(Run(mode, "none", 0, 0, root / f"baseline-{kind}"), args.timeout)

    def make(i: int, mode: str, fault: str, rank: Any, step: Any) -> Run:
        run = Run(mode, fault, 0, 0, root / f"{i}-{mode}-{fault}")
        if fault == "shrink":
            (run.rank, run.rank2), (run.step, run.step2) = rank, step
        else:
            run.rank, run.step = rank, step
        return run

    # each row: a fault of the plan under every mode, then one of live recovery's own
    rows: list[list[tuple[str, tuple[str, Any, Any]]]] = []
    for i in range(max(len(plan), len(live_only))):
        rows.append([(mode, plan[i]) for mode in modes] if i < len(plan) else [])
        rows[-1] += [(LIVE, live_only[i])] if i < len(live_only) else []
    # --smoke: the uninterrupted runs side by side with the faulted ones (their figures
    # are not results); otherwise before the faults, alone on the machine
    side = ThreadPoolExecutor(max_workers=1) if args.smoke else None
    pending = {k: side.submit(uninterrupted, k) for k in kinds} if side is not None else {}
    faulted: list[tuple[str, Run]] = []
    if side is not None:
        for i, row in enumerate(rows):
            for mode, fault in row:
                faulted.append((mode, execute(make(i, mode, *fault), args.timeout)))
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
        kind = "torchft" if mode == "torchft" else "shrink" if run.fault == "shrink" else "ddp"
        res = analyse(run, baselines[kind])
        results.setdefault((mode, run.fault), []).append(res)
        print(progress_line(res), flush=True)
        show_failure(run)
        _keep(run, args.keep or not res.ok)
        return res

    results: dict[tuple[str, str], list[Result]] = {}
    for mode, run in faulted:
        record(mode, run)
    if side is None:
        for i, row in enumerate(rows):
            for mode, fault in row:
                record(mode, execute(make(i, mode, *fault), args.timeout))

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
