"""One large job simulated on one machine: node 0's monitor at up to 100,000 ranks.

What runs, and what is real:

- node 0 (this process) hosts a real ``torch.distributed.TCPStore`` on 127.0.0.1, as
  its launcher hosts the rendezvous store, and runs the real ``JobMonitor`` with the
  real ``StoreRemoteSource``, scanning every ``--scan-interval`` seconds on this thread
  (the monitor's own fixed-rate loop, inlined to time each scan). Its own 8 ranks write
  real heartbeat files in its run directory (one thread here).
- nodes 1..N-1 are real ``StoreRelay`` objects, many per simulator process
  (``--procs``), each pushing every ``--publish-interval`` seconds with its own phase:
  ``collect()`` offers its ranks' records as their publishers would write them (same
  fields, ages spread over the interval) instead of reading files; everything after it
  (kill-request and control checks, the change detection, the tick and full-record
  keys, ``store.set``) is the relay's own code. The relays of one simulator process
  share one store connection (12,500 sockets on one machine would measure the kernel,
  not rankguard): the keys, payloads and number of operations are those of the job.
- ranks step every ``--step-time`` seconds. After a steady phase, one rank's process
  hangs (its heartbeats stop: ``rank_process_heartbeat_timeout`` expected after
  ``--process-timeout``), then a collective hang: the culprit stops stepping outside any
  collective and every other rank waits inside one (``gpu_progress_timeout`` naming the
  culprit expected after ``--progress-timeout``).

Reported: scan wall and CPU time (the monitor thread's ``time.thread_time``), node 0's
process CPU (monitor, store server threads, its ranks' writer) as a share of one core,
node 0's memory (RSS), status.json size and write time, status_ranks.json write time,
store operations per second and their latency (relays and monitor), and the detection
latency of each injected hang (from the injection; and from the hung rank's last
record). The machine's cores are shared with the simulators: CPU times are the
figures to judge, wall times say how late the scans ran.

Run: ``python bench/scale.py --ranks 100000`` (about 3 minutes; more cores help the
simulators, not node 0). ``--ranks 2048 --steady 10`` is a CI-sized run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rankguard._fs import dumps_line
from rankguard.heartbeat.config import HeartbeatConfig
from rankguard.heartbeat.monitor import JobMonitor
from rankguard.heartbeat.relay import StoreRelay, StoreRemoteSource
from rankguard.schema.findings import FindingType
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import SCHEMA_VERSION

RUN_ID = "20261130-120000-scale"
PER_NODE = 8
SLACK_S = 2.0  # detection within timeout + this
SCAN_GOAL_S = 1.0
STATUS_GOAL_S = 0.1
IN_COLLECTIVE = "distributed_c10d.py:2501 in all_reduce"
IN_MODEL = "model.py:88 in forward"


class TimedStore:
    """A store client that counts each operation and keeps its latencies."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ops: dict[str, list[float]] = {}

    def _call(self, name: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return getattr(self.store, name)(*args)
        finally:
            self.ops.setdefault(name, []).append(time.perf_counter() - t0)

    def set(self, key: str, value: Any) -> None:
        self._call("set", key, value)

    def get(self, key: str) -> Any:
        return self._call("get", key)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", keys))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return list(self._call("multi_get", keys))

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key))


class Clock:
    """The simulated ranks' shared schedule: steps, and the injected hangs."""

    def __init__(self, t0: float, step_s: float, shared: Any) -> None:
        self.t0, self.step_s, self.shared = t0, step_s, shared

    def progress(self, rank: int, now: float) -> tuple[int, float, str]:
        """(progress_seq, seconds since it, main frame) of ``rank`` at ``now``."""
        hang_at = self.shared[1]
        if hang_at and now >= hang_at:
            done = int((hang_at - self.t0) / self.step_s)
            last = self.t0 + done * self.step_s
            frame = IN_MODEL if rank == int(self.shared[2]) else IN_COLLECTIVE
            return done, now - last, frame
        done = int((now - self.t0) / self.step_s)
        return done, now - (self.t0 + done * self.step_s), "train.py:212 in train_step"

    def process_hung(self, rank: int, now: float) -> bool:
        at = self.shared[0]
        return bool(at) and rank == int(self.shared[3]) and now >= at


class SimRank:
    """What one rank's publisher writes (a GPU rank of an 8-GPU node)."""

    __slots__ = ("base", "lag", "rank", "seq", "start_mono", "start_wall")

    def __init__(self, rank: int, world: int, interval: float) -> None:
        node, local = divmod(rank, PER_NODE)
        self.rank = rank
        self.base = {
            "schema_version": SCHEMA_VERSION,
            "run_id": RUN_ID,
            "hostname": f"gpu-{node:05d}",
            "node_rank": node,
            "rank": rank,
            "local_rank": local,
            "world_size": world,
            "pid": 100_000 + rank,
            "gpu": {"ordinal": local, "token": f"GPU-{rank:08x}", "uuid": f"GPU-{rank:08x}"},
            "phase": "train",
            "checkpoint_active": False,
            "checkpoint_id": None,
            "progress_source": "cuda_event",
        }
        self.seq = 0
        self.lag = (rank * 0.618) % 1.0 * interval  # its records' age when a relay reads
        self.start_mono = time.monotonic() - interval  # started before the first record
        self.start_wall = time.time_ns() - int(interval * 1e9)

    def record(self, clock: Clock, now: float) -> dict[str, Any]:
        at = now - self.lag
        done, since, frame = clock.progress(self.rank, at)
        rec = dict(self.base)
        rec.update(
            event="process_start" if self.seq == 0 else "heartbeat",
            seq=self.seq,
            wall_time_ns=self.start_wall + int((at - self.start_mono) * 1e9),
            monotonic_ns=int(at * 1e9),
            progress_seq=done,
            iteration=done,
            since_progress_s=round(since, 6),
            last_progress_monotonic_ns=int((at - since) * 1e9),
            phase_elapsed_s=round(at - self.start_mono, 6),
            main_frame=frame,
        )
        self.seq += 1
        return rec


class SimRelay(StoreRelay):
    """A node's real relay whose ranks are simulated instead of read from files."""

    def __init__(self, store: Any, run_dir: Path, node: int, world: int, **kw: Any) -> None:
        super().__init__(store, run_dir, RUN_ID, node, kw["interval"])
        self.sim = [
            SimRank(r, world, kw["interval"]) for r in range(node * PER_NODE, (node + 1) * PER_NODE)
        ]
        self.clock: Clock = kw["clock"]

    def collect(self) -> None:
        now = time.monotonic()
        for rank in self.sim:
            if not self.clock.process_hung(rank.rank, now - rank.lag):
                self.offer(rank.record(self.clock, now))


def simulate(
    port: int,
    nodes: list[int],
    world: int,
    args: argparse.Namespace,
    shared: Any,
    stop: Any,
    out: Any,
    t0: float,
) -> None:
    """One simulator process: the relays of ``nodes``, each at its own phase."""
    import torch.distributed as dist

    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), use_libuv=True
    )
    store = TimedStore(client)
    clock = Clock(t0, args.step_time, shared)
    with tempfile.TemporaryDirectory(prefix="rankguard-sim-") as tmp:
        run_dir = Path(tmp)
        relays = [
            SimRelay(store, run_dir, n, world, interval=args.publish_interval, clock=clock)
            for n in nodes
        ]
        interval = args.publish_interval
        start = time.monotonic()
        due = [start + i * interval / len(relays) for i in range(len(relays))]
        late: list[float] = []
        pushes = base = 0
        cpu0 = time.process_time()
        while not stop.is_set():
            for i, relay in enumerate(relays):
                wait = due[i] - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                else:
                    late.append(-wait)
                if stop.is_set():
                    break
                relay.push_once()
                due[i] += interval
            pushes = sum(r.pushes for r in relays)
            base = sum(r.base_pushes for r in relays)
        wall = time.monotonic() - start
        out.put(
            {
                "pushes": pushes,
                "base_pushes": base,
                "errors": sum(r.errors for r in relays),
                "wall_s": wall,
                "cpu_s": time.process_time() - cpu0,
                "late_p99_s": _pct(late, 99),
                "ops": {k: _summary(v, wall) for k, v in store.ops.items()},
            }
        )


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def _summary(lat: list[float], wall: float) -> dict[str, float]:
    return {
        "n": len(lat),
        "per_s": len(lat) / wall if wall else 0.0,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
    }


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def node0_ranks(
    run_dir: Path, world: int, args: argparse.Namespace, clock: Clock, stop: Any
) -> None:
    """Node 0's own 8 ranks: real heartbeat files, as their publishers append them."""
    ranks = [SimRank(r, world, args.publish_interval) for r in range(PER_NODE)]
    for r in ranks:
        r.lag = 0.0
        # this host and a live pid: the monitor's pid checks look at them as at real ranks
        r.base.update(hostname=socket.gethostname(), pid=os.getpid())
    while not stop.is_set():
        now = time.monotonic()
        for r in ranks:
            if clock.process_hung(r.rank, now):
                continue
            path = run_dir / heartbeat_file_name(r.rank, r.base["pid"])
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(dumps_line(r.record(clock, now)))
        stop.wait(args.publish_interval)


class Node0:
    """The monitor's scans, timed one by one (its own loop, ``JobMonitor._loop``:
    every interval, and when a rank's timeout runs out)."""

    def __init__(self, monitor: JobMonitor, interval: float) -> None:
        self.monitor = monitor
        self.interval = interval
        self.scans: list[dict[str, float]] = []
        self.next_at = time.monotonic()

    def scan(self) -> list[Any]:
        wait = self.monitor._wake_at(self.next_at) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t = time.monotonic()
        found = self.monitor.scan_once()
        m = self.monitor
        self.scans.append(
            {
                "at": t,
                "wall": m.last_scan_s,
                "cpu": m.last_scan_cpu_s,
                "status_s": m.last_status_write_s,
                "status_bytes": m.status_bytes,
            }
        )
        if t >= self.next_at:
            self.next_at = max(self.next_at + self.interval, time.monotonic() + 0.1 * self.interval)
        return found

    def until(self, pred: Any, limit_s: float) -> tuple[float, list[Any]] | None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            found = [f for f in self.scan() if pred(f)]
            if found:  # found when that scan ended
                return self.scans[-1]["at"] + self.monitor.last_scan_s, found
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8192, help="world size (a multiple of 8)")
    ap.add_argument("--procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--publish-interval", type=float, default=5.0)
    ap.add_argument("--scan-interval", type=float, default=1.0)
    ap.add_argument("--process-timeout", type=float, default=15.0)
    ap.add_argument("--progress-timeout", type=float, default=20.0)
    ap.add_argument("--step-time", type=float, default=2.0)
    ap.add_argument("--steady", type=float, default=30.0, help="seconds of steady scans")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--profile", action="store_true", help="profile the steady scans")
    args = ap.parse_args()
    if args.ranks % PER_NODE or args.ranks < 2 * PER_NODE:
        ap.error("--ranks: a multiple of 8, at least 16")
    import torch.distributed as dist

    world = args.ranks
    nnodes = world // PER_NODE
    print(
        f"scale: {world} ranks on {nnodes} nodes, {args.procs} simulator processes, "
        f"python {platform.python_version()}, {os.cpu_count()} cores"
    )
    master = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
        use_libuv=True,
    )
    ctx = mp.get_context("spawn")
    shared = ctx.Array("d", [0.0, 0.0, 0.0, 0.0])  # process hang at, collective at, ranks
    stop = ctx.Event()
    out = ctx.Queue()
    t0 = time.monotonic()
    clock = Clock(t0, args.step_time, shared)
    remote_nodes = list(range(1, nnodes))
    chunks = [remote_nodes[i :: args.procs] for i in range(args.procs)]
    procs = [
        ctx.Process(
            target=simulate, args=(master.port, c, world, args, shared, stop, out, t0), daemon=True
        )
        for c in chunks
        if c
    ]
    for p in procs:
        p.start()
    cfg = HeartbeatConfig(
        enabled=True,
        publish_interval_s=args.publish_interval,
        scan_interval_s=args.scan_interval,
        initial_process_timeout_s=600.0,
        process_timeout_s=args.process_timeout,
        initial_progress_timeout_s=600.0,
        progress_timeout_s=args.progress_timeout,
        checkpoint_timeout_s=600.0,
    )
    with tempfile.TemporaryDirectory(prefix="rankguard-scale-") as tmp:
        run_dir = Path(tmp)
        node_stop = threading.Event()
        writer = threading.Thread(
            target=node0_ranks, args=(run_dir, world, args, clock, node_stop), daemon=True
        )
        writer.start()
        node0_store = TimedStore(master)
        source = StoreRemoteSource(node0_store, RUN_ID, nnodes)
        monitor = JobMonitor(
            cfg, run_dir, RUN_ID, expected_world_size=world, remote=source, check_pids=True
        )
        node0 = Node0(monitor, args.scan_interval)
        detail_s: list[float] = []  # the scan's snapshot for status_ranks.json
        real_detail = monitor._write_rank_detail

        def timed_detail(now: float) -> None:
            t = time.perf_counter()
            real_detail(now)
            detail_s.append(time.perf_counter() - t)

        monitor._write_rank_detail = timed_detail  # type: ignore[method-assign]
        # Warm-up: every rank seen, then one more publish interval of ticks.
        warm0 = time.monotonic()
        while len(monitor.rules.ranks) < world and time.monotonic() - warm0 < 600:
            node0.scan()
        seen_all = time.monotonic() - warm0
        first_scans = list(node0.scans)
        for _ in range(int(2 * args.publish_interval / args.scan_interval)):
            node0.scan()
        # Steady state.
        n0 = len(node0.scans)
        ops0 = {k: len(v) for k, v in node0_store.ops.items()}
        w0, c0 = time.monotonic(), time.process_time()
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        while time.monotonic() - w0 < args.steady:
            found = node0.scan()
            assert not found, [f.message for f in found]
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        steady_wall = time.monotonic() - w0
        steady_cpu = time.process_time() - c0
        steady = node0.scans[n0:]
        node0_ops = {
            k: _summary(v[ops0.get(k, 0) :], steady_wall) for k, v in node0_store.ops.items()
        }
        rss = _rss_mb()
        # Hang 1: one rank's process stops (its heartbeats stop).
        victim = world - 3
        shared[3] = float(victim)
        shared[0] = hang1 = time.monotonic()
        got = node0.until(
            lambda f: f.rank == victim and f.finding_type is FindingType.PROCESS_TIMEOUT,
            args.process_timeout + 60,
        )
        det1 = None if got is None else got[0] - hang1
        # its last record's creation (one host here: the simulator's monotonic clock is
        # node 0's); node 0's own view of it is later by the push and the scan
        last_rec = monitor.rules.ranks[victim].record
        last1 = last_rec.monotonic_ns / 1e9 if last_rec and last_rec.monotonic_ns else None
        after1 = None if got is None or last1 is None else got[0] - last1 - args.process_timeout
        shared[0] = 0.0  # the process resumes: alive again before the next hang
        back = node0.until(lambda f: False, 0.0)
        while monitor.rules.ranks[victim].liveness.value != "alive":
            back = node0.until(lambda f: False, args.scan_interval)
        del back
        # Hang 2: a collective hang; the culprit stops outside the collective.
        culprit = world // 2 + 5
        shared[2] = float(culprit)
        shared[1] = hang2 = time.monotonic()
        n2 = len(node0.scans)
        got2 = node0.until(
            lambda f: f.finding_type is FindingType.PROGRESS_TIMEOUT,
            args.progress_timeout + 60,
        )
        det2 = None if got2 is None else got2[0] - hang2
        last_step = t0 + int((hang2 - t0) / args.step_time) * args.step_time
        after2 = None if got2 is None else got2[0] - last_step - args.progress_timeout
        blamed = sorted({f.rank for f in got2[1]}) if got2 else []
        hang_scans = node0.scans[n2:]
        for _ in range(3):  # every rank stalled: the scans after the detection
            node0.scan()
        after = node0.scans[-3:]
        stop.set()
        node_stop.set()
        sims = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        status_bytes = monitor.status_bytes
        monitor.wait_rank_detail()
        detail_write = monitor.last_detail_write_s

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows) if rows else 0.0

    def mx(rows: list[dict[str, float]], key: str) -> float:
        return max((r[key] for r in rows), default=0.0)

    relay_ops: dict[str, dict[str, float]] = {}
    for sim in sims:
        for name, o in sim["ops"].items():
            acc = relay_ops.setdefault(name, {"n": 0, "per_s": 0.0, "p50_ms": 0.0, "p99_ms": 0.0})
            acc["n"] += o["n"]
            acc["per_s"] += o["per_s"]
            acc["p50_ms"] = max(acc["p50_ms"], o["p50_ms"])
            acc["p99_ms"] = max(acc["p99_ms"], o["p99_ms"])
    pushes = sum(s["pushes"] for s in sims)
    figures = {
        "ranks": world,
        "nodes": nnodes,
        "all_ranks_seen_s": round(seen_all, 2),
        "first_scan_s": round(max(r["wall"] for r in first_scans), 3) if first_scans else None,
        "steady_scans": len(steady),
        "scan_wall_median_s": round(med(steady, "wall"), 4),
        "scan_wall_max_s": round(mx(steady, "wall"), 4),
        "scan_cpu_median_s": round(med(steady, "cpu"), 4),
        "scan_cpu_max_s": round(mx(steady, "cpu"), 4),
        "node0_process_cpu_share": round(steady_cpu / steady_wall, 3),
        "node0_rss_mb": round(rss, 1),
        "status_bytes": status_bytes,
        "status_write_median_s": round(med(steady, "status_s"), 4),
        "status_write_max_s": round(mx(steady, "status_s"), 4),
        "status_ranks_snapshot_s": round(max(detail_s), 3) if detail_s else None,
        "status_ranks_write_s": round(detail_write, 3),
        "relay_pushes": pushes,
        "relay_full_record_share": round(sum(s["base_pushes"] for s in sims) / max(1, pushes), 4),
        "relay_errors": sum(s["errors"] for s in sims),
        "relay_late_p99_s": round(max(s["late_p99_s"] for s in sims), 3),
        "simulator_cpu_share": round(sum(s["cpu_s"] / s["wall_s"] for s in sims), 2),
        "store_ops_relays": relay_ops,
        "store_ops_node0": node0_ops,
        "hang_process_timeout_s": args.process_timeout,
        "hang_process_injection_to_finding_s": None if det1 is None else round(det1, 2),
        "hang_process_timeout_to_finding_s": None if after1 is None else round(after1, 2),
        "hang_collective_timeout_s": args.progress_timeout,
        "hang_collective_injection_to_finding_s": None if det2 is None else round(det2, 2),
        "hang_collective_timeout_to_finding_s": None if after2 is None else round(after2, 2),
        "hang_collective_blamed": blamed[:10],
        "hang_collective_culprit": culprit,
        "scan_cpu_during_hang_max_s": round(mx(hang_scans, "cpu"), 3),
        "scan_wall_during_hang_max_s": round(mx(hang_scans, "wall"), 3),
        "scan_cpu_all_stalled_median_s": round(med(after, "cpu"), 3),
    }
    for key, value in figures.items():
        if isinstance(value, dict):
            print(f"  {key}:")
            for name, o in value.items():
                print(
                    f"    {name:10s} {o['per_s']:9.1f}/s  p50 {o['p50_ms']:7.3f} ms  "
                    f"p99 {o['p99_ms']:7.3f} ms  (n={int(o['n'])})"
                )
        else:
            print(f"  {key:34s} {value}")
    ok = (
        figures["scan_cpu_median_s"] <= SCAN_GOAL_S
        and figures["node0_process_cpu_share"] <= 1.0
        and figures["status_write_median_s"] < STATUS_GOAL_S
        and after1 is not None
        and after1 <= SLACK_S
        and after2 is not None
        and after2 <= SLACK_S
        and blamed == [culprit]
    )
    print(
        f"  goals (scan CPU <= {SCAN_GOAL_S:g} s, node 0 <= 1 core, status < "
        f"{STATUS_GOAL_S * 1e3:g} ms, finding <= {SLACK_S:g} s after the timeout ran out, "
        "culprit named): "
        f"{'met' if ok else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
