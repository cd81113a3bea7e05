"""End-to-end detection latency of the demo's faults, from injection to finding.

What: runs ``rankguard demo --fault stall`` and ``--fault stop`` (the real launcher, two
CPU ranks, the demo's short timeouts from ``DEMO_OVERRIDES``) ``--repeats`` times each
and measures the seconds from the fault's injection to the monitor's finding.

How: the demo rank prints ``[demo rank R] injecting fault ...`` just before it stalls or
SIGSTOPs itself, and the launcher prints ``[rankguard] FINDING <type>: ...`` when the
monitor reports it. Both streams are read by reader threads that stamp every line with
``time.time()`` as it arrives, so:

- latency (lines) = arrival of the FINDING line - arrival of the injection line;
- latency (file)  = ``detected_wall_time`` in findings.jsonl - arrival of the injection
  line (same host, same wall clock);
- from last beat  = ``detected_wall_time`` - the rank's last progress (stall: its
  heartbeat records' ``wall_time_ns - since_progress_s``) or last heartbeat before the
  fault (stop), read from its heartbeat file.

For ``stall`` the last progress is the end of the step before the injection point (the
rank stalls after the optimizer step of step S, before step S ends), so "from last
beat" is a little longer than the latency from injection; the latency from the
injection line is the headline figure.

Goal: latency <= timeout + scan_interval_s + publish_interval_s (a record can be up to
one publish interval old when the fault starts, and the monitor notices up to one scan
interval after the timeout expires). Timeouts: stall -> progress_timeout_s, stop ->
process_timeout_s.

Run: ``python bench/detection_latency.py [--repeats 3]`` (about 20 s per demo run).
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
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from rankguard.demo.cli import DEMO_OVERRIDES

FAULTS = {
    # fault: (expected finding type, timeout key in DEMO_OVERRIDES)
    "stall": ("gpu_progress_timeout", "progress_timeout_s"),
    "stop": ("rank_process_heartbeat_timeout", "process_timeout_s"),
}
INJECT_MARK = "injecting fault"
FINDING_MARK = "[rankguard] FINDING "


def demo_settings() -> dict[str, float]:
    """The heartbeat settings the demo applies (``heartbeat.<key>=<value>``)."""
    out: dict[str, float] = {}
    for item in DEMO_OVERRIDES:
        key, _, value = item.partition("=")
        if key.startswith("heartbeat.") and value.replace(".", "", 1).isdigit():
            out[key.removeprefix("heartbeat.")] = float(value)
    return out


@dataclass
class Run:
    fault: str
    rc: int | None = None
    duration_s: float = 0.0
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (time, stream, line)
    inject_t: float | None = None
    finding_line_t: float | None = None
    finding_line: str = ""
    detected_t: float | None = None
    last_beat_t: float | None = None
    finding: dict[str, Any] | None = None
    problem: str = ""

    @property
    def latency_lines(self) -> float | None:
        if self.inject_t is None or self.finding_line_t is None:
            return None
        return self.finding_line_t - self.inject_t

    @property
    def latency_file(self) -> float | None:
        if self.inject_t is None or self.detected_t is None:
            return None
        return self.detected_t - self.inject_t

    @property
    def from_last_beat(self) -> float | None:
        if self.last_beat_t is None or self.detected_t is None:
            return None
        return self.detected_t - self.last_beat_t


def _reader(
    stream: IO[str], name: str, sink: list[tuple[float, str, str]], lock: threading.Lock
) -> None:
    for line in stream:
        t = time.time()
        with lock:
            sink.append((t, name, line.rstrip("\n")))


def run_demo(fault: str, args: argparse.Namespace) -> Run:
    run = Run(fault)
    with tempfile.TemporaryDirectory(prefix=f"rankguard-latency-{fault}-") as tmp:
        cmd = [
            sys.executable,
            "-u",
            "-m",
            "rankguard.cli.main",
            "demo",
            "--fault",
            fault,
            "--fault-rank",
            str(args.fault_rank),
            "--fault-step",
            str(args.fault_step),
            "--fault-duration",
            str(args.fault_duration),
            "--steps",
            str(args.steps),
            "--log-dir",
            str(Path(tmp) / "logs"),
        ]
        if args.nproc is not None:  # --smoke: 1 rank (the demo's default is 2)
            cmd += ["--nproc-per-node", str(args.nproc)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        t0 = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        lock = threading.Lock()
        readers = [
            threading.Thread(target=_reader, args=(proc.stdout, "out", run.lines, lock)),
            threading.Thread(target=_reader, args=(proc.stderr, "err", run.lines, lock)),
        ]
        for r in readers:
            r.start()
        try:
            run.rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            run.problem = f"demo did not finish within {args.run_timeout} s (killed)"
            os.killpg(proc.pid, signal.SIGKILL)  # the session this script started
            proc.wait()
        for r in readers:
            r.join(timeout=10)
        run.duration_s = time.time() - t0
        _analyse(run, Path(tmp) / "logs", args.fault_rank)
    return run


def _analyse(run: Run, log_dir: Path, fault_rank: int) -> None:
    expected_type, _ = FAULTS[run.fault]
    for t, _, line in sorted(run.lines):
        if run.inject_t is None and INJECT_MARK in line and f"rank {fault_rank}]" in line:
            run.inject_t = t
        if run.finding_line_t is None and FINDING_MARK in line and expected_type in line:
            run.finding_line_t, run.finding_line = t, line
    run_dirs = sorted((log_dir / "heartbeat").glob("*/findings.jsonl"))
    if not run_dirs:
        run.problem = run.problem or "no findings.jsonl"
        return
    findings_file = run_dirs[-1]
    for line in findings_file.read_text(encoding="utf-8").splitlines():
        f = json.loads(line)
        if f.get("finding_type") == expected_type and f.get("rank") == fault_rank:
            run.finding = f
            run.detected_t = datetime.fromisoformat(f["detected_wall_time"]).timestamp()
            break
    if run.finding is None:
        run.problem = run.problem or f"no {expected_type} finding for rank {fault_rank}"
        return
    hb_files = list(findings_file.parent.glob(f"rank_{fault_rank}_pid_*.heartbeat.jsonl"))
    records = [
        json.loads(x) for p in hb_files for x in p.read_text(encoding="utf-8").splitlines() if x
    ]
    if run.inject_t is None or not records:
        return
    if run.fault == "stall":
        # The stalled progress_seq is the one of the finding's iteration; the wall time
        # of that progress is wall_time - since_progress_s of any record at that seq.
        stalled = [
            r
            for r in records
            if r.get("iteration") == run.finding.get("iteration") and r.get("progress_seq")
        ]
        if stalled:
            rec = stalled[-1]
            run.last_beat_t = rec["wall_time_ns"] / 1e9 - float(rec["since_progress_s"])
    else:
        before = [
            r["wall_time_ns"] / 1e9 for r in records if r["wall_time_ns"] / 1e9 <= run.inject_t
        ]
        if before:
            run.last_beat_t = max(before)


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--faults", nargs="+", choices=sorted(FAULTS), default=["stall", "stop"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-duration", type=float, default=8.0)
    p.add_argument("--run-timeout", type=float, default=180.0, help="seconds per demo run")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one stall run of 1 rank, 4 steps, a 6 s fault at step 2 (seconds)",
    )
    args = p.parse_args(argv)
    args.nproc = None  # the demo's own (2 ranks)
    if args.smoke:
        args.repeats, args.faults, args.steps, args.fault_step = 1, ["stall"], 4, 2
        args.fault_duration, args.run_timeout = 6.0, 90.0
        args.nproc, args.fault_rank = 1, 0

    settings = demo_settings()
    scan, publish = settings["scan_interval_s"], settings["publish_interval_s"]
    print(f"demo settings: {settings}")
    print(
        f"{args.repeats} run(s) per fault, --steps {args.steps} --fault-step "
        f"{args.fault_step} --fault-rank {args.fault_rank} --fault-duration "
        f"{args.fault_duration}\n"
    )
    print(
        f"{'fault':<6} {'run':>3} {'rc':>3} {'wall s':>6}  {'lines':>6} {'file':>6} "
        f"{'last beat':>9}  finding"
    )
    summary: list[str] = []
    ok = True
    for fault in args.faults:
        expected_type, timeout_key = FAULTS[fault]
        timeout = settings[timeout_key]
        bound = timeout + scan + publish
        runs = []
        for k in range(args.repeats):
            run = run_demo(fault, args)
            runs.append(run)
            what = run.problem or (run.finding or {}).get("message", "")
            print(
                f"{fault:<6} {k + 1:>3} {run.rc!s:>3} {run.duration_s:6.1f}  "
                f"{_fmt(run.latency_lines)} {_fmt(run.latency_file)} "
                f"{_fmt(run.from_last_beat):>9}  {what}",
                flush=True,
            )
        lat = [r.latency_file for r in runs if r.latency_file is not None]
        lat_lines = [r.latency_lines for r in runs if r.latency_lines is not None]
        failed = [r for r in runs if r.latency_file is None or r.rc != 0]
        if not lat:
            summary.append(f"{fault}: no latency measured ({len(failed)} failed run(s))")
            ok = False
            continue
        med = statistics.median(lat)
        within = sum(1 for x in lat if x <= bound)
        verdict = "MEETS" if within == len(runs) and not failed else "MISSES"
        ok = ok and verdict == "MEETS"
        summary.append(
            f"{fault:<5} -> {expected_type}: timeout {timeout:g} s ({timeout_key}); "
            f"latency median {med:.2f} s (min {min(lat):.2f}, max {max(lat):.2f}; "
            f"printed-line median {statistics.median(lat_lines):.2f}); "
            f"median - timeout {med - timeout:+.2f} s; bound timeout + scan + publish = "
            f"{bound:g} s -> {verdict} ({within}/{len(runs)} runs within, "
            f"{len(failed)} failed run(s))"
        )
    print()
    for line in summary:
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
