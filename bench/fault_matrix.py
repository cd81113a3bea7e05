"""Fault matrix: inject real faults into real jobs and check every verdict.

What: runs ``rankguard run`` (the real launcher, CPU ranks, gloo, loopback only) once per
case, injects one fault, and checks what the job monitor wrote: was the fault detected,
with the right finding type on the right rank, how long after the injection, did any
process of the job survive it, and are the files it left valid. Clean runs (no fault)
count false positives. Cases run one at a time. Each case's ETTR (productive training
time / wall time) comes from the goodput ledger rankguard keeps in node 0's run directory
(what ``rankguard goodput`` prints): the cost of each fault to the job, start-up included.

Settings (every run): heartbeats published and scanned every 0.5 s, process timeout 3 s,
progress timeout 4 s (the e2e tests' short timeouts), fault tolerance on with no in-job
restart (``num_in_job_restarts=0``, ``termination_grace_s=3``, faulthandler stack dumps):
a detected hang is dumped and killed and the job exits, as in production with an empty
restart budget. Two-node cases run two agents on 127.0.0.1 (``--nnodes 2 --node-rank 0/1
--rdzv-endpoint 127.0.0.1:PORT``) with separate log directories (no shared filesystem);
the ``rdzv`` variant leaves ``--node-rank`` out (the rendezvous numbers the nodes, the
fault is placed by the workers' ``GROUP_RANK``).

Fault kinds and the verdict each case expects (finding type on (node, local rank)):

- ``step_hang``: the demo's ``--fault stall`` (main thread blocked in a step, heartbeat
  thread alive) -> ``gpu_progress_timeout`` on the culprit;
- ``collective_hang``: ``fault_matrix_collective.py``: the culprit sleeps before an
  ``all_reduce`` the others wait in -> ``gpu_progress_timeout`` on the culprit only;
- ``sigstop``: the demo's ``--fault stop`` -> ``rank_process_heartbeat_timeout``;
- ``sigkill_rank``: SIGKILL of a rank's pid from outside -> ``rank_process_exited``;
- ``exception``: the demo's ``--fault crash`` -> ``rank_process_exited``;
- ``slow_rank``: ``--fault slow --slowdown 2`` with straggler detection on (report every
  2 s) -> ``straggler_detected``; time from the first completed step of any rank;
- ``launcher_sigterm``: SIGTERM to one launcher (pid only) mid-run -> no finding blamed
  on a rank, no process left;
- ``launcher_sigkill``: SIGKILL to the launcher (pid only) -> nothing can be written;
  orphans = processes of the job alive 5 s after the kill (the training is long enough
  to outlive that), then killed by this script;
- ``monitor_crash``: a bug escapes a scan into the monitor thread
  (``fault_matrix_launcher.py`` makes ``scan_once`` raise in that thread), then a rank
  stalls. ``once``: one scan raises -> the thread goes on, the stall is found
  (``gpu_progress_timeout``); ``always``: every later scan in the thread raises -> nothing
  can be detected, so no finding, but the failure must not be silent. Both: right only
  if the final status.json counts the failed scans (``monitor.errors`` > 0, the injected
  error in ``monitor.last_error``) and node 0's launcher logged ``SCAN FAILED`` with the
  traceback;
- ``disk_full``: the log directory is a 2 MiB tmpfs, filled mid-run for 10 s then freed
  -> no rank blamed as dead or hung: the ranks that could not write their heartbeats
  long enough are ``node_disk_full`` (reported, not killed), and the training completes;
- ``corrupt_line``: four bad lines (not JSON, binary, a JSON record with fields missing,
  a record of another run) appended to a rank's heartbeat file -> no finding, job
  completes;
- ``long_line``: one 9 MiB line appended to a rank's heartbeat file -> no finding, job
  completes;
- ``clock_jump``: a copy of a rank's latest record, stamped one hour ahead (``fwd``) or
  behind (``back``) in ``wall_time_ns`` (what a wall-clock step makes the publisher
  write; the system clock itself is not changed) -> no finding, job completes;
- ``relay_death``: the relay thread of node 1 dies (``fault_matrix_launcher.py``) while
  its ranks keep training -> node 1's ranks reported (``rank_process_heartbeat_timeout``
  on both; the monitor cannot tell a dead relay from dead ranks), none of node 0's. Of
  the answers the monitor can give this is the right one only with the relay's failure
  said on node 1 (``PUSH FAILED``, or ``THE RELAY THREAD OF NODE 1 STOPPED``); blaming
  node 1's live ranks is then the expected consequence, not a culprit;
- ``forged_record``: two nodes; a store client of this script writes node 1's relay keys
  (a record claiming 200,000 ranks, a record of node 0 under node 1's key, a health
  snapshot whose ``gpus`` is a number) and appends a 200,000-rank record to a heartbeat
  file of node 0 -> no finding, the training completes, and node 0's final status
  counts the refused records (``monitor.ignored_records`` > 0);
- ``planted_checkpoint``: before the run, a committed ``step_999999999`` is planted in
  the checkpoint directory whose per-rank state unpickles into code (it would create a
  marker file) -> the marker never appears, the step is skipped as unusable (said in
  the log), no finding, the training completes;
- ``symlinked_step``: the checkpoint directory holds ``step_000000001``, a symbolic link
  to another run's committed step, and retention keeps one checkpoint -> the other
  run's commit marker and data are still there at the end, no finding, the training
  completes;
- ``planted_flightrec``: a ``collective_hang`` whose run directory's ``flightrec/``
  folder gets, once the training runs, planted traces that unpickle into code (they would
  create a marker file): torch's pickle name of every rank (``rank_<r>``), a rank the job
  does not have (``rank_99``, ``rank_99.json``), owned by another user (uid 65534) when
  this script runs as root -> the marker never appears, the culprit is found
  (``gpu_progress_timeout``) and its finding names it from the ranks' genuine traces
  (``flight_recorder.missing_ranks`` is the culprit alone);
- ``forged_preemption``: two nodes with preemption on; a store client writes
  ``preempt/request/node/1`` (no rank of node 1 got a signal) and a ``preempt`` value
  that is not an object -> the job is not preempted (no ``job_preempted`` finding,
  every launcher exits 0), the training completes.
- ``forged_spare``: two nodes; a store client writes agent entries of the hot-spare
  tracking: a spare "waiting" with a keep-alive of 1e12 s (it held the store's host for
  ever after the job: the launcher never exited), one whose ``since`` is text and one
  training as node ``"a"`` (they made node 0's ``elastic`` status block raise, which
  took ``restarts``, ``checkpoints`` and ``timeouts`` out of ``status.json`` too), then
  raises the ``agents`` counter by 10^6 -> no finding, the training completes, every
  launcher exits 0 within the case's time, and node 0's final ``status.json`` has its
  ``elastic`` and ``timeouts`` blocks.

Per case: right = the set of (finding type, node, local rank) in findings.jsonl equals
the expected set (strict: an extra rank blamed is wrong) and the case's own evidence
is there (every verdict fails when nothing was observed: a case that expects no
finding also needs the training to complete, or what it checks to be seen: the
launcher's exit, no process left, the refused records counted, the marker intact;
``disk_full`` needs its ``node_disk_full`` findings), and node 0's ``root cause:`` line
agrees: it names the culprit's global rank for a rank's fault that ends the job (a hang
found and killed, a SIGSTOP, a SIGKILL, a crash; on two nodes too, where node 0's own
first failed worker is only a consequence), says no rank failed after a launcher's
SIGTERM, and is absent when the training completes; detection = the first
expected finding's ``detected_wall_time`` minus the injection time (the fault's
``injecting fault`` line as it reached this script, or the moment this script sent the
signal / wrote the line); orphans = processes with the run id in their environment
(``RANKGUARD_RUN_ID``) or command line still alive up to 5 s after the launchers exited
(then killed); files valid = status.json and every launcher JSON file parse, and every
line of every ``.jsonl`` file in the run directories parses as JSON, except the lines
injected on purpose.

Goals: 100 % right attribution, 0 false positives (clean runs), 0 orphans, 0 invalid
files.

Run: ``python bench/fault_matrix.py [--quick] [--out result.json]`` (root is needed for
the tmpfs of the disk-full cases; without it they are reported as not run).
Full matrix: 55 faults + 10 clean runs, ~18 minutes on 2 cores; ``--quick``: one case
per kind and one clean run, ~3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
COLLECTIVE = HERE / "fault_matrix_collective.py"
WRAPPER = HERE / "fault_matrix_launcher.py"

FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=30",
    "heartbeat.process_timeout_s=3",
    "heartbeat.initial_progress_timeout_s=60",
    "heartbeat.progress_timeout_s=4",
    "heartbeat.checkpoint_timeout_s=20",
    "fault_tolerance.enable_ft_package=true",
    "fault_tolerance.termination_grace_s=3",
    "fault_tolerance.stack_dump=faulthandler",
    "fault_tolerance.num_in_job_restarts=0",
]
STRAGGLER = [
    "straggler.enabled=true",
    "straggler.report_time_interval=2",
]

PROGRESS = "gpu_progress_timeout"
HB_TIMEOUT = "rank_process_heartbeat_timeout"
EXITED = "rank_process_exited"
STRAG = "straggler_detected"

SHORT = {
    PROGRESS: "progress",
    HB_TIMEOUT: "hb_timeout",
    EXITED: "exited",
    STRAG: "straggler",
    "gpu_hardware_health_failure": "gpu_fail",
    "gpu_hardware_health_warning": "gpu_warn",
    "rank_section_timeout": "section",
}

INJECT_MARK = "injecting fault"
CASE_TIMEOUT_S = 150.0
ORPHAN_WAIT_S = 5.0


# ---- cases -------------------------------------------------------------------------------


@dataclass
class Case:
    kind: str
    nproc: int
    nnodes: int = 1
    fault_node: int = 0  # node of the fault (the launcher's node for launcher faults)
    fault_local: int = 1  # local rank of the fault on that node
    variant: str = ""
    expected: list[tuple[str, int, int]] = field(default_factory=list)  # (type, node, local)
    steps: int = 0  # the training's steps (0: the kind's own; --smoke: fewer)
    fault_step: int = 0  # step_hang's stall step (0: step 5)

    @property
    def shape(self) -> str:
        if self.nnodes == 1:
            return f"{self.nproc} rank" + ("s" if self.nproc != 1 else "")
        return f"{self.nnodes}x{self.nproc} nodes"

    @property
    def where(self) -> str:
        if self.kind in ("launcher_sigterm", "launcher_sigkill"):
            return f"launcher n{self.fault_node}"
        if self.kind == "relay_death":
            return f"relay n{self.fault_node}"
        if self.kind in ("clean", "disk_full", "planted_checkpoint", "symlinked_step"):
            return "-"
        if self.kind in ("forged_record", "forged_preemption", "forged_spare"):
            return "store"
        return f"n{self.fault_node} r{self.fault_local}"


def case(
    kind: str, nproc: int, *, nnodes: int = 1, node: int = 0, local: int = 1, variant: str = ""
) -> Case:
    c = Case(kind, nproc, nnodes, node, local, variant)
    expect = {
        "step_hang": PROGRESS,
        "collective_hang": PROGRESS,
        "planted_flightrec": PROGRESS,
        "sigstop": HB_TIMEOUT,
        "sigkill_rank": EXITED,
        "exception": EXITED,
        "slow_rank": STRAG,
        "monitor_crash": PROGRESS,
    }.get(kind)
    if kind == "monitor_crash" and variant == "always":
        expect = None  # every scan fails: nothing can be found (but it must be said)
    if expect is not None:
        c.expected = [(expect, node, local)]
    elif kind == "relay_death":
        c.expected = [(HB_TIMEOUT, node, r) for r in range(nproc)]
    return c


#: Kinds whose right answer is "no finding", with the evidence each needs besides.
NO_FINDING_KINDS = (
    "corrupt_line",
    "long_line",
    "clock_jump",
    "forged_record",
    "planted_checkpoint",
    "symlinked_step",
    "forged_preemption",
    "forged_spare",
)
PLANTED_MARKER = "planted-payload-ran"


def full_matrix() -> list[Case]:
    m: list[Case] = []
    for kind in ("step_hang", "sigstop", "sigkill_rank", "exception"):
        m += [case(kind, 2), case(kind, 2, local=0), case(kind, 4, local=2)]
        m += [case(kind, 2, nnodes=2, node=1, local=1)]
    m.append(case("step_hang", 3, local=2))
    # two agents without --node-rank: the rendezvous numbers the nodes
    m.append(case("step_hang", 2, nnodes=2, node=1, local=1, variant="rdzv"))
    m.append(case("sigkill_rank", 3, local=1))
    m += [case("collective_hang", 2), case("collective_hang", 2, local=0)]
    m += [case("collective_hang", 4, local=3), case("collective_hang", 2, nnodes=2, node=1)]
    m += [
        case("slow_rank", 4, local=2),
        case("slow_rank", 3, local=1),
        case("slow_rank", 4, local=0),
    ]
    m += [case("launcher_sigterm", 2, local=0), case("launcher_sigterm", 3, local=0)]
    m += [case("launcher_sigterm", 4, local=0)]
    m += [case("launcher_sigterm", 2, nnodes=2, node=1, local=0)]
    m += [case("launcher_sigkill", 2, local=0), case("launcher_sigkill", 3, local=0)]
    m += [case("launcher_sigkill", 4, local=0), case("launcher_sigkill", 2, local=0)]
    m += [case("monitor_crash", 2, variant="once")]
    m += [case("monitor_crash", 4, local=3, variant="once")]
    m += [case("monitor_crash", 2, variant="always")]
    m += [case("disk_full", 2, local=0), case("disk_full", 4, local=0)]
    m += [case("disk_full", 3, local=0)]
    m += [
        case("corrupt_line", 2),
        case("corrupt_line", 4, local=3),
        case("corrupt_line", 3, local=0),
    ]
    m += [case("long_line", 2), case("long_line", 4, local=2), case("long_line", 2, local=0)]
    m += [case("clock_jump", 2, variant="fwd"), case("clock_jump", 2, variant="back")]
    m += [
        case("clock_jump", 4, local=2, variant="fwd"),
        case("clock_jump", 4, local=3, variant="back"),
    ]
    m += [case("relay_death", 2, nnodes=2, node=1) for _ in range(3)]
    m += [case("forged_record", 2, nnodes=2, node=1), case("forged_record", 2, nnodes=2, node=1)]
    m += [case("planted_checkpoint", 2, local=0), case("planted_checkpoint", 3, local=0)]
    m += [case("symlinked_step", 2, local=0), case("symlinked_step", 3, local=0)]
    m += [case("forged_preemption", 2, nnodes=2, node=1) for _ in range(2)]
    m += [case("forged_spare", 2, nnodes=2, node=1) for _ in range(2)]
    m += [case("planted_flightrec", 2), case("planted_flightrec", 3, local=2)]
    m += [case("clean", 2, local=0) for _ in range(3)]
    m += [case("clean", 3, local=0), case("clean", 4, local=0)]
    m += [
        case("clean", 2, local=0, variant="straggler"),
        case("clean", 4, local=0, variant="straggler"),
    ]
    m += [case("clean", 2, nnodes=2, local=0) for _ in range(2)]
    m += [case("clean", 2, local=0, variant="collective")]
    return m


def quick_matrix() -> list[Case]:
    seen: set[str] = set()
    out = []
    for c in full_matrix():
        if c.kind not in seen:
            seen.add(c.kind)
            out.append(c)
    return out


def smoke_matrix() -> list[Case]:
    """Two cases (``--smoke``), 1 rank each, one for each job script this bench starts: a
    hang before a collective (``fault_matrix_collective.py``, at step 2 of 4) and a
    monitor thread that dies once (``fault_matrix_launcher.py`` around the demo, its
    stall at step 25 of 40). ``main`` runs them side by side."""
    collective = case("collective_hang", 1, local=0)
    monitor = case("monitor_crash", 1, local=0, variant="once")
    collective.steps, collective.fault_step = 4, 2
    monitor.steps, monitor.fault_step = 40, 25
    return [collective, monitor]


# ---- results -----------------------------------------------------------------------------


@dataclass
class Result:
    index: int
    kind: str
    variant: str
    shape: str
    where: str
    run_id: str
    expected: list[tuple[str, int, int]]
    observed: list[tuple[str, int, int]] = field(default_factory=list)
    right: bool | None = None
    detect_s: float | None = None
    orphans: int = 0
    orphan_cmds: list[str] = field(default_factory=list)
    files_checked: int = 0
    invalid_files: list[str] = field(default_factory=list)
    rc: list[int | None] = field(default_factory=list)
    wall_s: float = 0.0
    completed: bool | None = None  # the training reached its end (clean / harmless faults)
    orphans_at_kill: int | None = None  # launcher_sigkill: alive 5 s after the kill
    root_cause: str = ""  # the launcher's "root cause:" line (rank failures)
    note: str = ""
    not_run: str = ""
    messages: list[str] = field(default_factory=list)
    #: the goodput ledger of node 0's run directory (``rankguard goodput``): productive
    #: training time / wall time, and its parts in seconds
    ettr: float | None = None
    goodput_parts: dict[str, float] = field(default_factory=dict)


# ---- process helpers ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Launcher:
    """One ``rankguard run`` agent; stdout and stderr lines stamped as they arrive."""

    def __init__(self, node: int, cmd: list[str], env: dict[str, str], out_path: Path) -> None:
        self.node = node
        self.lines: list[tuple[float, str]] = []
        self.out = out_path.open("w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append((time.time(), line.rstrip("\n")))
            self.out.write(line)
        self.out.close()

    def first(self, mark: str) -> float | None:
        return next((t for t, line in list(self.lines) if mark in line), None)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def job_processes(run_id: str) -> list[int]:
    """Live processes of the run: run id in the environment or on the command line
    (zombies and this script do not count)."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
        except OSError:
            continue
        if f"RANKGUARD_RUN_ID={run_id}".encode() in env or run_id.encode() in cmd:
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def count_orphans(run_id: str, res: Result) -> None:
    if res.orphans_at_kill is not None:  # counted 5 s after the launcher's SIGKILL
        res.orphans = res.orphans_at_kill
        for pid in job_processes(run_id):  # clean up for the next case
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    deadline = time.monotonic() + ORPHAN_WAIT_S
    left = job_processes(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = job_processes(run_id)
    res.orphans = len(left)
    res.orphan_cmds = [cmdline(p) for p in left]
    for pid in left:  # clean up for the next case
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


# ---- heartbeat files ---------------------------------------------------------------------


def last_record(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            tail = fh.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "progress_seq" in rec:
            return rec
    return None


def local_ranks(run_dir: Path) -> dict[int, tuple[Path, dict[str, Any]]]:
    """local rank -> (its newest heartbeat file, last record) of this node's ranks."""
    out: dict[int, tuple[Path, dict[str, Any]]] = {}
    for path in sorted(
        run_dir.glob("rank_*_pid_*.heartbeat.jsonl"), key=lambda p: p.stat().st_mtime
    ):
        rec = last_record(path)
        if rec is None or rec.get("local_rank") is None:
            continue
        out[int(rec["local_rank"])] = (path, rec)
    return out


def wait_progress(run_dirs: dict[int, Path], nproc: int, steps: int, timeout: float) -> bool:
    """Wait until every local rank of every node has completed ``steps`` steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = True
        for run_dir in run_dirs.values():
            ranks = local_ranks(run_dir) if run_dir.exists() else {}
            if len(ranks) < nproc or any(
                (rec.get("progress_seq") or 0) < steps for _, rec in ranks.values()
            ):
                ok = False
                break
        if ok:
            return True
        time.sleep(0.1)
    return False


def first_step_time(run_dirs: dict[int, Path]) -> float | None:
    best = None
    for run_dir in run_dirs.values():
        for path in run_dir.glob("rank_*_pid_*.heartbeat.jsonl"):
            for line in path.read_bytes().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and (rec.get("progress_seq") or 0) >= 1:
                    t = rec["wall_time_ns"] / 1e9
                    best = t if best is None else min(best, t)
                    break
    return best


def append_raw(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# ---- validity of the files a run left ----------------------------------------------------


def check_files(run_dirs: dict[int, Path], injected: dict[str, set[bytes]], res: Result) -> None:
    for node, run_dir in run_dirs.items():
        if not run_dir.exists():
            res.invalid_files.append(f"node {node}: no run directory")
            continue
        for path in sorted(run_dir.rglob("*")):
            if not path.is_file():
                continue
            if path.suffix == ".jsonl":
                res.files_checked += 1
                skip = injected.get(path.name, set())
                bad = 0
                for line in path.read_bytes().splitlines():
                    if not line.strip() or line in skip:
                        continue
                    try:
                        json.loads(line)
                    except ValueError:
                        bad += 1
                if bad:
                    res.invalid_files.append(f"n{node}/{path.name}: {bad} bad line(s)")
            elif path.suffix == ".json":
                res.files_checked += 1
                if path.read_bytes() in injected.get(path.name, set()):
                    continue  # planted on purpose (planted_flightrec)
                try:
                    json.loads(path.read_bytes())
                except ValueError:
                    res.invalid_files.append(f"n{node}/{path.name}: not JSON")


def monitor_errors_said(run_dir: Path, out: str) -> bool:
    """The monitor's failed scans are in its final status.json (counted, the injected
    error named) and in the launcher's log (with a traceback)."""
    try:
        monitor = json.loads((run_dir / "status.json").read_bytes()).get("monitor") or {}
    except (OSError, ValueError):
        return False
    return (
        (monitor.get("errors") or 0) > 0
        and "injected death" in str(monitor.get("last_error"))
        and "SCAN FAILED" in out
        and "Traceback" in out
    )


def where_of(f: dict[str, Any], nproc: int) -> tuple[str, int, int]:
    """(finding type, node, local rank) of a finding; a finding without a local rank
    (straggler findings) is placed by its global rank (``nproc`` ranks per node)."""
    node = int(f.get("node_rank") or 0)
    local = f.get("local_rank")
    if local is None:
        local = int(f.get("rank") or 0) - node * nproc
    return (str(f.get("finding_type")), node, int(local))


def read_findings(run_dirs: dict[int, Path]) -> list[dict[str, Any]]:
    out = []
    for run_dir in run_dirs.values():
        path = run_dir / "findings.jsonl"
        if path.exists():
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


# ---- one case ----------------------------------------------------------------------------


def demo_args(c: Case, steps: int, *extra: str) -> list[str]:
    args = ["-m", "rankguard.demo.train", "--steps", str(steps), *extra]
    return args


def fault_target(c: Case) -> list[str]:
    """--fault-rank (and --fault-node on two nodes) of the fault."""
    if c.nnodes > 1:
        return ["--fault-node", str(c.fault_node), "--fault-rank", str(c.fault_local)]
    return ["--fault-rank", str(c.fault_local)]


def target_of(c: Case) -> list[str]:
    k = c.kind
    if k == "step_hang":
        return demo_args(
            c,
            c.steps or 60,
            "--fault",
            "stall",
            "--fault-step",
            str(c.fault_step or 5),
            "--fault-duration",
            "30",
            *fault_target(c),
        )
    if k == "sigstop":
        return demo_args(
            c, 60, "--fault", "stop", "--fault-step", "5", "--fault-duration", "6", *fault_target(c)
        )
    if k == "exception":
        return demo_args(c, 60, "--fault", "crash", "--fault-step", "5", *fault_target(c))
    if k in ("collective_hang", "planted_flightrec"):
        return [
            str(COLLECTIVE),
            "--steps",
            str(c.steps or 60),
            "--fault-step",
            str(c.fault_step or 5),
            "--duration",
            "30",
            *fault_target(c),
        ]
    if k == "slow_rank":
        return demo_args(
            c, 150, "--step-sleep", "0", "--fault", "slow", "--slowdown", "2", *fault_target(c)
        )
    if k == "monitor_crash":
        return demo_args(
            c,
            c.steps or 90,
            "--fault",
            "stall",
            "--fault-step",
            str(c.fault_step or 40),
            "--fault-duration",
            "8",
            *fault_target(c),
        )
    if k == "clean" and c.variant == "collective":
        return [str(COLLECTIVE), "--steps", "60", "--fault-step", "0"]
    if k == "clean" and c.variant == "straggler":
        return demo_args(c, 150, "--step-sleep", "0")
    if k == "clean":
        return demo_args(c, c.steps or 60)
    if k == "launcher_sigkill":  # long enough to outlive the 5 s orphan check
        return demo_args(c, 400)
    # faults from outside: a long enough run that they hit it mid-training
    return demo_args(c, 120)


def build_cmd(
    c: Case, node: int, run_id: str, log_dir: Path, port: int, wrapper: bool
) -> list[str]:
    head = (
        [sys.executable, str(WRAPPER)] if wrapper else [sys.executable, "-m", "rankguard.cli.main"]
    )
    cmd = [*head, "run"]
    if c.nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += ["--nnodes", str(c.nnodes)]
        if c.variant != "rdzv":  # rdzv: no --node-rank, the rendezvous numbers the nodes
            cmd += ["--node-rank", str(node)]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--nproc-per-node", str(c.nproc), "--rdzv-id", run_id, "--log-dir", str(log_dir)]
    sets = list(FAST)
    if c.kind == "slow_rank" or c.variant == "straggler":
        sets += STRAGGLER
    if c.kind == "forged_preemption":
        sets += ["preemption.enable_exit_handler=true"]
    if c.kind == "symlinked_step":
        sets += ["checkpoint.most_recent_k=1"]
    for s in sets:
        cmd += ["--set", s]
    if c.kind in ("planted_checkpoint", "symlinked_step"):
        ckpt = str(log_dir.parent / "ckpt")
        return cmd + demo_args(c, 40, "--checkpoint-dir", ckpt, "--checkpoint-every", "10")
    return cmd + target_of(c)


class _Planted:
    """Unpickling this creates a directory: the proof that a planted checkpoint ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def plant_checkpoints(c: Case, base: Path) -> None:
    """What the checkpoint cases find in their checkpoint directory before the run."""
    import pickle
    import zlib

    if c.kind not in ("planted_checkpoint", "symlinked_step"):
        return
    ckpt = base / "ckpt"
    ckpt.mkdir(mode=0o700)
    if c.kind == "symlinked_step":
        other = base / "pretrain" / "step_000000001"
        other.mkdir(parents=True)
        (other / "data.bin").write_bytes(b"pretrained" * 100)
        (other / "COMMITTED").write_text(json.dumps({"step": 1}))
        (ckpt / "step_000000001").symlink_to(other, target_is_directory=True)
        return
    step = ckpt / "step_999999999"  # newer than anything the run saves: loaded first
    step.mkdir()
    payload = pickle.dumps({"data": _Planted(base / PLANTED_MARKER)})
    files = {}
    for rank in range(c.nproc * c.nnodes):
        name = f"rank_{rank}.state"
        (step / name).write_bytes(payload)
        files[name] = {"size": len(payload), "checksum": f"{zlib.crc32(payload):08x}", "rank": rank}
    manifest = {
        "format_version": 1,
        "step": 999999999,
        "checksum": "crc32",
        "world_size": c.nproc * c.nnodes,
        "files": files,
    }
    data = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (step / "manifest.json").write_bytes(data)
    marker = {"step": 999999999, "manifest_checksum": f"{zlib.crc32(data):08x}"}
    (step / "COMMITTED").write_text(json.dumps(marker))


def plant_traces(c: Case, run_dir: Path, base: Path, injected: dict[str, set[bytes]]) -> None:
    """What another user could leave in ``flightrec/`` while the job runs (see the
    ``planted_flightrec`` kind): pickles that would create the marker if unpickled."""
    import pickle

    payload = pickle.dumps({"pg_status": {}, "entries": [], "x": _Planted(base / PLANTED_MARKER)})
    d = run_dir / "flightrec"
    d.mkdir(exist_ok=True)
    names = [f"rank_{r}" for r in range(c.nproc * c.nnodes)] + ["rank_99", "rank_99.json"]
    for name in names:
        path = d / name
        injected.setdefault(name, set()).add(payload)
        path.write_bytes(payload)
        if os.geteuid() == 0:
            os.chown(path, 65534, 65534)  # another user's file


def forge_store(c: Case, port: int, run_dirs: dict[int, Path]) -> None:
    """A store client that is not part of the job writes what the forged cases need."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    prefix = f"rankguard/{next(iter(run_dirs.values())).name}/"
    if c.kind == "forged_preemption":
        store.set(prefix + "preempt/request/node/1", "preempted: forged")
        store.set(prefix + "preempt", "[]")
        return
    if c.kind == "forged_spare":
        now = time.time()
        for entry in (
            {"agent": "forged:1", "state": "waiting", "since": now, "keepalive_s": 1e12},
            {"agent": "forged:2", "state": "waiting", "since": "x", "beat": 0},
            {"agent": "forged:3", "state": "training", "round": None, "node": "a"},
        ):
            index = int(store.add(prefix + "agents", 1)) - 1
            store.set(f"{prefix}agent/{index}", json.dumps(entry))
        store.add(prefix + "agents", 10**6)
        return
    _, rec = local_ranks(run_dirs[1])[0]
    huge = {**rec, "world_size": 200_000, "seq": rec["seq"] + 10_000, "rank": 7}
    other_node = {**rec, "node_rank": 0, "rank": 0, "event": "process_end", "seq": 10**6}
    base = {
        "epoch": "forged",
        "gen": 10**6,
        "records": [huge, other_node],
        "health": {"gpus": 1},
        "disk": {"full": False},
    }
    store.set(prefix + "hb/node/1", json.dumps(base))
    store.set(prefix + "hb/tick/1", json.dumps({"epoch": "forged", "gen": 10**6, "ranks": []}))
    path, rec0 = local_ranks(run_dirs[0])[0]
    line = {**rec0, "world_size": 200_000, "rank": 199_999, "seq": 1}
    append_raw(path, json.dumps(line).encode() + b"\n")


def status_blocks(run_dir: Path) -> set[str]:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return set()
    return set(status) if isinstance(status, dict) else set()


def ignored_records(run_dir: Path) -> int:
    try:
        status = json.loads((run_dir / "status.json").read_text())
        return int(status["monitor"]["ignored_records"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def run_case(index: int, c: Case, work: Path, can_mount: bool) -> Result:
    run_id = f"fm{index:02d}-{c.kind.replace('_', '')}-{os.getpid()}"
    res = Result(index, c.kind, c.variant, c.shape, c.where, run_id, list(c.expected))
    if c.kind == "disk_full" and not can_mount:
        res.not_run = "needs root for a tmpfs"
        return res
    base = work / run_id
    base.mkdir(parents=True)
    log_dirs = {n: base / f"node{n}" for n in range(c.nnodes)}
    mounted: Path | None = None
    if c.kind == "disk_full":
        mounted = log_dirs[0]
        mounted.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mounted)], check=True)
    run_dirs = {n: d / "heartbeat" / run_id for n, d in log_dirs.items()}
    plant_checkpoints(c, base)
    trigger = base / "trigger"
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launchers: list[Launcher] = []
    injected: dict[str, set[bytes]] = {}
    inject_t: float | None = None
    t0 = time.monotonic()
    try:
        for node in range(c.nnodes):
            wrap = (c.kind == "monitor_crash" and node == 0) or (
                c.kind == "relay_death" and node == c.fault_node
            )
            node_env = dict(env)
            if wrap:
                node_env["FAULT_MATRIX_INJECT"] = c.kind
                node_env["FAULT_MATRIX_TRIGGER"] = str(trigger)
                node_env["FAULT_MATRIX_MODE"] = c.variant or "always"
            cmd = build_cmd(c, node, run_id, log_dirs[node], port, wrap)
            launchers.append(Launcher(node, cmd, node_env, base / f"node{node}.log"))
        inject_t = inject_from_outside(c, launchers, run_dirs, trigger, injected, res, port)
        deadline = time.monotonic() + CASE_TIMEOUT_S
        for la in launchers:
            try:
                la.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                res.note += f"node {la.node} launcher timed out; "
                with contextlib.suppress(OSError):
                    os.killpg(la.proc.pid, signal.SIGKILL)
                la.proc.wait(timeout=10)
        for la in launchers:
            la.reader.join(timeout=5)
        res.rc = [la.proc.returncode for la in launchers]
        res.wall_s = time.monotonic() - t0
        count_orphans(run_id, res)
        evaluate(c, res, launchers, run_dirs, inject_t, injected)
        goodput_of(res, run_dirs[0])
    finally:
        for la in launchers:
            if la.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(la.proc.pid, signal.SIGKILL)
                la.proc.wait(timeout=10)
        for pid in job_processes(run_id):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if mounted is not None:
            for _ in range(20):
                if subprocess.run(["umount", str(mounted)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(mounted)], capture_output=True)
    return res


def goodput_of(res: Result, run_dir: Path) -> None:
    """The case's ETTR and its parts, from the ledger rankguard keeps for the run."""
    from rankguard.goodput.rundir import read_ledger

    try:
        ledger = read_ledger(run_dir)
    except Exception as exc:  # a case's files may be what the fault broke
        res.note += f"goodput ledger unreadable: {type(exc).__name__}; "
        return
    if ledger is None:
        return
    res.ettr = ledger.ettr
    res.goodput_parts = {part.value: round(sec, 3) for part, sec in ledger.parts.items() if sec}


def inject_from_outside(
    c: Case,
    launchers: list[Launcher],
    run_dirs: dict[int, Path],
    trigger: Path,
    injected: dict[str, set[bytes]],
    res: Result,
    port: int = 0,
) -> float | None:
    """Faults this script injects itself; returns the injection time (or None)."""
    k = c.kind
    outside = {
        "forged_record",
        "forged_preemption",
        "forged_spare",
        "sigkill_rank",
        "launcher_sigterm",
        "launcher_sigkill",
        "monitor_crash",
        "disk_full",
        "corrupt_line",
        "long_line",
        "clock_jump",
        "relay_death",
        "planted_flightrec",
    }
    if k not in outside:
        return None
    if not wait_progress(run_dirs, c.nproc, 4, timeout=90):
        res.note += "training never reached step 4; "
        return None
    node_dir = run_dirs[c.fault_node]
    if k == "planted_flightrec":
        plant_traces(c, run_dirs[0], run_dirs[0].parents[2], injected)
        return None  # timed from the culprit's "injecting fault" line
    if k in ("forged_record", "forged_preemption", "forged_spare"):
        t = time.time()
        forge_store(c, port, run_dirs)
        return t
    if k == "sigkill_rank":
        path, rec = local_ranks(node_dir)[c.fault_local]
        t = time.time()
        os.kill(int(rec["pid"]), signal.SIGKILL)
        return t
    if k in ("launcher_sigterm", "launcher_sigkill"):
        sig = signal.SIGTERM if k == "launcher_sigterm" else signal.SIGKILL
        t = time.time()
        os.kill(launchers[c.fault_node].proc.pid, sig)
        if k == "launcher_sigkill":  # orphans: the job's processes alive 5 s after the kill
            time.sleep(ORPHAN_WAIT_S)
            left = job_processes(res.run_id)
            res.orphans_at_kill = len(left)
            res.orphan_cmds = [cmdline(p) for p in left]
        return t
    if k in ("monitor_crash", "relay_death"):
        t = time.time()
        trigger.touch()
        return t if k == "relay_death" else None  # monitor_crash: timed from the stall
    if k == "disk_full":
        filler = node_dir.parents[1] / "filler"
        t = time.time()
        with contextlib.suppress(OSError), filler.open("wb") as fh:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        end = time.monotonic() + 10
        while time.monotonic() < end and any(la.proc.poll() is None for la in launchers):
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            filler.unlink()
        return t
    path, rec = local_ranks(node_dir)[c.fault_local]
    if k == "corrupt_line":
        other = {**rec, "run_id": "another-run", "seq": rec["seq"] + 1}
        lines = [
            b"{not json at all",
            b"\x00\xff\xfe binary garbage \x80\x81",
            b'{"event": "heartbeat", "rank": ' + str(rec["rank"]).encode() + b"}",
            json.dumps(other).encode(),
        ]
    elif k == "long_line":
        lines = [b'{"pad": "' + b"x" * (9 * 1024 * 1024) + b'"}']
    else:  # clock_jump
        shift = 3600 * 10**9 if c.variant == "fwd" else -3600 * 10**9
        jumped = {**rec, "event": "heartbeat", "seq": rec["seq"] + 1}
        jumped["wall_time_ns"] = rec["wall_time_ns"] + shift
        append_raw(path, json.dumps(jumped, separators=(",", ":")).encode() + b"\n")
        return time.time()
    injected.setdefault(path.name, set()).update(lines)
    t = time.time()
    append_raw(path, b"".join(line + b"\n" for line in lines))
    return t


def evaluate(
    c: Case,
    res: Result,
    launchers: list[Launcher],
    run_dirs: dict[int, Path],
    inject_t: float | None,
    injected: dict[str, set[bytes]],
) -> None:
    findings = read_findings(run_dirs)
    res.observed = [where_of(f, c.nproc) for f in findings]
    res.messages = [str(f.get("message", ""))[:200] for f in findings]
    check_files(run_dirs, injected, res)
    out = "\n".join(la.text() for la in launchers)
    res.root_cause = root_cause_of(launchers)
    res.completed = "[demo] done:" in out or "[collective] done:" in out
    # injection time of faults the training injects itself: its "injecting fault" line
    if inject_t is None:
        marks = [t for la in launchers if (t := la.first(INJECT_MARK)) is not None]
        inject_t = min(marks) if marks else None
    if c.kind == "slow_rank":
        inject_t = first_step_time(run_dirs)
    if c.kind == "monitor_crash" and not any(la.first("thread dies now") for la in launchers):
        res.note += "the monitor thread was not killed; "
    if c.kind == "relay_death" and not any(la.first("thread dies now") for la in launchers):
        res.note += "the relay thread was not killed; "
    res.right = sorted(set(res.observed)) == sorted(set(res.expected))
    base = run_dirs[0].parents[2]
    if c.kind == "disk_full":
        # Right: the ranks that could not write long enough to look dead are reported
        # as on a full disk (node_disk_full), at least one, none as dead, and the
        # training completes.
        res.right = (
            bool(res.observed)
            and all(o[0] == "node_disk_full" for o in res.observed)
            and bool(res.completed)
        )
    if c.kind in (*NO_FINDING_KINDS, "clean"):
        res.right = res.right and bool(res.completed)
    if c.kind == "forged_record" and ignored_records(run_dirs[0]) == 0:
        res.right = False
        res.note += "the forged records were not counted as refused; "
    if c.kind == "planted_checkpoint":
        ran = (base / PLANTED_MARKER).exists()
        skipped = "step 999999999" in out and "falling back" in out
        if ran or not skipped:
            res.right = False
            res.note += "the planted checkpoint ran; " if ran else "the planted step not said; "
    if c.kind == "planted_flightrec":
        ran = (base / PLANTED_MARKER).exists()
        culprit = c.fault_node * c.nproc + c.fault_local
        named = any(
            (f.get("flight_recorder") or {}).get("missing_ranks") == [culprit] for f in findings
        )
        if ran or not named:
            res.right = False
            res.note += "a planted trace ran; " if ran else "the flight recorder named nobody; "
    if c.kind == "symlinked_step":
        other = base / "pretrain" / "step_000000001"
        if not ((other / "COMMITTED").exists() and (other / "data.bin").exists()):
            res.right = False
            res.note += "retention deleted through the link; "
    if c.kind == "forged_preemption" and any(rc != 0 for rc in res.rc):
        res.right = False
    if c.kind == "forged_spare":
        blocks = status_blocks(run_dirs[0])
        if any(rc != 0 for rc in res.rc) or not {"elastic", "timeouts"} <= blocks:
            res.right = False
            res.note += f"rc {res.rc}, status.json blocks {sorted(blocks)}; "
    if c.kind == "launcher_sigterm":
        # the signal took effect: the training stopped mid-run, nothing left behind
        res.right = res.right and not res.completed and res.orphans == 0
    if c.kind == "launcher_sigkill":
        res.right = res.right and res.orphans_at_kill == 0
    relay_said = ("rankguard relay: PUSH FAILED", "THE RELAY THREAD OF NODE 1 STOPPED")
    if c.kind == "relay_death" and not any(said in out for said in relay_said):
        res.right = False
        res.note += "the relay's failure was not said on node 1; "
    if c.kind == "monitor_crash":
        said = monitor_errors_said(run_dirs[0], launchers[0].text())
        if not said:
            res.note += "the monitor's failure was not in status.json and its log; "
        # once: the stall is found and acted on (the job then fails, no restart budget);
        # always: nothing is found, so the training must complete
        completed_ok = c.variant == "once" or bool(res.completed)
        res.right = res.right and said and completed_ok
    cause_ok = root_cause_right(c, res.root_cause)
    if not cause_ok:
        res.right = False
        res.note += f"root cause line: {res.root_cause or 'none'}; "
    if c.expected and inject_t is not None:
        times = [
            datetime.fromisoformat(f["detected_wall_time"]).timestamp()
            for f in findings
            if where_of(f, c.nproc) in set(c.expected) and f.get("detected_wall_time")
        ]
        if times:
            res.detect_s = round(min(times) - inject_t, 2)
    if inject_t is None and c.kind not in ("clean",) and c.expected:
        res.note += "no injection time; "


#: Kinds whose fault is one rank's and ends the job: node 0's root-cause line names it.
CAUSE_KINDS = ("step_hang", "collective_hang", "sigstop", "sigkill_rank", "exception")


def root_cause_of(launchers: list[Launcher]) -> str:
    """Node 0's root-cause line (the launcher that wrote the run's final report: it
    runs the monitor, whose findings the line agrees with), without its prefix."""
    node0 = next((la for la in launchers if "[rankguard] status:" in la.text()), launchers[0])
    prefix = "[rankguard] root cause: "
    line = next((x for x in node0.text().splitlines() if x.startswith(prefix)), "")
    return line.removeprefix(prefix)[:200]


def root_cause_right(c: Case, cause: str) -> bool:
    """The root-cause line agrees with the fault: it names the culprit's global rank for
    a rank's fault that ended the job (a hang found and killed, a crash), says no rank
    failed when a launcher was stopped, and is absent when the training completed."""
    if c.kind in CAUSE_KINDS or (c.kind == "monitor_crash" and c.variant == "once"):
        culprit = c.fault_node * c.nproc + c.fault_local
        return cause.startswith((f"rank {culprit} ", f"rank {culprit}:"))
    if c.kind == "launcher_sigterm":
        return not cause or cause.startswith("no rank failed: the job was stopped")
    if c.kind in (*NO_FINDING_KINDS, "clean", "slow_rank", "disk_full"):
        return not cause
    return True  # launcher_sigkill (nothing is said), relay_death (no single culprit)


# ---- report ------------------------------------------------------------------------------


def fmt_findings(items: list[tuple[str, int, int]]) -> str:
    if not items:
        return "none"
    seen: dict[tuple[str, int, int], int] = {}
    for it in items:
        seen[it] = seen.get(it, 0) + 1
    parts = []
    for (t, n, r), count in seen.items():
        parts.append(f"{SHORT.get(t, t)} n{n}r{r}" + (f" x{count}" if count > 1 else ""))
    return ", ".join(parts)


def print_row(r: Result) -> None:
    kind = r.kind + (f"/{r.variant}" if r.variant else "")
    if r.not_run:
        print(f"{r.index:>3} {kind:<22} {r.shape:<11} not run: {r.not_run}", flush=True)
        return
    detect = f"{r.detect_s:.2f}" if r.detect_s is not None else "-"
    rc = ",".join("-" if x is None else str(x) for x in r.rc)
    files = "ok" if not r.invalid_files else f"BAD {len(r.invalid_files)}"
    named = re.match(r"rank (\d+)\b", r.root_cause)
    cause = f"r{named.group(1)}" if named else ("?" if r.root_cause else "-")
    ettr = "-" if r.ettr is None else f"{100 * r.ettr:.0f}%"
    print(
        f"{r.index:>3} {kind:<20} {r.shape:<10} {r.where:<12} {fmt_findings(r.expected):<27} "
        f"{fmt_findings(r.observed):<32} {'yes' if r.right else 'NO':<5} {detect:>6} "
        f"{cause:>5} {'yes' if r.completed else 'no':<4} {r.orphans:>3} {files:<6} {rc:<6} "
        f"{r.wall_s:5.1f} {ettr:>5}" + (f"  {r.note.strip()}" if r.note else ""),
        flush=True,
    )


HEADER = (
    f"{'#':>3} {'kind':<20} {'shape':<10} {'fault':<12} {'expected':<27} {'observed':<32} "
    f"{'right':<5} {'det s':>6} {'cause':>5} {'done':<4} {'orp':>3} {'files':<6} {'rc':<6} "
    f"{'wall':>5} {'ETTR':>5}"
)


def summarize(results: list[Result]) -> dict[str, Any]:
    ran = [r for r in results if not r.not_run]
    faults = [r for r in ran if r.kind != "clean"]
    clean = [r for r in ran if r.kind == "clean"]
    right = [r for r in faults if r.right]
    per_kind: dict[str, Any] = {}
    for r in faults:
        k = per_kind.setdefault(r.kind, {"cases": 0, "right": 0, "detect_s": []})
        k["cases"] += 1
        k["right"] += bool(r.right)
        if r.detect_s is not None:
            k["detect_s"].append(r.detect_s)
    for k in per_kind.values():
        d = k.pop("detect_s")
        k["detected"] = len(d)
        k["median_detect_s"] = round(statistics.median(d), 2) if d else None
        k["max_detect_s"] = max(d) if d else None
    no_finding_kinds = {*NO_FINDING_KINDS, "launcher_sigterm"}
    return {
        "fault_cases": len(faults),
        "clean_runs": len(clean),
        "not_run": [f"{r.index} {r.kind}: {r.not_run}" for r in results if r.not_run],
        "right_attribution": len(right),
        "right_attribution_pct": round(100.0 * len(right) / len(faults), 1) if faults else None,
        "false_positives_clean": sum(len(r.observed) for r in clean),
        "clean_runs_not_completed": sum(1 for r in clean if not r.completed),
        "findings_where_none_expected": sum(
            len(r.observed) for r in faults if r.kind in no_finding_kinds
        ),
        "orphans": sum(r.orphans for r in ran),
        "cases_with_orphans": sum(1 for r in ran if r.orphans),
        "invalid_files": sum(len(r.invalid_files) for r in ran),
        "per_kind": per_kind,
        "ettr_by_case": {
            f"{r.index} {r.kind}" + (f"/{r.variant}" if r.variant else ""): (
                None if r.ettr is None else round(r.ettr, 4)
            )
            for r in ran
        },
        "median_ettr_fault_cases": _median([r.ettr for r in faults]),
        "median_ettr_clean_runs": _median([r.ettr for r in clean]),
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def print_summary(s: dict[str, Any]) -> None:
    print()
    print(
        f"fault cases: {s['fault_cases']}, clean runs: {s['clean_runs']}"
        + (f", not run: {len(s['not_run'])}" if s["not_run"] else "")
    )
    print(
        f"right attribution: {s['right_attribution']}/{s['fault_cases']} "
        f"({s['right_attribution_pct']} %)  goal 100 %"
    )
    print(
        f"false positives (findings in clean runs): {s['false_positives_clean']}  goal 0; "
        f"clean runs not completed: {s['clean_runs_not_completed']}"
    )
    print(f"findings in fault cases that expect none: {s['findings_where_none_expected']}")
    pct = {
        k: "-" if s[k] is None else f"{100 * s[k]:.1f} %"
        for k in ("median_ettr_fault_cases", "median_ettr_clean_runs")
    }
    print(
        f"ETTR (rankguard's goodput ledger of each run): median {pct['median_ettr_fault_cases']} "
        f"in fault cases, {pct['median_ettr_clean_runs']} in clean runs (each case's in its row)"
    )
    print(f"orphans: {s['orphans']} in {s['cases_with_orphans']} case(s)  goal 0")
    print(f"invalid files: {s['invalid_files']}  goal 0")
    print()
    print(f"{'kind':<18} {'cases':>5} {'right':>5} {'detected':>8} {'median s':>8} {'max s':>6}")
    for kind, k in s["per_kind"].items():
        med = "-" if k["median_detect_s"] is None else f"{k['median_detect_s']:.2f}"
        mx = "-" if k["max_detect_s"] is None else f"{k['max_detect_s']:.2f}"
        print(f"{kind:<18} {k['cases']:>5} {k['right']:>5} {k['detected']:>8} {med:>8} {mx:>6}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one case per kind, one clean run")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a collective hang and a monitor crash, 1 rank each; exit 1 if wrong",
    )
    p.add_argument("--only", default="", help="comma-separated kinds to run")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--keep", default=None, help="keep each case's logs under this directory")
    args = p.parse_args()
    cases = smoke_matrix() if args.smoke else quick_matrix() if args.quick else full_matrix()
    if args.only:
        kinds = set(args.only.split(","))
        cases = [c for c in cases if c.kind in kinds]
    can_mount = os.geteuid() == 0 and shutil.which("mount") is not None
    started = datetime.now(timezone.utc)
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPU(s), {platform.machine()}; "
        f"started {started:%Y-%m-%d %H:%M:%S} UTC; {len(cases)} case(s)"
    )
    print(
        "right = set of (finding, node, local rank) == expected; det s = first expected "
        "finding - injection; cause = the launcher's root-cause line; done = the training "
        "reached its last step; orp = processes of the job alive 5 s after the launchers "
        "exited; files = every JSON file and JSONL line parses (injected lines excepted)"
    )
    print(HEADER)
    print("-" * len(HEADER))
    results: list[Result] = []
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def one(i: int, c: Case) -> Result:
        try:
            return run_case(i, c, work, can_mount)
        except Exception as exc:  # one broken case must not lose the others
            r = Result(i, c.kind, c.variant, c.shape, c.where, "-", list(c.expected))
            r.not_run = f"bench error: {exc!r}"[:200]
            return r

    try:
        if args.smoke:  # its cases side by side (1 rank each): the smoke's wall is its longest
            with ThreadPoolExecutor(max_workers=len(cases)) as pool:
                results = list(pool.map(one, range(1, len(cases) + 1), cases))
            for r in results:
                print_row(r)
        else:
            for i, c in enumerate(cases, 1):
                results.append(one(i, c))
                print_row(results[-1])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    s = summarize(results)
    print_summary(s)
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "started": started.isoformat(),
                    "command": " ".join(["python", "bench/fault_matrix.py", *sys.argv[1:]]),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "settings": FAST,
                    "summary": s,
                    "cases": [asdict(r) for r in results],
                },
                indent=1,
            )
        )
    if args.smoke and not all(r.right and not r.not_run for r in results):
        return 1
    if args.smoke and any(r.ettr is None for r in results):
        print("smoke: a case has no goodput ledger (no ETTR)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
