"""Goodput under faults: ETTR and where the wall time went, rankguard (its defaults,
``--preload torch``, live recovery) next to torchrun, on the same job with the same
faults, in the same sitting.

What: the demo (``rankguard.demo.train`` through ``bench/goodput_job.py``, 2 CPU ranks,
gloo) runs for ``--minutes`` of wall clock; a fault hits rank 1 about every ``--period``
seconds (a seeded mix of ``exception``, ``sigkill``, ``hang`` and ``sigstop``; the same
times and kinds for every mode).

The job's settings are those a user expecting one fault a minute would choose, and are
printed with the figures:

- checkpoints through the checkpoint manager's async mode (``--async-save``: the loop
  stalls only while the state is copied to host memory; ``--sync-save`` for the loop
  writing it), every ``--checkpoint-every`` steps (50, about 4-7 s of training here):
  Young/Daly's interval sqrt(2 x C x MTBF) for a synchronous save of C = 0.2-0.3 s at
  one fault a minute is 5-6 s, and a synchronous save that often stalls the loop
  3-5 %; asynchronous, 17-26 ms a save on average (10 minutes at load 4-13). Each
  group restart redoes the steps since the last one (half the interval on average);
- rankguard's hang detection: progress timeout 4 s, process timeout 3 s (steps of
  ~0.1 s; rankguard's defaults, minutes, suit jobs whose steps and saves take long);
- live recovery's in-process restart: soft timeout 3 s, hard timeout 6 s, the round's
  gloo timeout 2 s (this job's steps, collectives included, take ~0.1 s: a stuck peer
  is given up after 2 s), and room for one re-entry a minute (``max_restarts_per_window`` 30 in
  600 s; the default, 5, ends the sixth fault of ten minutes in a group restart).

Modes (``--modes``, default all), one job after the other:

- ``rankguard``: ``rankguard run --max-restarts N`` with heartbeats and fault tolerance
  (a hang is found by its progress timeout, the rank killed, the group restarted);
- ``preload``: the same with ``--preload torch`` (each restart's workers forked from a
  server that imported torch once);
- ``live``: the same with ``--standby-ranks 1`` and the in-process restart on: a
  SIGKILLed rank, or a SIGSTOPped one (killed at its process timeout), is taken over by
  a standby while the job goes on (live recovery), an exception or a hang ends in an
  in-process re-entry of every rank; a second loss with no standby left restarts the
  group;
- ``live-preload``: ``live`` with ``--preload torch`` (its ranks, standbys and any group
  restart's ranks forked from the fork server; not in the default set, ``--modes``);
- ``torchrun``: ``python -m torch.distributed.run --standalone --max-restarts N``; a hang
  ends when the peer's gloo collective times out (``--pg-timeout``, the same for all);
- ``torchrun-fresh``: the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (torch's
  switch for a fresh rendezvous store per round, which ``rankguard run`` sets): without
  it a restarted gloo group can read a dead peer's address from the store the rounds
  share and fail in ``connectFullMesh`` (``Connection refused``).

How (the same for every mode): the launcher's merged output is read by a thread that
stamps each line on arrival; the ledger (``rankguard.goodput.build_ledger``) is built
from those lines: an attempt starts at the launch (the first) or at the agent's
``Starting worker group`` (the others), its completed steps are rank 0's ``[demo] step``
lines (``--log-every 1``), the iteration it resumed after is ``[demo] resumed from``,
the decision after a failure is the agent's ``Worker group FAILED``, the job ends when
the launcher exits. A live recovery is the launcher's ``live recovery: rank`` line (its
detection) to the next step; an in-process re-entry is rank 0's ``round N failed`` line
to its ``[demo] in-process restart N+1: resuming at step S``. Checkpoint saves are not
in the console: their time counts as productive in every column. For rankguard's modes
the ledger of the run directory (``rankguard goodput``, which also has the saves) is
printed beside it.

Run: ``python bench/goodput.py [--minutes 10] [--period 60] [--seed 0] [--modes ...]``
(``--minutes`` per mode plus the start-ups); ``--smoke``: one exception on rankguard's
``preload`` job (the restarted ranks forked, not interpreters importing torch; ``--modes``
for others), the job ending at the first check after it (each job is given 90 s). The
exit code is 1 when one of rankguard's jobs did not end on time with every fault fired;
torchrun's job ending otherwise (a restart that hangs in its start-up until the bench's
time limit) is a figure of the table, said in its ``faults`` column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from rankguard.goodput import (
    PARTS,
    Attempt,
    Interruption,
    Ledger,
    LiveRecovery,
    Part,
    build_ledger,
    ettr_text,
    read_ledger,
)

NPROC = 2
FAULT_RANK = 1
PG_TIMEOUT_S = 30
JOB = Path(__file__).resolve().parent / "goodput_job.py"
KINDS = ("exception", "sigkill", "hang", "sigstop")
# rankguard's heartbeat settings and fault tolerance for hangs (as bench/restart.py)
SETS = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
    "heartbeat.scan_interval_s=0.5",
    "fault_tolerance.enable_ft_package=true",
    "fault_tolerance.termination_grace_s=3",
]
STEP_RE = re.compile(r"\[demo\] step (\d+)/")
RESUMED_RE = re.compile(r"\[demo\] resumed from step (\d+)")
STARTING = "Starting worker group"
DECIDED = "Worker group FAILED"
INJECTED = "[goodput-job rank"
LIVE_RECOVERY = "] live recovery: rank"  # the launcher's line: a standby takes the rank
ROUND_FAILED_RE = re.compile(r"rankguard: rank (\d+): round (\d+) failed")
REENTERED_RE = re.compile(r"\[demo\] in-process restart (\d+): resuming at step (\d+)")
# live recovery: the in-process wrapper (the survivors re-enter, a standby takes a lost
# rank's place), its timeouts short (as bench/live_recovery.py)
LIVE_SETS = [
    "inprocess_restart.enabled=true",
    "inprocess_restart.soft_timeout=3",
    "inprocess_restart.hard_timeout=6",
    "inprocess_restart.process_group_timeout=2",
    # one fault a minute: each is a re-entry of the survivors (the default, 5 in 600 s,
    # ends the 6th in ten minutes in a group restart)
    "inprocess_restart.max_restarts_per_window=30",
]
RANKGUARD, PRELOAD, LIVE, TORCHRUN = "rankguard", "preload", "live", "torchrun"
LIVE_PRELOAD = "live-preload"  # live recovery with its ranks forked (--preload torch)
TORCHRUN_FRESH = "torchrun-fresh"  # torchrun with a fresh store per round (torch's switch)
MODES = (RANKGUARD, PRELOAD, LIVE, TORCHRUN, TORCHRUN_FRESH)  # the default set
CHOICES = (*MODES, LIVE_PRELOAD)
TORCHRUNS = (TORCHRUN, TORCHRUN_FRESH)
# torch elastic's switch for a fresh rendezvous store per round: without it a restarted
# gloo group can read a dead peer's address from the store the rounds share
# ("connectFullMesh ... Connection refused"); rankguard run sets it itself
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

Line = tuple[float, str]
MATCH_S = 10.0  # an interruption and the injection behind it: at most this far apart


def schedule(seed: int, minutes: float, period: float) -> list[tuple[float, str]]:
    """Fault times (seconds after the launch) and kinds: about one every ``period``
    (+-20 %), none in the last half period, kinds in seeded shuffled rounds of all three."""
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    kinds: list[str] = []
    t = period
    while t < minutes * 60 - period / 2:
        if not kinds:
            kinds = rng.sample(KINDS, len(KINDS))
        out.append((round(t + rng.uniform(-0.2, 0.2) * period, 1), kinds.pop()))
        t += period
    return out


@dataclass
class Job:
    launcher: str
    workdir: Path
    run_id: str
    faults: list[tuple[float, str]]
    rc: int | None = None
    timed_out: bool = False
    start: float = 0.0
    end: float = 0.0
    lines: list[Line] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.workdir / "logs" / "heartbeat" / self.run_id


def build_cmd(job: Job, ckpt_every: int, max_restarts: int, async_save: bool = True) -> list[str]:
    demo = [
        str(JOB),
        "--steps",
        "100000000",
        "--log-every",
        "1",
        "--checkpoint-every",
        str(ckpt_every),
        "--checkpoint-dir",
        str(job.workdir / "ckpt"),
        "--fault-rank",
        str(FAULT_RANK),
        "--pg-timeout",
        str(PG_TIMEOUT_S),
        *(["--async-save"] if async_save else []),
    ]
    restarts = ["--max-restarts", str(max_restarts)]
    if job.launcher in TORCHRUNS:
        return [
            sys.executable,
            "-u",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(NPROC),
            *restarts,
            *demo,
        ]
    sets = [*SETS, f"fault_tolerance.num_in_job_restarts={max_restarts}"]
    cmd = [sys.executable, "-u", "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", str(NPROC), "--rdzv-id", job.run_id]
    cmd += ["--log-dir", str(job.workdir / "logs"), *restarts]
    if job.launcher in (PRELOAD, LIVE_PRELOAD):
        cmd += ["--preload", "torch"]
    if job.launcher in (LIVE, LIVE_PRELOAD):
        cmd += ["--standby-ranks", "1"]
        sets += LIVE_SETS
    for item in sets:
        cmd += ["--set", item]
    return cmd + demo


def _reader(stream: IO[str], sink: list[Line]) -> None:
    for line in stream:
        sink.append((time.time(), line.rstrip("\n")))


def _leftovers(marker: str) -> None:
    """SIGKILL what is left of this job (a hung rank): processes whose command line
    holds its own temp dir."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def run_job(
    job: Job, *, minutes: float, ckpt_every: int, async_save: bool, timeout_s: float
) -> None:
    """Launch ``job``, its faults and its end counted from the launch."""
    (job.workdir / "faults").mkdir(parents=True, exist_ok=True)
    # room for restarts that fail in their own start-up (torchrun's gloo on this kind of
    # machine: "connectFullMesh failed ... Connection refused"), the same for both
    cmd = build_cmd(job, ckpt_every, 3 * len(job.faults) + 2, async_save)
    job.start = time.time()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LOGLEVEL": "INFO",
        "GOODPUT_FAULTS": json.dumps([[job.start + t, kind] for t, kind in job.faults]),
        "GOODPUT_END": str(job.start + minutes * 60),
        "GOODPUT_DIR": str(job.workdir / "faults"),
        **(FRESH_STORE if job.launcher == TORCHRUN_FRESH else {}),
    }
    proc = subprocess.Popen(
        cmd,
        cwd=job.workdir,
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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        job.rc = proc.wait()
    job.end = time.time()
    reader.join(timeout=5)
    _leftovers(str(job.workdir))


def console_ledger(job: Job) -> Ledger:
    """The job's ledger from its stamped console lines (the same rule for both)."""
    starts = [t for t, line in job.lines if STARTING in line]
    bounds = [job.start, *starts[1:]]
    attempts = []
    for k, begin in enumerate(bounds):
        until = bounds[k + 1] if k + 1 < len(bounds) else job.end
        mine = [(t, line) for t, line in job.lines if begin <= t < until]
        steps = [(int(m.group(1)), t) for t, line in mine if (m := STEP_RE.search(line))]
        resumed = next((int(m.group(1)) for _, x in mine if (m := RESUMED_RE.search(x))), None)
        last = steps[-1][1] if steps else begin
        decided = next((t for t, line in mine if t >= last and DECIDED in line), None)
        phases, reentries = _reentries(mine, steps)
        attempts.append(
            Attempt(
                start=begin,
                end=until,
                steps=steps,
                # no "resumed" line: from scratch if it made steps (no checkpoint yet);
                # an attempt that failed in its start-up resumed nothing
                resumed_from=resumed if resumed is not None else (0 if k and steps else None),
                failed=k + 1 < len(bounds) or job.rc != 0,
                decision=decided,
                live=[
                    LiveRecovery(
                        fault=t,
                        resumed=next((s for _, s in steps if s > t), None),
                        cause="live recovery",
                    )
                    for t, line in mine
                    if LIVE_RECOVERY in line
                ],
                phases=phases,
                reentries=reentries,
            )
        )
    return build_ledger(attempts, end=job.end)


def _reentries(
    lines: Sequence[Line], steps: Sequence[tuple[int, float]]
) -> tuple[list[tuple[str, float, float]], list[tuple[float, int, int | None]]]:
    """In-process re-entries in the console (rankguard's in-process restart): each from
    rank 0's ``round N failed`` line (else the first rank's) to rank 0's ``[demo]
    in-process restart N+1: resuming at step S``, as rank 0's ``inprocess_restart`` phase
    with the iteration then and the one it resumed after (one that is a live recovery's
    is the ledger's to leave out)."""
    failed: dict[int, float] = {}  # round -> rank 0's failure, else the first one's
    phases, reentries = [], []
    for t, line in lines:
        if m := ROUND_FAILED_RE.search(line):
            n = int(m.group(2))
            if m.group(1) == "0" or n not in failed:
                failed[n] = t if m.group(1) == "0" else min(failed.get(n, t), t)
        elif (m := REENTERED_RE.search(line)) and int(m.group(1)) - 1 in failed:
            began = failed[int(m.group(1)) - 1]
            before = [it for it, at in steps if at <= began]
            phases.append(("inprocess_restart", began, t))
            if before:
                reentries.append((began, before[-1], int(m.group(2)) - 1))
    return phases, reentries


def injected(job: Job) -> list[str]:
    return [kind for _, kind in injections(job)]


def injections(job: Job) -> list[tuple[float, str]]:
    """Each fault the job's rank said it injected: its console time and kind."""
    return [
        (t, line.split("injecting ")[1].split(" (")[0]) for t, line in job.lines if INJECTED in line
    ]


def by_fault(
    ledger: Ledger, fired: Sequence[tuple[float, str]], within_s: float = MATCH_S
) -> list[tuple[str, Interruption]]:
    """Each interruption of ``ledger`` with the kind of the fault behind it: the injection
    nearest its last completed step (within ``within_s``; each injection taken once, the
    costlier interruptions first: a re-entry inside a restart's wait has no time of its
    own), or ``"-"`` (none: a restart for something else, a fault that came during
    another interruption's recovery)."""
    left = list(fired)
    kinds: dict[int, str] = {}
    order = sorted(range(len(ledger.interruptions)), key=lambda k: -ledger.interruptions[k].cost_s)
    for k in order:
        cut = ledger.interruptions[k]
        near = [
            (abs(t - cut.at), j) for j, (t, _) in enumerate(left) if abs(t - cut.at) <= within_s
        ]
        kinds[k] = left.pop(min(near)[1])[1] if near else "-"
    return [(kinds[k], cut) for k, cut in enumerate(ledger.interruptions)]


def _parts_text(parts: dict[Part, float]) -> str:
    return ", ".join(f"{p.value} {v:.1f}" for p, v in parts.items() if v >= 0.05) or "-"


def print_by_fault(name: str, ledger: Ledger, job: Job) -> None:
    """Each interruption's cost with the fault behind it, then the mean per kind."""
    rows = by_fault(ledger, injections(job))
    if not rows:
        return
    print(f"\n{name}: each interruption (seconds after the launch, fault, cost and its parts)")
    kinds: dict[str, list[Interruption]] = {}
    for kind, cut in rows:
        kinds.setdefault(kind, []).append(cut)
        print(
            f"  {cut.at - job.start:6.1f} s  {kind:9s}  {cut.kind:13s}  cost "
            f"{cut.cost_s:5.1f} s: {_parts_text(cut.parts)}"
        )
    for kind, cuts in sorted(kinds.items()):
        mean = {p: sum(c.parts.get(p, 0.0) for c in cuts) / len(cuts) for p in PARTS}
        total = sum(c.cost_s for c in cuts)
        print(
            f"  {kind}: {len(cuts)} interruption(s), {total:.1f} s in all, mean "
            f"{total / len(cuts):.1f} s ({_parts_text(mean)})",
            flush=True,
        )


def _row(name: str, ledger: Ledger, faults: str) -> list[str]:
    parts = [f"{ledger.parts[p]:.1f}" for p in PARTS if p is not Part.PRODUCTIVE]
    return [
        name,
        f"{ledger.wall_s:.1f}",
        ettr_text(ledger.ettr),
        f"{ledger.parts[Part.PRODUCTIVE]:.1f}",
        *parts,
        str(ledger.attempts),
        faults,
    ]


def print_table(rows: Sequence[Sequence[str]]) -> None:
    header = ["mode", "wall s", "ETTR", "productive"]
    header += [p.value for p in PARTS if p is not Part.PRODUCTIVE] + ["attempts", "faults"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)), flush=True)


def header(args: argparse.Namespace, faults: list[tuple[float, str]]) -> None:
    load = os.getloadavg()
    print(
        f"goodput bench: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        flush=True,
    )
    print(
        f"job: demo on {NPROC} CPU ranks, {args.minutes} min, checkpoint every "
        f"{args.checkpoint_every} steps ({'sync' if args.sync_save else 'async'}), pg "
        f"timeout {PG_TIMEOUT_S} s; faults on rank "
        f"{FAULT_RANK} (s after launch): "
        + (", ".join(f"{t:.0f} {kind}" for t, kind in faults) or "none"),
        flush=True,
    )
    print(f"rankguard's modes: --set {' '.join(SETS)}", flush=True)
    print(
        f"live: --standby-ranks 1 --set {' '.join(LIVE_SETS)}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="each job's wall clock")
    p.add_argument("--period", type=float, default=60.0, help="seconds between faults")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument(
        "--sync-save", action="store_true", help="write each checkpoint in the loop (not async)"
    )
    p.add_argument("--keep", action="store_true", help="keep the jobs' directories")
    p.add_argument(
        "--modes",
        nargs="+",
        choices=CHOICES,
        default=None,
        help="jobs, one after the other in this order (default: all but live-preload; "
        "--smoke: preload)",
    )
    p.add_argument("--smoke", action="store_true", help="one exception, a short job")
    args = p.parse_args(argv)
    if args.modes is None:
        args.modes = [PRELOAD] if args.smoke else list(MODES)
    if args.smoke:  # the fault at the first step, the end at the first check after it
        args.minutes, faults = 0.0, [(0.0, "exception")]
    else:
        faults = schedule(args.seed, args.minutes, args.period)
    header(args, faults)
    root = Path(tempfile.mkdtemp(prefix="rg-goodput-"))
    rows, ok = [], True
    for launcher in args.modes:
        job = Job(launcher, root / launcher, f"bench-goodput-{launcher}-{os.getpid()}", faults)
        job.workdir.mkdir(parents=True)
        (job.workdir / "console.txt").touch()
        timeout = 90 if args.smoke else args.minutes * 60 + 120 + 60 * len(faults)
        run_job(
            job,
            minutes=args.minutes,
            ckpt_every=args.checkpoint_every,
            async_save=not args.sync_save,
            timeout_s=timeout,
        )
        if args.keep:
            text = "".join(f"{t:.3f} {line}\n" for t, line in job.lines)
            (job.workdir / "console.txt").write_text(text)
        fired = injected(job)
        ledger = console_ledger(job)
        said = f"{len(fired)}/{len(faults)}" + (" TIMED OUT" if job.timed_out else "")
        if job.rc != 0:
            said += f" exit {job.rc}"
        if launcher not in TORCHRUNS:  # torchrun's failures are figures, not the bench's
            ok = ok and job.rc == 0 and not job.timed_out and len(fired) == len(faults)
        rows.append(_row(launcher, ledger, said))
        own = read_ledger(job.run_dir) if launcher not in TORCHRUNS else None
        if own is not None:
            rows.append(_row("(its run dir)", own, ""))
        print_by_fault(launcher + (" (its run dir)" if own else ""), own or ledger, job)
        print(
            f"{launcher}: exit {job.rc}, {ledger.attempts} attempt(s), faults fired: "
            f"{', '.join(fired) or 'none'}; ETTR {ettr_text(ledger.ettr)}",
            flush=True,
        )
    print()
    print_table(rows)
    print(
        "\nseconds per part of the goodput ledger (they sum to the wall time); the "
        "console's ledger for every mode, rankguard's own run directory beside it"
    )
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept: {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
