"""Straggler detection on a real job: how fast, how sensitive, how noisy, how cheap.

What, part 1 (detection): runs the demo under ``rankguard run --standalone
--nproc-per-node 4`` (4 CPU ranks, gloo) with straggler detection on, reports every
``--report-interval`` seconds (2 s; heartbeats published and scanned every 0.5 s),
``--step-sleep 0`` (the step is all compute and all-reduce) and ``--fault slow
--fault-rank 2 --slowdown F``: rank 2 spins on the CPU for (F - 1) x its own forward and
backward, inside ``with rg.compute()``. For F in 1.1, 1.3, 1.5, 2.0 at the default
threshold 0.7, then F = 1.1 with ``gpu_relative_perf_threshold=0.95``. Per run:

- detection time = the straggler finding's ``detected_wall_time`` (findings.jsonl) minus
  the wall time of the first heartbeat record, of any rank, that shows a completed step
  (``progress_seq >= 1``; the headline, since startup - importing torch on 4 processes
  sharing 2 cores - takes longer than the detection itself), and minus the launch (the
  wall time just before this script started ``rankguard run``);
- which report flagged it, and rank 2's relative score in every report (parsed from the
  detector's log lines, ``report N: ... worst: rank R rel X ind Y, ...``), plus the
  lowest relative score any *other* rank got (the noise floor of the measurement).

A relative score is the best rank's compute time over this rank's: a 1.1x rank scores
~0.91 and a 1.3x rank ~0.77, both above the default 0.7, so they are not expected to be
flagged at the default threshold.

What, part 2 (false positives): ``--clean-runs`` runs (default 3) without a fault, same
settings; counts straggler findings and reports that name a straggler.

What, part 3 (overhead, tight loops, median of 21 repeats x 200k calls, GC off; wall
time, or the thread's CPU time with ``--cpu-time``):
``ComputeProbe.step_end`` vs the plain ``ProgressTracker.step_end`` it wraps,
``Session.step_end`` with and without the probe, and one ``with session.compute():
pass`` pair (vs ``NullSession``'s no-op context).

Goals: a 1.5x rank flagged within two report intervals of the first step; no false
positives in clean runs; straggler detection adds well under 1 us per step.

Run: ``python bench/stragglers.py`` (2.5-4 minutes on 2 CPU cores: 8 demo runs of
~20-25 s each, of which ~8-10 s of training at ~60 ms a step; ``--steps`` to change).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.identity import RankIdentity
from rankguard.rank.timeline import ProgressTracker
from rankguard.session import NullSession, Session
from rankguard.straggler.probe import SECTION_CLOCK_BUDGET_NS, ComputeProbe

NPROC = 4
FAULT_RANK = 2
PUBLISH_S = 0.5
SCAN_S = 0.5
DEFAULT_THRESHOLD = 0.7
GOAL_OVERHEAD_NS = 1000.0

REPORT_RE = re.compile(r"report (\d+): (\d+) ranks, best compute ([\d.]+) ms, stragglers \[(.*)\]")
SCORE_RE = re.compile(r"rank (\d+) rel ([\d.]+|None) ind ([\d.]+|None)")


# ---- part 1 and 2: demo runs -----------------------------------------------------------


@dataclass
class Report:
    number: int
    stragglers: list[int]
    relative: dict[int, float | None]  # rank -> relative score (ranks in the worst list)


@dataclass
class DemoRun:
    label: str
    slowdown: float | None  # None: clean run
    threshold: float
    rc: int | None = None
    wall_s: float = 0.0
    launch_t: float = 0.0
    first_step_t: float | None = None
    last_step_t: float | None = None
    steps: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    problem: str = ""

    def finding_for(self, rank: int) -> dict[str, Any] | None:
        return next((f for f in self.findings if f.get("rank") == rank), None)

    def detected_t(self, rank: int) -> float | None:
        f = self.finding_for(rank)
        if f is None:
            return None
        return datetime.fromisoformat(f["detected_wall_time"]).timestamp()

    def from_first_step(self, rank: int) -> float | None:
        t = self.detected_t(rank)
        return None if t is None or self.first_step_t is None else t - self.first_step_t

    def from_launch(self, rank: int) -> float | None:
        t = self.detected_t(rank)
        return None if t is None else t - self.launch_t

    def first_flagging_report(self, rank: int) -> int | None:
        return next((r.number for r in self.reports if rank in r.stragglers), None)

    def scores(self, rank: int) -> list[float | None]:
        return [r.relative.get(rank) for r in self.reports]

    def min_other_relative(self, rank: int | None) -> float | None:
        values = [
            v for r in self.reports for k, v in r.relative.items() if k != rank and v is not None
        ]
        return min(values) if values else None

    @property
    def training_s(self) -> float | None:
        if self.first_step_t is None or self.last_step_t is None:
            return None
        return self.last_step_t - self.first_step_t


def demo_command(
    args: argparse.Namespace, log_dir: Path, slowdown: float | None, threshold: float
) -> list[str]:
    cmd = [
        sys.executable,
        "-u",
        "-m",
        "rankguard.cli.main",
        "run",
        "--standalone",
        "--nproc-per-node",
        str(NPROC),
        "--log-dir",
        str(log_dir),
        "--set",
        "heartbeat.enabled=true",
        "--set",
        f"heartbeat.publish_interval_s={PUBLISH_S}",
        "--set",
        f"heartbeat.scan_interval_s={SCAN_S}",
        "--set",
        "straggler.enabled=true",
        "--set",
        f"straggler.report_time_interval={args.report_interval}",
    ]
    if threshold != DEFAULT_THRESHOLD:
        cmd += ["--set", f"straggler.gpu_relative_perf_threshold={threshold}"]
    cmd += ["-m", "rankguard.demo.train", "--steps", str(args.steps)]
    cmd += ["--step-sleep", f"{args.step_sleep:g}"]
    if slowdown is not None:
        cmd += ["--fault", "slow", "--fault-rank", str(FAULT_RANK), "--slowdown", str(slowdown)]
    return cmd


def run_demo(
    args: argparse.Namespace, label: str, slowdown: float | None, threshold: float
) -> DemoRun:
    run = DemoRun(label, slowdown, threshold)
    with tempfile.TemporaryDirectory(prefix="rankguard-stragglers-") as tmp:
        log_dir = Path(tmp) / "logs"
        cmd = demo_command(args, log_dir, slowdown, threshold)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        run.launch_t = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            run.problem = f"did not finish within {args.run_timeout} s (killed)"
            os.killpg(proc.pid, signal.SIGKILL)  # the session this script started
            out, err = proc.communicate()
        run.rc = proc.returncode
        run.wall_s = time.time() - run.launch_t
        run.reports = parse_reports(err) or parse_reports(out)
        analyse(run, log_dir)
        if run.rc != 0 and not run.problem:
            run.problem = f"exit code {run.rc}: " + " | ".join(err.strip().splitlines()[-3:])
    return run


def parse_reports(text: str) -> list[Report]:
    """The detector's log: ``report N: ... stragglers [..]`` then ``worst: ...``."""
    reports: list[Report] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = REPORT_RE.search(line)
        if not m:
            continue
        stragglers = [int(x) for x in m.group(4).split(",") if x.strip()]
        relative: dict[int, float | None] = {}
        for follow in lines[i + 1 : i + 3]:
            if "worst:" in follow or "best:" in follow:
                for rank, rel, _ in SCORE_RE.findall(follow):
                    relative[int(rank)] = None if rel == "None" else float(rel)
        reports.append(Report(int(m.group(1)), stragglers, relative))
    return reports


def analyse(run: DemoRun, log_dir: Path) -> None:
    run_dirs = sorted((log_dir / "heartbeat").glob("*/"))
    if not run_dirs:
        run.problem = run.problem or "no heartbeat run directory"
        return
    run_dir = run_dirs[-1]
    findings = run_dir / "findings.jsonl"
    if findings.exists():
        for line in findings.read_text(encoding="utf-8").splitlines():
            f = json.loads(line)
            if f.get("finding_type") == "straggler_detected":
                run.findings.append(f)
    stepped: list[float] = []
    for path in run_dir.glob("rank_*.heartbeat.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if int(rec.get("progress_seq") or 0) >= 1 and rec.get("phase") == "train":
                stepped.append(rec["wall_time_ns"] / 1e9)
                run.steps = max(run.steps, int(rec["progress_seq"]))
    if stepped:
        run.first_step_t, run.last_step_t = min(stepped), max(stepped)


def _f(x: float | None, fmt: str = "6.2f") -> str:
    return "-".rjust(len(format(0.0, fmt))) if x is None else format(x, fmt)


def _scores(values: list[float | None]) -> str:
    return " ".join("-" if v is None else f"{v:.2f}" for v in values)


def part_detection(args: argparse.Namespace) -> tuple[list[DemoRun], list[DemoRun]]:
    cases = [(f, DEFAULT_THRESHOLD) for f in args.slowdowns]
    if args.strict_threshold:
        cases.append((1.1, args.strict_threshold))
    print(
        f"== detection: {NPROC} CPU ranks, --steps {args.steps}, rank {FAULT_RANK} slowed, report "
        f"every {args.report_interval:g} s (publish {PUBLISH_S:g} s, scan {SCAN_S:g} s) ==\n"
        "detect = detected_wall_time - first heartbeat showing a step (any rank); "
        "launch = detected_wall_time - launch of `rankguard run`\n"
    )
    header = (
        f"{'slowdown':>8} {'thresh':>6} {'rc':>3} {'wall s':>6} {'train s':>7} "
        f"{'reports':>7} {'flagged':>7} {'detect':>6} {'launch':>6} {'report':>6} {'others':>6} "
        f"| rank {FAULT_RANK} relative score in each report"
    )
    print(header)
    print("-" * len(header))
    runs = []
    for slowdown, threshold in cases:
        run = run_demo(args, f"x{slowdown:g}", slowdown, threshold)
        runs.append(run)
        others = sorted({f["rank"] for f in run.findings if f.get("rank") != FAULT_RANK})
        flagged = "yes" if run.finding_for(FAULT_RANK) else "no"
        print(
            f"{slowdown:>8g} {threshold:>6g} {run.rc!s:>3} {run.wall_s:6.1f} "
            f"{_f(run.training_s, '7.1f')} {len(run.reports):>7} {flagged:>7} "
            f"{_f(run.from_first_step(FAULT_RANK))} "
            f"{_f(run.from_launch(FAULT_RANK))} "
            f"{run.first_flagging_report(FAULT_RANK) or '-'!s:>6} "
            f"{_f(run.min_other_relative(FAULT_RANK), '6.2f')} "
            f"| {_scores(run.scores(FAULT_RANK))}"
            + (f"  ALSO FLAGGED: ranks {others}" if others else "")
            + (f"  PROBLEM: {run.problem}" if run.problem else ""),
            flush=True,
        )
    print(
        f"(others = lowest relative score of any rank other than rank {FAULT_RANK}, "
        "over all reports)\n"
    )
    clean = []
    print(f"== false positives: {args.clean_runs} clean run(s), no fault, threshold 0.7 ==")
    header = (
        f"{'run':>3} {'rc':>3} {'wall s':>6} {'train s':>7} {'reports':>7} "
        f"{'findings':>8} {'flagging reports':>16} {'lowest relative':>15}"
    )
    print(header)
    print("-" * len(header))
    for k in range(args.clean_runs):
        run = run_demo(args, f"clean{k + 1}", None, DEFAULT_THRESHOLD)
        clean.append(run)
        flagging = sum(1 for r in run.reports if r.stragglers)
        print(
            f"{k + 1:>3} {run.rc!s:>3} {run.wall_s:6.1f} {_f(run.training_s, '7.1f')} "
            f"{len(run.reports):>7} {len(run.findings):>8} {flagging:>16} "
            f"{_f(run.min_other_relative(None), '15.2f')}"
            + (f"  PROBLEM: {run.problem}" if run.problem else ""),
            flush=True,
        )
    print()
    return runs, clean


# ---- part 3: overhead ------------------------------------------------------------------

Loop = Callable[[int], int]
# What the loops are timed by: wall (default), or the thread's CPU time (--cpu-time: a
# core taken by another process then costs nothing, only the loop's own work counts)
_clock = time.perf_counter_ns


def _loop_arg(fn: Callable[[int], object]) -> Loop:
    def run(n: int) -> int:
        t0 = _clock()
        for i in range(n):
            fn(i)
        return _clock() - t0

    return run


def _loop_with(ctx: Any) -> Loop:
    def run(n: int) -> int:
        t0 = _clock()
        for _ in range(n):
            with ctx:
                pass
        return _clock() - t0

    return run


def _loop_step(session: Session) -> Loop:
    """One training step as a script that marks its compute writes it."""

    def run(n: int) -> int:
        compute, step_end = session.compute(), session.step_end
        t0 = _clock()
        for i in range(n):
            with compute:
                pass
            step_end(i)
        return _clock() - t0

    return run


def _empty_arg(i: int) -> None:
    pass


def measure(loop: Loop, calls: int, repeats: int) -> float:
    """Median ns per call over ``repeats`` runs of ``calls`` calls (GC off while timing)."""
    loop(min(calls, 10_000))
    per_call: list[float] = []
    gc.disable()
    try:
        for _ in range(repeats):
            per_call.append(loop(calls) / calls)
    finally:
        gc.enable()
    return statistics.median(per_call)


def _probe(tracker: ProgressTracker) -> ComputeProbe:
    """The probe as a job gets it (``rankguard.bootstrap``): CPU sections' clock reads
    within the budget."""
    return ComputeProbe(tracker.step_end, clock_budget_ns=SECTION_CLOCK_BUDGET_NS)


def _session(tmp: Path, probe: bool) -> Session:
    identity = RankIdentity(
        run_id="bench",
        rank=0,
        local_rank=0,
        world_size=1,
        node_rank=0,
        hostname="bench",
        pid=os.getpid(),
        gpu=None,
    )
    tracker = ProgressTracker(mode="cpu")
    return Session(
        identity,
        tmp,
        HeartbeatConfig(),
        tracker=tracker,
        publish=False,
        probe=_probe(tracker) if probe else None,
    )


def part_overhead(args: argparse.Namespace) -> dict[str, float]:
    calls, repeats = args.calls, args.repeats
    clock = "thread CPU time" if _clock is time.thread_time_ns else "wall time"
    print(f"== overhead: median of {repeats} repeats x {calls:,} calls, GC off, {clock} ==")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rankguard-stragglers-hot-") as tmp:
        plain = _session(Path(tmp), probe=False)
        probed = _session(Path(tmp), probe=True)
        probed_sections = _session(Path(tmp), probe=True)
        with probed_sections.compute():  # from now on this probe counts sections only
            pass
        sectioned = _probe(ProgressTracker(mode="cpu"))
        sectioned.section_enter()
        sectioned.section_exit()  # from now on the probe counts sections only
        cases: list[tuple[str, Loop]] = [
            ("empty function call f(i)  [floor]", _loop_arg(_empty_arg)),
            ("time.thread_time_ns()  [reference]", _loop_arg(lambda i: time.thread_time_ns())),
            ("time.monotonic_ns()  [reference]", _loop_arg(lambda i: time.monotonic_ns())),
            ("ProgressTracker(cpu).step_end(i)", _loop_arg(ProgressTracker(mode="cpu").step_end)),
            (
                "ComputeProbe.step_end(i)  (step mode)",
                _loop_arg(_probe(ProgressTracker(mode="cpu")).step_end),
            ),
            ("ComputeProbe.step_end(i)  (section mode)", _loop_arg(sectioned.step_end)),
            (
                "ComputeProbe(every=10).step_end(i)",
                _loop_arg(ComputeProbe(ProgressTracker(mode="cpu").step_end, every=10).step_end),
            ),
            ("Session.step_end(i)  (no probe)", _loop_arg(plain.step_end)),
            ("Session.step_end(i)  (with probe)", _loop_arg(probed.step_end)),
            ("with NullSession().compute(): pass", _loop_with(NullSession().compute())),
            ("with session.compute(): pass  (probe)", _loop_with(probed.compute())),
            ("step: compute() + step_end  (no probe)", _loop_step(plain)),
            ("step: compute() + step_end  (probe)", _loop_step(probed_sections)),
        ]
        floor = 0.0
        print(f"{'call':<44} {'ns/call':>8} {'minus floor':>12}")
        print("-" * 66)
        for name, loop in cases:
            ns = measure(loop, calls, repeats)
            floor = ns if "[floor]" in name else floor
            results[name] = ns
            print(f"{name:<44} {ns:8.1f} {ns - floor:12.1f}", flush=True)
        plain.close()
        probed.close()
        probed_sections.close()
    probe_delta = (
        results["ComputeProbe.step_end(i)  (step mode)"]
        - results["ProgressTracker(cpu).step_end(i)"]
    )
    session_delta = (
        results["Session.step_end(i)  (with probe)"] - results["Session.step_end(i)  (no probe)"]
    )
    section_delta = (
        results["step: compute() + step_end  (probe)"]
        - results["step: compute() + step_end  (no probe)"]
    )
    results["probe_delta"] = probe_delta
    results["session_delta"] = session_delta
    results["section_delta"] = section_delta
    results["per_step"] = max(session_delta, section_delta)
    print(
        f"per step, the probe adds {session_delta:.0f} ns to a script that calls only "
        f"step_end (step mode; {probe_delta:.0f} ns on the tracker's step_end) and "
        f"{section_delta:.0f} ns to one that also marks `with rg.compute():` (section "
        "mode; against the same loop with detection off)\n"
    )
    return results


# ---- verdicts --------------------------------------------------------------------------


def verdicts(
    args: argparse.Namespace,
    runs: list[DemoRun],
    clean: list[DemoRun],
    overhead: dict[str, float],
) -> None:
    bound = 2 * args.report_interval
    print("== verdicts ==")
    for run in runs:
        f = run.finding_for(FAULT_RANK)
        scores = [s for s in run.scores(FAULT_RANK) if s is not None]
        med = f"{statistics.median(scores):.2f}" if scores else "-"
        if f is None:
            print(
                f"x{run.slowdown:g} @ {run.threshold:g}: rank {FAULT_RANK} NOT flagged "
                f"(median relative score {med} over {len(scores)} report(s))"
            )
        else:
            print(
                f"x{run.slowdown:g} @ {run.threshold:g}: rank {FAULT_RANK} flagged "
                f"{_f(run.from_first_step(FAULT_RANK), '.2f')} s after the first step "
                f"(report {run.first_flagging_report(FAULT_RANK)}, score "
                f"{f.get('relative_score')}; median {med})"
            )
    main = next((r for r in runs if r.slowdown == 1.5 and r.threshold == DEFAULT_THRESHOLD), None)
    if main is not None:
        t = main.from_first_step(FAULT_RANK)
        ok = t is not None and t <= bound
        print(
            f"goal: a 1.5x rank flagged within two report intervals ({bound:g} s) of the first "
            f"step -> {'MEETS' if ok else 'MISSES'} ({_f(t, '.2f')} s)"
        )
    if clean:  # no verdict on runs that were not made (--skip-runs, --smoke)
        fp = sum(len(r.findings) for r in clean)
        reports = sum(len(r.reports) for r in clean)
        lowest = [x for r in clean if (x := r.min_other_relative(None)) is not None]
        print(
            f"goal: no false positives -> {'MEETS' if fp == 0 else 'MISSES'} ({fp} straggler "
            f"finding(s) in {len(clean)} clean run(s), {reports} reports; lowest relative "
            f"score {_f(min(lowest) if lowest else None, '.2f')})"
        )
    per_step = overhead["per_step"]
    print(
        f"goal: overhead per step < {GOAL_OVERHEAD_NS:.0f} ns -> "
        f"{'MEETS' if per_step < GOAL_OVERHEAD_NS else 'MISSES'} (step mode "
        f"+{overhead['session_delta']:.0f} ns, section mode +{overhead['section_delta']:.0f} ns)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="demo steps per run (~8 s here)")
    p.add_argument("--slowdowns", type=float, nargs="+", default=[1.1, 1.3, 1.5, 2.0])
    p.add_argument("--strict-threshold", type=float, default=0.95)
    p.add_argument("--clean-runs", type=int, default=3)
    p.add_argument("--report-interval", type=float, default=2.0)
    p.add_argument("--run-timeout", type=float, default=120.0, help="seconds per demo run")
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--skip-runs", action="store_true", help="overhead only")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the overhead loops by the thread's CPU time, not wall (a loaded machine)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one 2x run on 2 ranks (rank 1 slowed), 30 steps of which 0.1 s asleep, a "
        "report every second, tiny loops (seconds); exit 1 if the run fails or makes no report",
    )
    args = p.parse_args(argv)
    if args.cpu_time:
        global _clock
        _clock = time.thread_time_ns
    args.step_sleep = 0.0  # the step is all compute and all-reduce
    if args.smoke:
        global NPROC, FAULT_RANK
        NPROC, FAULT_RANK = 2, 1
        args.steps, args.slowdowns, args.strict_threshold, args.clean_runs = 30, [2.0], 0.0, 0
        args.report_interval, args.calls, args.repeats = 1.0, 2_000, 3
        args.step_sleep = 0.1  # wall for two reports, not CPU: a sleep is not compute
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPU(s), {platform.machine()}; "
        f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
    )
    t0 = time.monotonic()
    overhead = part_overhead(args)
    runs: list[DemoRun] = []
    clean: list[DemoRun] = []
    if not args.skip_runs:
        runs, clean = part_detection(args)
    verdicts(args, runs, clean, overhead)
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    if args.smoke and any(r.rc != 0 or r.problem or not r.reports for r in runs):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
