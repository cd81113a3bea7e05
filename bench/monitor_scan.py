"""Cost of one job-monitor scan (``JobMonitor.scan_once``) at 1024 and 8192 ranks.

What: N heartbeat files ``rank_<r>_pid_<p>.heartbeat.jsonl`` with realistic records (the
schema of docs/heartbeat.md, as the publisher writes them) in a temporary directory, and
a ``JobMonitor(cfg, dir, run_id, expected_world_size=N, check_pids=False)`` scanning
them. Three cases, each the median of several scans, in wall and CPU seconds
(``time.perf_counter`` / ``time.process_time``):

- first scan: every file is new and read from offset 0;
- steady state: every file got one new heartbeat line since the last scan (appended
  between scans, untimed), the normal situation when publish_interval_s ~ scan_interval_s;
- idle: nothing changed (one ``stat`` per file, then rules and status as usual).

A breakdown of a steady-state scan then times its phases separately (calling the
monitor's internal steps in the order ``_scan`` does): reading the files, the rules'
``evaluate``, building the status dict, serialising it to JSON and writing it atomically.

Why: node 0's monitor scans every scan_interval_s (1 s by default) for the whole job. Its
cost must grow linearly with the number of ranks (8192/1024 ~ 8x) and stay well under
1 s per scan at 8192 ranks, or the monitor falls behind and detection slows.

Timeouts are set to an hour so no finding fires while the benchmark runs (a finding
would add work that a healthy job does not do). Run: ``python bench/monitor_scan.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.layout import STATUS_FILE, heartbeat_file_name
from rankguard.schema.records import SCHEMA_VERSION
from rankguard.util.fs import atomic_write_text, dumps_line

RUN_ID = "20261129-120000-bench1"
RANKS_PER_NODE = 8
GOAL_S = 1.0  # one scan at 8192 ranks well under this
WELL_UNDER_S = 0.5  # what "well under" is taken to mean here
HOUR = 3600.0


def _config() -> HeartbeatConfig:
    return HeartbeatConfig(
        enabled=True,
        publish_interval_s=1.0,
        scan_interval_s=1.0,
        initial_process_timeout_s=HOUR,
        process_timeout_s=HOUR,
        initial_progress_timeout_s=HOUR,
        progress_timeout_s=HOUR,
        checkpoint_timeout_s=HOUR,
        eval_timeout_s=HOUR,
    )


class FakeRank:
    """Writes the records one rank's publisher would write (GPU rank, 8 per node)."""

    __slots__ = ("base", "path", "seq", "step", "t0_mono", "t0_wall")

    def __init__(self, run_dir: Path, rank: int, world: int) -> None:
        pid = 100_000 + rank
        local = rank % RANKS_PER_NODE
        self.path = run_dir / heartbeat_file_name(rank, pid)
        self.base = {
            "schema_version": SCHEMA_VERSION,
            "run_id": RUN_ID,
            "hostname": f"gpu-node-{rank // RANKS_PER_NODE:04d}",
            "node_rank": rank // RANKS_PER_NODE,
            "rank": rank,
            "local_rank": local,
            "world_size": world,
            "pid": pid,
            "gpu": {"ordinal": local, "token": str(local), "uuid": None},
        }
        self.seq = 0
        self.step = 0
        self.t0_wall = time.time_ns()
        self.t0_mono = time.monotonic_ns()

    def record(self, event: str) -> str:
        now = self.t0_mono + self.seq * 1_000_000_000
        last = now - 250_000_000 if self.step else None
        rec: dict[str, Any] = dict(self.base)
        rec.update(
            event=event,
            wall_time_ns=self.t0_wall + self.seq * 1_000_000_000,
            progress_seq=self.step,
            iteration=self.step or None,
            phase="train" if self.step else "setup",
            checkpoint_active=False,
            checkpoint_id=None,
            last_progress_monotonic_ns=last,
            since_progress_s=0.25 if self.step else 0.5,
            progress_source="api" if self.step else "none",
            monotonic_ns=now,
            seq=self.seq,
        )
        self.seq += 1
        self.step += 1
        return dumps_line(rec)

    def append(self, event: str = "heartbeat") -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(self.record(event))


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, tuple[float, float]]:
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, (time.perf_counter() - w0, time.process_time() - c0)


def _breakdown_once(monitor: JobMonitor, run_dir: Path) -> tuple[list[tuple[float, float]], int]:
    """One scan done phase by phase, as ``JobMonitor._scan`` does it (no remote source
    and no pid checks, as in the timed scans; no health file exists)."""
    now = monitor.clock()
    _, t_read = _timed_call(monitor.ingest.read_local_files, now)
    _, t_health = _timed_call(monitor.ingest.read_health, now)
    findings, t_eval = _timed_call(monitor.rules.evaluate, now, monitor.ingest.health_for)
    assert not findings, "a finding fired: the benchmark state is not steady"
    monitor.scan_count += 1
    status, t_build = _timed_call(monitor._build_status, now)
    text, t_dumps = _timed_call(
        lambda: json.dumps(status, separators=(",", ":"), default=str) + "\n"
    )
    _, t_write = _timed_call(atomic_write_text, run_dir / STATUS_FILE, text)
    return [t_read, t_health, t_eval, t_build, t_dumps, t_write], len(text)


def _median_pair(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def bench(n: int, scans: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"rankguard-scan-{n}-") as tmp:
        run_dir = Path(tmp)
        ranks = [FakeRank(run_dir, r, n) for r in range(n)]
        for fr in ranks:  # what the monitor finds at its first scan
            fr.append("process_start")
            fr.append("heartbeat")
        record_bytes = ranks[n // 2].path.stat().st_size / 2
        monitor = JobMonitor(_config(), run_dir, RUN_ID, expected_world_size=n, check_pids=False)
        out: dict[str, Any] = {"n": n, "record_bytes": record_bytes}

        out["first"] = _timed(monitor.scan_once)

        steady: list[tuple[float, float]] = []
        for _ in range(scans):
            for fr in ranks:
                fr.append()
            steady.append(_timed(monitor.scan_once))
        out["steady"] = _median_pair(steady)

        idle = [_timed(monitor.scan_once) for _ in range(scans)]
        out["idle"] = _median_pair(idle)

        # Breakdown of a steady-state scan: the phases of JobMonitor._scan, one by one.
        phases: dict[str, list[tuple[float, float]]] = {
            "read files (scandir+stat+read+json)": [],
            "health files (2nd scandir)": [],
            "rules.evaluate": [],
            "build status dict": [],
            "json.dumps(status, compact)": [],
            "atomic write (write+fsync+rename)": [],
        }
        status_bytes = 0
        for _ in range(scans):
            for fr in ranks:
                fr.append()
            timings, status_bytes = _breakdown_once(monitor, run_dir)
            for name, t in zip(phases, timings, strict=True):
                phases[name].append(t)
        out["phases"] = {name: _median_pair(v) for name, v in phases.items()}
        out["status_bytes"] = status_bytes
        out["findings"] = monitor.rules.findings_total
        out["scan_errors"] = monitor.scan_errors
        out["observed"] = monitor.status["summary"]["ranks_observed"]
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--scans", type=int, default=7, help="scans per case (median taken)")
    p.add_argument("--smoke", action="store_true", help="64 and 128 ranks, 2 scans (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.ranks, args.scans = [64, 128], 2

    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPU(s), "
        f"{platform.processor() or platform.machine()}, temp dir {tempfile.gettempdir()}"
    )
    print(f"median of {args.scans} scans per case; wall = perf_counter, cpu = process_time\n")
    results = []
    for n in args.ranks:
        gc.collect()
        res = bench(n, args.scans)
        results.append(res)
        assert res["observed"] == n and res["scan_errors"] == 0 and res["findings"] == 0, res
        print(
            f"== {n} ranks (record ~{res['record_bytes']:.0f} B, status.json "
            f"{res['status_bytes'] / 1e6:.2f} MB) =="
        )
        print(f"{'scan':<38} {'wall ms':>9} {'cpu ms':>9} {'wall us/rank':>13}")
        for key, label in (
            ("first", "first scan (read everything)"),
            ("steady", "steady (1 new line per file)"),
            ("idle", "idle (nothing changed)"),
        ):
            wall, cpu = res[key]
            print(f"{label:<38} {wall * 1e3:9.1f} {cpu * 1e3:9.1f} {wall / n * 1e6:13.1f}")
        print("steady-state breakdown:")
        total = sum(w for w, _ in res["phases"].values())
        for name, (wall, cpu) in res["phases"].items():
            print(
                f"  {name:<36} {wall * 1e3:9.1f} {cpu * 1e3:9.1f} {wall / n * 1e6:13.1f}"
                f"  ({wall / total * 100:4.1f}%)"
            )
        print(f"  {'sum of phases':<36} {total * 1e3:9.1f}")
        print()

    if len(results) >= 2:
        small, big = results[0], results[-1]
        factor = big["n"] / small["n"]
        print(f"scaling {big['n']}/{small['n']} ranks (linear = {factor:.0f}x):")
        for key in ("first", "steady", "idle"):
            ws, cs = small[key]
            wb, cb = big[key]
            print(f"  {key:<7} wall {wb / ws:5.2f}x   cpu {cb / cs:5.2f}x")
        print()
    for res in results:
        wall = res["steady"][0]
        verdict = "MEETS" if wall < GOAL_S else "MISSES"
        well = "yes" if wall < WELL_UNDER_S else "NO"
        print(
            f"goal: steady-state scan at {res['n']} ranks < {GOAL_S:.0f} s -> {verdict} "
            f"({wall:.3f} s wall, {res['steady'][1]:.3f} s cpu); well under "
            f"(< {WELL_UNDER_S} s, half the default scan interval): {well}"
        )
    if len(results) >= 2:
        small, big = results[0], results[-1]
        factor = big["n"] / small["n"]
        ratio = big["steady"][1] / small["steady"][1]
        linear = "yes" if ratio <= factor * 1.25 else "NO"
        print(
            f"goal: linear scaling ({factor:.0f}x) -> steady cpu {ratio:.2f}x, "
            f"within 25% of linear: {linear}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
