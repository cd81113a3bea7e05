"""Restart speed: crash/hang to the first completed step of the restarted job, rankguard
next to torchrun, on the same demo script and machine.

What: the demo (``rankguard.demo.train``, 2 CPU ranks, gloo, a checkpoint every 3 steps)
gets a fault on rank 1 at step 5 and must resume from its last checkpoint in a restarted
worker group (one in-job restart allowed). Scenarios, ``--repeats`` runs each (median):

- crash: rank 1 raises. ``rankguard run --max-restarts 1`` (and the same with
  ``--preload torch``: ranks forked from a fork server that has imported torch, label
  ``rankguard+preload``) vs ``python -m torch.distributed.run --standalone
  --max-restarts 1`` (plain torchrun; the demo runs there too, ``rankguard.init()`` is a
  no-op);
- hang (``--fault stall``): rank 1 sleeps inside its step. rankguard (both ways) with hang detection
  and fault tolerance on (progress timeout 4 s); torchrun once, with a ``--hang-window``
  time limit, to show what it does (it sees processes exit, not hangs: only the demo's
  gloo collective timeout, ``--pg-timeout 30``, can turn the hang into a crash).

Why: the restart figure to beat is torchrun's 6.1 s crash-to-first-step on 2 CPU ranks,
measured in an earlier bench run on this kind of machine when its restart worked (it
failed or hung in init otherwise), so the figure is taken side by side here, and every
failed restart is counted: a run that exits non-zero, does not finish within
``--timeout`` or never logs a resumed step.

How (the same for both launchers): the launcher's merged stdout/stderr is read by a
thread that stamps each line with ``time.time()`` on arrival. The fault time is the
``[demo rank 1] injecting fault`` line, the end is the first ``[demo] step`` line after
``[demo] resumed from`` (``--log-every 1``; rank 0 prints). ``LOGLEVEL=INFO`` makes torch
elastic's agent (used by both launchers) log its restart stages, which stamp the
breakdown: agent sees the failure (``closing signal SIGTERM`` / ``failed (exitcode``) ->
old group stopped (``Rendezvous'ing worker group``) -> rendezvous done (``Starting worker
group``) -> ``resumed from`` -> first step. rankguard adds files: findings.jsonl
``detected_wall_time`` (the monitor's finding), stack-dump file mtimes, the ``killing
rank`` line, restarts.jsonl, and the heartbeat files, whose records give a cross-check of
the headline (the fault rank's last record, or last progress for a stall, to the first
record with ``progress_seq > 0`` of a new pid) and the new processes' ``process_start``.

Run: ``python bench/restart.py [--repeats 5]`` (about 8-25 s per run when restarts work,
up to ``--timeout`` per run when they hang). ``--env KEY=VALUE`` (repeatable) runs both
launchers with extra environment, for diagnosis only; the default is the plain setup.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

# The demo's job: same arguments under both launchers (--smoke: 1 rank, 3 steps).
NPROC = 2
STEPS = 12
FAULT_RANK = 1
FAULT_STEP = 5
CKPT_EVERY = 3
PG_TIMEOUT_S = 30
# rankguard's heartbeat settings (tests/e2e FAST values) and fault tolerance for hangs.
HEARTBEAT_SETS = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
    "heartbeat.scan_interval_s=0.5",
]
FT_SETS = [
    "fault_tolerance.enable_ft_package=true",
    "fault_tolerance.num_in_job_restarts=1",
    "fault_tolerance.termination_grace_s=3",
]

INJECT = "injecting fault"
RESUMED = "[demo] resumed from"
STEP = "[demo] step "
DONE = "[demo] done:"
AGENT_SAW = ("closing signal SIGTERM", "failed (exitcode", "Worker group FAILED")
RDZV = "Rendezvous'ing worker group"
STARTING = "Starting worker group"
KILLING = "killing rank"
WORKER_MARKERS = ("rankguard.launcher.worker", "rankguard.demo.train", "multiprocessing.forkserver")

Line = tuple[float, str]
PRELOAD = "rankguard+preload"  # rankguard run --preload torch: ranks forked, torch imported


# ---- running one job ------------------------------------------------------------------


@dataclass
class Job:
    launcher: str  # rankguard | rankguard+preload | torchrun
    fault: str  # crash | stall
    workdir: Path
    run_id: str
    cmd: list[str]
    rc: int | None = None
    timed_out: bool = False
    start_t: float = 0.0
    duration_s: float = 0.0
    lines: list[Line] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.workdir / "logs" / "heartbeat" / self.run_id


def demo_args(fault: str, workdir: Path) -> list[str]:
    args = [
        "-m",
        "rankguard.demo.train",
        "--steps",
        str(STEPS),
        "--log-every",
        "1",
        "--checkpoint-every",
        str(CKPT_EVERY),
        "--checkpoint-dir",
        str(workdir / "ckpt"),
        "--fault",
        fault,
        "--fault-rank",
        str(FAULT_RANK),
        "--fault-step",
        str(FAULT_STEP),
        "--pg-timeout",
        str(PG_TIMEOUT_S),
    ]
    if fault == "stall":
        args += ["--fault-duration", "600"]
    return args


def build_cmd(launcher: str, fault: str, workdir: Path, run_id: str) -> list[str]:
    py = [sys.executable, "-u"]
    if launcher == "torchrun":
        return [
            *py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(NPROC),
            "--max-restarts",
            "1",
            "--log-dir",
            str(workdir / "elastic"),
            *demo_args(fault, workdir),
        ]
    sets = HEARTBEAT_SETS + (FT_SETS if fault == "stall" else [])
    restarts = [] if fault == "stall" else ["--max-restarts", "1"]
    if launcher == PRELOAD:
        restarts += ["--preload", "torch"]
    cmd = [
        *py,
        "-m",
        "rankguard.cli.main",
        "run",
        "--standalone",
        "--nproc-per-node",
        str(NPROC),
        "--rdzv-id",
        run_id,
        "--log-dir",
        str(workdir / "logs"),
        *restarts,
    ]
    for item in sets:
        cmd += ["--set", item]
    return cmd + demo_args(fault, workdir)


def _reader(stream: IO[str], sink: list[Line]) -> None:
    for line in stream:
        sink.append((time.time(), line.rstrip("\n")))


def processes_with(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose command line contains ``marker``, or
    whose working directory is the directory ``marker`` or one under it: ``--preload``'s
    fork server and the ranks it forks have a command line of their own
    (``multiprocessing.forkserver``) but the launcher's working directory (each job here
    starts in its own temp dir)."""
    out: list[tuple[int, str]] = []
    me = os.getpid()
    real = os.path.realpath(marker)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, or another user's
            cwd = ""
        if marker in cmdline or cwd == real or cwd.startswith(real.rstrip("/") + "/"):
            out.append((int(entry.name), cmdline))
    return out


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap_leftovers(marker: str, *, wait_s: float = 5.0) -> list[str]:
    """Wait up to ``wait_s`` for this run's processes to go; SIGKILL and name the rest.
    Only processes whose command line holds this run's own temp dir, or that run in it,
    are touched."""
    deadline = time.monotonic() + wait_s
    left = processes_with(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_with(marker)
    names: list[str] = []
    for pid, cmdline in left:
        kind = next((m for m in WORKER_MARKERS if m in cmdline), cmdline.split(" -m ")[-1][:40])
        names.append(f"pid {pid} ({kind})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return names


TAIL_LINES = 80  # of a failed job's console, printed
TAIL_LINE_CHARS = 400
ERROR_FILE_CHARS = 3000  # of each per-rank error file, printed
ERROR_FILES = 4


def print_failed_job(
    label: str, rc: int | None, lines: Sequence[tuple[float, str]], workdir: Path
) -> None:
    """Why a job exited non-zero, in the bench's own output (a CI log keeps nothing else):
    the last :data:`TAIL_LINES` lines of its console, stamped with the seconds since its
    first line, and the per-rank error files torch elastic wrote under ``workdir``
    (``error.json``, where a rank's entry point is wrapped in ``@record``)."""
    print(f"    --- {label}: exit {rc}; its console's last {TAIL_LINES} lines:")
    t0 = lines[0][0] if lines else 0.0
    for t, text in list(lines)[-TAIL_LINES:]:
        cut = text if len(text) <= TAIL_LINE_CHARS else text[:TAIL_LINE_CHARS] + " [...]"
        print(f"    | {t - t0:7.2f}s {cut}")
    errors = sorted(workdir.rglob("error.json")) if workdir.is_dir() else []
    for path in errors[:ERROR_FILES]:
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace")
            more = " [...]" if len(text) > ERROR_FILE_CHARS else ""
            print(f"    --- {path.relative_to(workdir)}:\n{text[:ERROR_FILE_CHARS]}{more}")
    if len(errors) > ERROR_FILES:
        print(f"    --- {len(errors) - ERROR_FILES} more error files under {workdir}")
    print(f"    --- end of {label}", flush=True)


def run_job(
    launcher: str,
    fault: str,
    *,
    timeout_s: float,
    extra_env: dict[str, str],
    tag: str,
) -> Job:
    workdir = Path(tempfile.mkdtemp(prefix=f"rg-restart-{launcher}-{fault}-"))
    run_id = f"bench-{launcher[:2]}-{fault}-{tag}-{os.getpid()}"
    job = Job(launcher, fault, workdir, run_id, build_cmd(launcher, fault, workdir, run_id))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOGLEVEL": "INFO", **extra_env}
    job.start_t = time.time()
    proc = subprocess.Popen(
        job.cmd,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    assert proc.stdout is not None
    reader = threading.Thread(target=_reader, args=(proc.stdout, job.lines), daemon=True)
    reader.start()
    try:
        job.rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        job.timed_out = True
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            job.rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            job.rc = proc.wait()
    job.duration_s = time.time() - job.start_t
    reader.join(timeout=5)
    # torch elastic starts each worker in its own session: find ours by the temp dir.
    job.leftovers = reap_leftovers(str(workdir))
    return job


# ---- reading a job --------------------------------------------------------------------


def _find(lines: Sequence[Line], needles: str | Iterable[str], start: int = 0) -> int | None:
    keys = (needles,) if isinstance(needles, str) else tuple(needles)
    for i in range(start, len(lines)):
        if any(k in lines[i][1] for k in keys):
            return i
    return None


def _iso(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@dataclass
class Result:
    job: Job
    ok: bool
    why: str
    t: dict[str, float]  # milestone -> wall time (s)
    hb_figure: float | None = None
    restarts_wall_time: str | None = None

    @property
    def figure(self) -> float | None:
        if "fault" in self.t and "first_step" in self.t:
            return self.t["first_step"] - self.t["fault"]
        return None


def _why(job: Job, after: int) -> str:
    if job.timed_out:
        return f"no result within {job.duration_s:.0f}s (killed)"
    for _t, text in reversed(job.lines[after:]):
        if "connectFullMesh failed" in text or "Connect timeout" in text:
            return text.strip()[:200]
    for _t, text in reversed(job.lines[after:]):
        if "Error" in text and "Traceback" not in text:
            return text.strip()[:200]
    return f"exit code {job.rc}"


def _heartbeats(run_dir: Path) -> dict[int, tuple[int, list[dict[str, Any]]]]:
    """pid -> (rank, records) for every heartbeat file of the run."""
    out: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for path in run_dir.glob("rank_*_pid_*.heartbeat.jsonl"):
        parts = path.name.split("_")
        out[int(parts[3].split(".")[0])] = (int(parts[1]), _jsonl(path))
    return out


def analyse(job: Job) -> Result:
    lines = job.lines
    t: dict[str, float] = {}
    i_fault = _find(lines, INJECT)
    if i_fault is not None:
        t["fault"] = lines[i_fault][0]
    start = i_fault or 0
    i_kill = _find(lines, KILLING, start)
    i_saw = _find(lines, AGENT_SAW, start)
    i_rdzv = _find(lines, RDZV, start)
    i_starting = _find(lines, STARTING, i_rdzv) if i_rdzv is not None else None
    i_resumed = _find(lines, RESUMED, start)
    i_first = _find(lines, STEP, i_resumed) if i_resumed is not None else None
    for name, idx in (
        ("kill_issued", i_kill),
        ("agent_saw_failure", i_saw),
        ("group_stopped", i_rdzv),
        ("rendezvous_done", i_starting),
        ("resumed", i_resumed),
        ("first_step", i_first),
    ):
        if idx is not None:
            t[name] = lines[idx][0]
    done = _find(lines, DONE, i_first or 0) is not None
    ok = (
        job.rc == 0
        and not job.timed_out
        and i_fault is not None
        and i_first is not None
        and done
        and not job.leftovers
    )
    why = "ok" if ok else _why(job, i_starting or start)
    if job.leftovers and not job.timed_out and job.rc == 0:
        why = "left processes behind: " + ", ".join(job.leftovers)
    res = Result(job, ok, why, t)
    if job.launcher.startswith("rankguard"):
        _rankguard_files(res)
    return res


def _rankguard_files(res: Result) -> None:
    job, t = res.job, res.t
    run_dir = job.run_dir
    findings = [f for f in _jsonl(run_dir / "findings.jsonl") if f.get("detected_wall_time")]
    acted = [f for f in findings if f.get("action") in ("restart", "abort")]
    if acted:
        t["finding"] = _iso(acted[0]["detected_wall_time"])
    restarts = _jsonl(run_dir / "restarts.jsonl")
    if restarts:
        res.restarts_wall_time = str(restarts[0].get("wall_time"))
    fault_t = t.get("fault")
    if fault_t is None:
        return
    hbs = _heartbeats(run_dir)
    old = {pid: v for pid, v in hbs.items() if v[1] and v[1][0]["wall_time_ns"] / 1e9 < fault_t}
    new = {pid: v for pid, v in hbs.items() if v[1] and v[1][0]["wall_time_ns"] / 1e9 > fault_t}
    # Stack dumps: the old pids' files, written by faulthandler (created empty at start).
    mtimes = [
        p.stat().st_mtime
        for pid in old
        for p in (run_dir / "stacks").glob(f"rank_*_pid_{pid}.txt")
        if p.stat().st_size > 0
    ]
    if mtimes and "finding" in t:
        t["stacks_written"] = max(mtimes)
    if new:
        t["process_start"] = min(v[1][0]["wall_time_ns"] / 1e9 for v in new.values())
    hb_fault = None
    for rank, recs in old.values():
        if rank != FAULT_RANK or not recs:
            continue
        last = recs[-1]
        if job.fault == "crash":
            hb_fault = last["wall_time_ns"] / 1e9
        else:
            hb_fault = last["wall_time_ns"] / 1e9 - float(last.get("since_progress_s") or 0.0)
    firsts = [
        r["wall_time_ns"] / 1e9
        for _rank, recs in new.values()
        for r in recs[:]
        if (r.get("progress_seq") or 0) > 0
    ]
    if hb_fault is not None and firsts and res.ok:
        res.hb_figure = min(firsts) - hb_fault


# ---- report ---------------------------------------------------------------------------


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]"


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


BREAKDOWN = [
    # (label, from milestone, to milestone)
    ("detection (fault -> monitor finding)", "fault", "finding"),
    ("stack dumps written (finding -> dump mtime)", "finding", "stacks_written"),
    ("dump wait + kill (dump -> 'killing rank')", "stacks_written", "kill_issued"),
    ("agent sees failure (-> SIGTERM/failed line)", None, "agent_saw_failure"),
    ("stop old group (-> Rendezvous'ing)", "agent_saw_failure", "group_stopped"),
    ("rendezvous (-> Starting worker group)", "group_stopped", "rendezvous_done"),
    ("spawn + imports (-> new process_start)", "rendezvous_done", "process_start"),
    ("init + model + ckpt load (-> resumed)", "process_start", "resumed"),
    ("  [start -> resumed, both launchers]", "rendezvous_done", "resumed"),
    ("first step (resumed -> first step line)", "resumed", "first_step"),
    ("TOTAL fault -> first step", "fault", "first_step"),
]


def _previous(t: dict[str, float], order: list[str], name: str) -> str | None:
    idx = order.index(name)
    for prev in reversed(order[:idx]):
        if prev in t:
            return prev
    return None


ORDER = [
    "fault",
    "finding",
    "stacks_written",
    "kill_issued",
    "agent_saw_failure",
    "group_stopped",
    "rendezvous_done",
    "process_start",
    "resumed",
    "first_step",
]


def breakdown_rows(results: list[Result]) -> list[tuple[str, str]]:
    ok = [r for r in results if r.ok]
    rows: list[tuple[str, str]] = []
    for label, a, b in BREAKDOWN:
        vals: list[float] = []
        for r in ok:
            frm = a if a is not None else _previous(r.t, ORDER, b)
            if frm in r.t and b in r.t:
                vals.append(r.t[b] - r.t[frm])
        rows.append((label, _med(vals)))
    return rows


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def describe_hang(job: Job) -> str:
    """What torchrun did with the hang inside its window."""
    lines = job.lines
    i_fault = _find(lines, INJECT)
    if i_fault is None:
        return f"the fault was never injected (rc {job.rc})"
    t0 = lines[i_fault][0]
    parts = []
    i_err = _find(lines, ("Timed out", "timed out", "Connection closed by peer"), i_fault)
    if i_err is not None:
        parts.append(f"first collective error at +{lines[i_err][0] - t0:.1f}s")
    i_saw = _find(lines, AGENT_SAW, i_fault)
    if i_saw is not None:
        parts.append(f"agent saw a worker exit at +{lines[i_saw][0] - t0:.1f}s")
    i_rdzv = _find(lines, RDZV, i_fault)
    i_start = _find(lines, STARTING, i_rdzv) if i_rdzv is not None else None
    if i_start is not None:
        parts.append(f"restarted the group at +{lines[i_start][0] - t0:.1f}s")
    else:
        parts.append("no restart")
    i_res = _find(lines, RESUMED, i_fault)
    i_first = _find(lines, STEP, i_res) if i_res is not None else None
    if i_first is not None:
        parts.append(f"first step after restart at +{lines[i_first][0] - t0:.1f}s")
    elif i_start is not None:
        parts.append(f"no step after the restart ({_why(job, i_start)})")
    end = "still hung, killed" if job.timed_out else f"exited {job.rc}"
    parts.append(f"{end} at +{job.start_t + job.duration_s - t0:.1f}s")
    return "; ".join(parts)


def smoke_job() -> None:
    """``--smoke``: the smallest job that still crashes, restarts and resumes from a
    checkpoint: 1 rank, a checkpoint at step 2, the crash at step 3 of 3."""
    global NPROC, STEPS, FAULT_RANK, FAULT_STEP, CKPT_EVERY
    NPROC, STEPS, FAULT_RANK, FAULT_STEP, CKPT_EVERY = 1, 3, 0, 3, 2


def header(extra_env: dict[str, str], smoke: bool = False) -> None:
    if smoke:  # torch's version without importing it here (its CPU is the smoke's)
        from importlib.metadata import version

        torch_version = version("torch")
    else:
        import torch

        torch_version = torch.__version__
    print(
        f"python {platform.python_version()}, torch {torch_version}, "
        f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"demo: {NPROC} rank{'s' if NPROC != 1 else ''} (gloo), --steps {STEPS} --log-every 1 "
        f"--checkpoint-every {CKPT_EVERY} "
        f"--fault-rank {FAULT_RANK} --fault-step {FAULT_STEP} --pg-timeout {PG_TIMEOUT_S}; "
        "one in-job restart; LOGLEVEL=INFO"
    )
    if extra_env:
        print(
            "EXTRA ENVIRONMENT (diagnostic run): "
            + " ".join(f"{k}={v}" for k, v in extra_env.items())
        )


def progress_line(r: Result) -> str:
    fig = f"{r.figure:6.2f}s" if r.ok and r.figure is not None else "   -   "
    hb = f" (heartbeats {r.hb_figure:.2f}s)" if r.hb_figure is not None else ""
    status = "ok" if r.ok else f"FAILED: {r.why}"
    return (
        f"  {r.job.launcher:17s} {r.job.fault:5s} rc={r.job.rc!s:4s} {r.job.duration_s:5.1f}s "
        f"fault->first step {fig}{hb}  {status}"
    )


def parse_env(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--env wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def finish(job: Job, keep: bool, ok: bool) -> None:
    if not ok and job.rc != 0 and not job.timed_out:  # a timed-out run's cause is its limit
        print_failed_job(f"{job.launcher} {job.fault}", job.rc, job.lines, job.workdir)
    if keep or not ok:
        print(f"    files kept: {job.workdir}")
        (job.workdir / "output.txt").write_text(
            "".join(f"{t:.3f} {text}\n" for t, text in job.lines)
        )
    else:
        shutil.rmtree(job.workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per scenario (median)")
    p.add_argument("--timeout", type=float, default=120.0, help="per run (s); over: failed")
    p.add_argument("--hang-window", type=float, default=60.0, help="torchrun stall run (s)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE, both launchers")
    p.add_argument("--keep", action="store_true", help="keep every run's temp dir")
    p.add_argument(
        "--smoke", action="store_true", help="one rankguard crash run, 1 rank, 3 steps (seconds)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.repeats = 1
        smoke_job()
    extra_env = parse_env(args.env)
    header(extra_env, smoke=args.smoke)

    results: dict[tuple[str, str], list[Result]] = {}
    plan = [
        ("rankguard", "crash"),
        (PRELOAD, "crash"),
        ("torchrun", "crash"),
        ("rankguard", "stall"),
        (PRELOAD, "stall"),
    ]
    if args.smoke:
        plan = [("rankguard", "crash")]
    for i in range(args.repeats):  # interleaved, so load changes hit both launchers
        for launcher, fault in plan:
            job = run_job(launcher, fault, timeout_s=args.timeout, extra_env=extra_env, tag=str(i))
            res = analyse(job)
            results.setdefault((launcher, fault), []).append(res)
            print(progress_line(res), flush=True)
            finish(job, args.keep, res.ok)
    hang_text = "not run (--smoke)"
    if not args.smoke:
        hang_job = run_job(
            "torchrun", "stall", timeout_s=args.hang_window, extra_env=extra_env, tag="hang"
        )
        hang_text = describe_hang(hang_job)
        print(f"  torchrun  stall {args.hang_window:.0f}s window: {hang_text}", flush=True)
        finish(hang_job, args.keep, not hang_job.timed_out and hang_job.rc == 0)

    def figures(key: tuple[str, str]) -> list[float]:
        return [r.figure for r in results.get(key, []) if r.ok and r.figure is not None]

    def count(key: tuple[str, str]) -> str:
        rs = results.get(key, [])
        return f"{sum(r.ok for r in rs)}/{len(rs)}"

    print()
    print("fault -> first completed step of the restarted job (s), median [min-max] of the")
    print("successful runs; line arrival times; heartbeat cross-check for rankguard")
    rows = []
    for key, label in (
        (("rankguard", "crash"), "crash"),
        ((PRELOAD, "crash"), "crash"),
        (("torchrun", "crash"), "crash"),
        (("rankguard", "stall"), "hang (stall)"),
        ((PRELOAD, "stall"), "hang (stall)"),
    ):
        hb = [r.hb_figure for r in results.get(key, []) if r.hb_figure is not None]
        rows.append((key[0], label, _fmt(figures(key)), _fmt(hb), count(key)))
    rows.append(("torchrun", "hang (stall)", "-", "-", "see below (1 run)"))
    print_table(["launcher", "fault", "lines", "heartbeats", "successes/attempts"], rows)
    print(f"torchrun, hang, one run, {args.hang_window:.0f}s window: {hang_text}")

    print()
    print("breakdown, medians over successful runs (s); '-' = no such stage/stamp")
    keys = [k for k in plan if results.get(k)]
    cols = [breakdown_rows(results.get(k, [])) for k in keys]
    table = [(label, *(c[i][1] for c in cols)) for i, (label, _, _) in enumerate(BREAKDOWN)]
    print_table(["stage", *(f"{k[0]} {k[1]}" for k in keys)], table)
    stamps = sorted(
        {r.restarts_wall_time for rs in results.values() for r in rs if r.restarts_wall_time}
    )
    if stamps:
        print(f"restarts.jsonl wall_time (cross-check; whole seconds only): e.g. {stamps[0]}")

    failed = [r for rs in results.values() for r in rs if not r.ok]
    if failed:
        print()
        print("failed restarts:")
        for r in failed:
            print(f"  {r.job.launcher} {r.job.fault}: {r.why}")

    tr = figures(("torchrun", "crash"))
    print()
    for launcher in ("rankguard", PRELOAD):
        rg = figures((launcher, "crash"))
        if not rg:
            print(f"goal: crash -> first step faster than torchrun -> no {launcher} success")
            continue
        med = statistics.median(rg)
        print(
            f"goal: crash -> first step < torchrun's 6.1 s (earlier run) -> {launcher} {med:.2f}s: "
            + ("MEETS" if med < 6.1 else "MISSES")
        )
        if tr:
            med_tr = statistics.median(tr)
            print(
                f"goal: crash -> first step < torchrun measured here ({med_tr:.2f}s) -> "
                f"{launcher} {med:.2f}s: " + ("MEETS" if med < med_tr else "MISSES")
            )
        else:
            print("goal: crash -> first step < torchrun measured here -> no torchrun success")
    for launcher in ("rankguard", PRELOAD):
        st = figures((launcher, "stall"))
        if st:
            print(
                f"hang -> first step: {launcher} {statistics.median(st):.2f}s; "
                f"torchrun: {hang_text}"
            )
    print("restart success: " + ", ".join(f"{k[0]} {k[1]} {count(k)}" for k in plan))
    return 1 if args.smoke and failed else 0


if __name__ == "__main__":
    sys.exit(main())
