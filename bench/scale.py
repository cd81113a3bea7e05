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

Two ways to run it. ``--realtime``: the simulators push on the wall clock, as a job
does; it needs the cores to simulate 12,500 nodes in real time (about one core for the
relays at 100,000 ranks, besides node 0). The default, lockstep: time is virtual (one
clock for the simulated ranks and node 0's monitor) and advances from one scan to the
next only once every relay due by then has pushed, so a machine whose cores are busy
elsewhere slows the run down without making ranks look late. Everything node 0 does
is the same; a scan's time is its CPU time (what it takes on a core of its own), and a
finding is dated at its scan's virtual time plus that scan's CPU time.

Reported: scan wall and CPU time (the monitor thread's ``time.thread_time``), node 0's
process CPU (monitor, store server threads, its ranks' writer) as a share of one core,
node 0's memory (RSS), status.json size and write time, status_ranks.json write time,
store operations per second and their latency (relays and monitor), and the detection
latency of each injected hang (from the injection; and from the hung rank's last
record). The machine's cores are shared with the simulators: CPU times are the
figures to judge, wall times say how late the scans ran.

What it does not exercise: the remote nodes' own file reading (``collect()`` is
synthetic), one store connection per relay (they share one per simulator process), the
perf fields of a record (the simulated records carry none: a job with the performance
monitor on sends larger records), and, in lockstep, the pressure of a wall clock (a scan
that takes longer than the interval delays the next one instead of making ranks late).
The wall-clock scan times are printed too, next to the interval: on a shared machine they
are what the monitor took, the CPU times what it would take on a core of its own.

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

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.monitor import JobMonitor
from rankguard.relay.relay import StoreRelay, StoreRemoteSource
from rankguard.schema.findings import FindingType
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import SCHEMA_VERSION
from rankguard.util.fs import dumps_line

RUN_ID = "20261130-120000-scale"
WALL0 = 1_764_000_000_000_000_000  # the wall clock at virtual time 0 (ns)
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

    def add(self, key: str, value: int) -> int:
        return int(self._call("add", key, value))


class Clock:
    """The simulated ranks' shared schedule: steps, and the injected hangs."""

    def __init__(self, step_s: float, shared: Any, mono0: float) -> None:
        self.t0, self.step_s, self.shared = 0.0, step_s, shared
        self.mono0 = mono0  # the host's monotonic clock at virtual time 0

    def mono(self, at: float) -> float:
        """The host's monotonic clock at virtual time ``at`` (what a rank's record
        carries): virtual, not the simulator's real clock, so records a publish interval
        apart are that far apart on their clock however slowly the machine simulates
        them (real time between two pushes of a slow lockstep run made every rank look
        paused and resumed: its progress clock restarted, a collective hang was never
        found)."""
        return self.mono0 + at

    def progress(self, rank: int, now: float) -> tuple[int, float, str]:
        """(progress_seq, seconds since it, main frame) of ``rank`` at ``now``. A record
        older than the job's start (a rank's lag reaches before it) is one a rank writes
        at its start: no step yet, progress just begun, as a real publisher's."""
        now = max(now, self.t0)
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

    def record(self, clock: Clock, now: float) -> dict[str, Any]:
        """Its record at virtual time ``now`` (written ``lag`` earlier): the virtual time
        is in ``wall_time_ns`` (from :data:`WALL0`), ``monotonic_ns`` is this host's
        clock at that virtual time (:meth:`Clock.mono`: the relay measures the record's
        age with it, on :class:`VirtualTime`)."""
        at = now - self.lag
        mono = clock.mono(at)
        done, since, frame = clock.progress(self.rank, at)
        rec = dict(self.base)
        rec.update(
            event="process_start" if self.seq == 0 else "heartbeat",
            seq=self.seq,
            wall_time_ns=WALL0 + int(at * 1e9),
            monotonic_ns=int(mono * 1e9),
            progress_seq=done,
            iteration=done,
            since_progress_s=round(since, 6),
            last_progress_monotonic_ns=int((mono - since) * 1e9),
            phase_elapsed_s=round(max(0.0, at) + 5.0, 6),
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
        self.vnow = 0.0  # virtual time of this push

    def collect(self) -> None:
        now = self.vnow
        for rank in self.sim:
            if not self.clock.process_hung(rank.rank, now - rank.lag):
                self.offer(rank.record(self.clock, now))


class VirtualTime:
    """The ``time`` module as a simulator's relays see it in lockstep: the monotonic
    clock at the virtual time of the push under way (:meth:`Clock.mono`), everything
    else real. The relays measure a record's age with it, as on a host whose clock runs
    with the job's."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.now = 0.0  # virtual time of the push under way

    def monotonic_ns(self) -> int:
        return int(self.clock.mono(self.now) * 1e9)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def simulate(
    port: int,
    nodes: list[int],
    world: int,
    args: argparse.Namespace,
    shared: Any,
    conn: Any,
    t0: float,
) -> None:
    """One simulator process: the relays of ``nodes``, each at its own phase. Lockstep:
    ``("until", t)`` pushes every relay due by virtual time ``t``, then answers; realtime:
    pushes on the wall clock (virtual time = monotonic - ``t0``) until ``("stop",)``."""
    import heapq

    import torch.distributed as dist

    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300), use_libuv=True
    )
    store = TimedStore(client)
    clock = Clock(args.step_time, shared, t0)
    vtime: VirtualTime | None = None
    if not args.realtime:  # this process only: its relays' clock is the virtual one
        import rankguard.relay.relay as relay_module

        vtime = VirtualTime(clock)
        relay_module.time = vtime  # type: ignore[assignment]
    interval = args.publish_interval
    with tempfile.TemporaryDirectory(prefix="rankguard-sim-") as tmp:
        run_dir = Path(tmp)
        relays = [SimRelay(store, run_dir, n, world, interval=interval, clock=clock) for n in nodes]
        due = [(i * interval / len(relays), i) for i in range(len(relays))]
        heapq.heapify(due)
        late: list[float] = []
        cpu0, w0 = time.process_time(), time.monotonic()
        virtual = 0.0

        def push_until(t: float) -> None:
            while due and due[0][0] <= t:
                at, i = heapq.heappop(due)
                relays[i].vnow = at
                if vtime is not None:
                    vtime.now = at
                relays[i].push_once()
                heapq.heappush(due, (at + interval, i))

        if args.realtime:
            while not conn.poll():
                now = time.monotonic() - t0
                if due[0][0] > now:
                    time.sleep(min(0.05, due[0][0] - now))
                    continue
                late.append(now - due[0][0])
                push_until(now)
            conn.recv()
            virtual = time.monotonic() - t0
        else:
            while True:
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                push_until(cmd[1])
                virtual = cmd[1]
                conn.send("ok")
        conn.send(
            {
                "pushes": sum(r.pushes for r in relays),
                "base_pushes": sum(r.base_pushes for r in relays),
                "errors": sum(r.errors for r in relays),
                "wall_s": time.monotonic() - w0,
                "virtual_s": virtual,
                "cpu_s": time.process_time() - cpu0,
                "late_p99_s": _pct(late, 99),
                "ops": {k: _summary(v, max(virtual, 1e-9)) for k, v in store.ops.items()},
                "latency": {k: v for k, v in store.ops.items()},
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


class Node0Ranks:
    """Node 0's own 8 ranks: real heartbeat files, as their publishers append them
    (this host and a live pid: the monitor's pid checks look at them as at real ranks)."""

    def __init__(self, run_dir: Path, world: int, interval: float, clock: Clock) -> None:
        self.ranks = [SimRank(r, world, interval) for r in range(PER_NODE)]
        for r in self.ranks:
            r.lag = 0.0
            r.base.update(hostname=socket.gethostname(), pid=os.getpid())
        self.run_dir, self.interval, self.clock = run_dir, interval, clock
        self.next_at = 0.0

    def write_until(self, t: float) -> None:
        while self.next_at <= t:
            for r in self.ranks:
                path = self.run_dir / heartbeat_file_name(r.rank, r.base["pid"])
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(dumps_line(r.record(self.clock, self.next_at)))
            self.next_at += self.interval


class Node0:
    """The monitor's scans, timed one by one, on its own schedule (``JobMonitor._loop``:
    every interval, and when a rank's timeout runs out)."""

    def __init__(
        self,
        monitor: JobMonitor,
        interval: float,
        vclock: list[float],
        advance: Any,
        realtime_t0: float | None,
    ) -> None:
        self.monitor = monitor
        self.interval = interval
        self.vclock = vclock
        self.advance = advance
        self.t0 = realtime_t0
        self.scans: list[dict[str, float]] = []
        self.next_at = 0.0
        self.last = -1.0

    def scan(self) -> list[Any]:
        target = self.next_at
        due = self.monitor.rules.next_due()
        if due is not None:
            target = min(target, max(due + 0.001, self.last + 0.1 * self.interval))
        if self.t0 is None:
            self.advance(target)
            self.vclock[0] = target
        else:
            wait = self.t0 + target - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            target = time.monotonic() - self.t0
        found = self.monitor.scan_once()
        m = self.monitor
        took = m.last_scan_cpu_s if self.t0 is None else m.last_scan_s
        self.scans.append(
            {
                "at": target,
                "done": target + took,
                "wall": m.last_scan_s,
                "cpu": m.last_scan_cpu_s,
                "status_s": m.last_status_write_s,
                "status_bytes": m.status_bytes,
            }
        )
        self.last = target
        if target >= self.next_at:
            self.next_at = max(self.next_at + self.interval, target + took)
        return found

    def now(self) -> float:
        return self.vclock[0] if self.t0 is None else time.monotonic() - self.t0

    def until(self, pred: Any, limit_s: float) -> tuple[float, list[Any]] | None:
        end = self.now() + limit_s
        while self.now() < end:
            found = [f for f in self.scan() if pred(f)]
            if found:  # found when that scan ended
                return self.scans[-1]["done"], found
        return None


def why_not_blamed(monitor: JobMonitor, culprit: int) -> str:
    """What node 0's rules hold when a collective hang's culprit was not named: the
    ranks that make every stalled rank a victim (down: dead or late heartbeats;
    flagged), the furthest behind, and the culprit's own state."""
    ranks = monitor.rules.ranks
    late = sorted(r for r, s in ranks.items() if s.late)
    dead = sorted(r for r, s in ranks.items() if s.active and s.liveness.value != "alive")
    stalled = [s for s in ranks.values() if s.stall is not None]
    live = [s for s in ranks.values() if s.liveness.value == "alive"]
    seqs = sorted({s.record.progress_seq for s in live if s.record is not None})
    c = ranks.get(culprit)
    own = (
        "absent"
        if c is None
        else (
            f"liveness {c.liveness.value}, late {c.late}, stall {c.stall}, blocked_by "
            f"{c.blocked_by[:5]}, seq {c.record.progress_seq if c.record else None}, "
            f"heartbeat age {c.heartbeat_age_s}, frame "
            f"{c.record.main_frame if c.record else None!r}"
        )
    )
    return (
        f"late ranks {len(late)} {late[:8]}, down {len(dead)} {dead[:8]}, stalled "
        f"{len(stalled)} of {len(ranks)}, alive {len(live)}, progress_seq of the alive "
        f"{seqs[:6]}; culprit {culprit}: {own}"
    )


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
    ap.add_argument(
        "--realtime", action="store_true", help="simulators on the wall clock (needs cores)"
    )
    ap.add_argument("--smoke", action="store_true", help="64 ranks, short timeouts (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.procs, args.steady, args.step_time = 64, 1, 3.0, 0.5
        args.publish_interval, args.process_timeout, args.progress_timeout = 1.0, 3.0, 4.0
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
    t0 = time.monotonic()
    clock = Clock(args.step_time, shared, t0)
    remote_nodes = list(range(1, nnodes))
    chunks = [c for c in (remote_nodes[i :: args.procs] for i in range(args.procs)) if c]
    pipes = [ctx.Pipe() for _ in chunks]
    procs = [
        ctx.Process(
            target=simulate, args=(master.port, c, world, args, shared, child, t0), daemon=True
        )
        for c, (_, child) in zip(chunks, pipes, strict=True)
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
    vclock = [0.0]
    with tempfile.TemporaryDirectory(prefix="rankguard-scale-") as tmp:
        run_dir = Path(tmp)
        local = Node0Ranks(run_dir, world, args.publish_interval, clock)
        node0_store = TimedStore(master)
        if args.realtime:

            def monitor_clock() -> float:
                return time.monotonic() - t0
        else:

            def monitor_clock() -> float:
                return vclock[0]

        # as a job's launcher builds it (the relays' push interval), on the monitor's clock
        source = StoreRemoteSource(
            node0_store,
            RUN_ID,
            nnodes,
            clock=monitor_clock,
            push_interval_s=args.publish_interval,
        )

        monitor = JobMonitor(
            cfg,
            run_dir,
            RUN_ID,
            expected_world_size=world,
            remote=source,
            check_pids=True,
            clock=monitor_clock,
        )

        def advance(t: float) -> None:
            for parent, _ in pipes:
                parent.send(("until", t))
            local.write_until(t)
            for parent, _ in pipes:
                parent.recv()

        if args.realtime:
            writer_stop = threading.Event()

            def write_local() -> None:
                while not writer_stop.wait(0.1):
                    local.write_until(time.monotonic() - t0)

            threading.Thread(target=write_local, daemon=True).start()
        node0 = Node0(monitor, args.scan_interval, vclock, advance, t0 if args.realtime else None)
        detail_s: list[float] = []  # the scan's snapshot for status_ranks.json
        real_detail = monitor._write_rank_detail

        def timed_detail(now: float) -> None:
            t = time.perf_counter()
            real_detail(now)
            detail_s.append(time.perf_counter() - t)

        monitor._write_rank_detail = timed_detail  # type: ignore[method-assign]
        # Warm-up: every rank seen, then two publish intervals of ticks.
        while len(monitor.rules.ranks) < world and node0.now() < 600:
            node0.scan()
        seen_all = node0.now()
        print(f"  every rank seen at t={seen_all:.1f} s; warming up", flush=True)
        first_scans = list(node0.scans)
        for _ in range(int(2 * args.publish_interval / args.scan_interval)):
            node0.scan()
        # Steady state.
        n0 = len(node0.scans)
        ops0 = {k: len(v) for k, v in node0_store.ops.items()}
        v0, c0 = node0.now(), time.process_time()
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        while node0.now() - v0 < args.steady:
            found = node0.scan()
            assert not found, [f.message for f in found]
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        steady_s = node0.now() - v0
        steady_cpu = time.process_time() - c0
        steady = node0.scans[n0:]
        node0_ops = {k: _summary(v[ops0.get(k, 0) :], steady_s) for k, v in node0_store.ops.items()}
        rss = _rss_mb()
        print("  steady phase done; injecting a process hang", flush=True)
        # Hang 1: one rank's process stops (its heartbeats stop).
        victim = world - 3
        shared[3] = float(victim)
        shared[0] = hang1 = node0.now()
        got = node0.until(
            lambda f: f.rank == victim and f.finding_type is FindingType.PROCESS_TIMEOUT,
            args.process_timeout + 60,
        )
        det1 = None if got is None else got[0] - hang1
        # its last record's creation (virtual time, carried in wall_time_ns); node 0's
        # own view of it is later by the push and the wait for the next scan
        last_rec = monitor.rules.ranks[victim].record
        last1 = (last_rec.wall_time_ns - WALL0) / 1e9 if last_rec else None
        after1 = None if got is None or last1 is None else got[0] - last1 - args.process_timeout
        shared[0] = 0.0  # the process resumes: alive again before the next hang
        while monitor.rules.ranks[victim].liveness.value != "alive":
            node0.scan()
        print("  injecting a collective hang", flush=True)
        # Hang 2: a collective hang; the culprit stops outside the collective.
        culprit = world // 2 + 5
        shared[2] = float(culprit)
        shared[1] = hang2 = node0.now()
        n2 = len(node0.scans)
        got2 = node0.until(
            lambda f: f.finding_type is FindingType.PROGRESS_TIMEOUT,
            args.progress_timeout + 60,
        )
        det2 = None if got2 is None else got2[0] - hang2
        last_step = int(hang2 / args.step_time) * args.step_time
        after2 = None if got2 is None else got2[0] - last_step - args.progress_timeout
        blamed = sorted({f.rank for f in got2[1]}) if got2 else []
        if got2 is None:
            print(f"  collective hang NOT found; {why_not_blamed(monitor, culprit)}", flush=True)
        hang_scans = node0.scans[n2:]
        for _ in range(3):  # every rank stalled: the scans after the detection
            node0.scan()
        after = node0.scans[-3:]
        for parent, _ in pipes:
            parent.send(("stop",))
        sims = [parent.recv() for parent, _ in pipes]
        for p in procs:
            p.join(timeout=30)
        if args.realtime:
            writer_stop.set()
        status_bytes = monitor.status_bytes
        monitor.wait_rank_detail()
        detail_write = monitor.last_detail_write_s

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows) if rows else 0.0

    def mx(rows: list[dict[str, float]], key: str) -> float:
        return max((r[key] for r in rows), default=0.0)

    relay_ops: dict[str, dict[str, float]] = {}
    virtual = max(s["virtual_s"] for s in sims)
    for name in sorted({k for sim in sims for k in sim["latency"]}):
        lat = [x for sim in sims for x in sim["latency"].get(name, [])]
        relay_ops[name] = _summary(lat, virtual)
    pushes = sum(s["pushes"] for s in sims)
    figures = {
        "ranks": world,
        "nodes": nnodes,
        "all_ranks_seen_at_s": round(seen_all, 2),
        "first_scan_s": round(max(r["wall"] for r in first_scans), 3) if first_scans else None,
        "steady_scans": len(steady),
        "scan_wall_median_s": round(med(steady, "wall"), 4),
        "scan_wall_max_s": round(mx(steady, "wall"), 4),
        "scan_wall_over_interval": sum(1 for r in steady if r["wall"] > args.scan_interval),
        "scan_cpu_median_s": round(med(steady, "cpu"), 4),
        "scan_cpu_max_s": round(mx(steady, "cpu"), 4),
        "mode": "realtime" if args.realtime else "lockstep",
        "node0_process_cpu_share": round(steady_cpu / steady_s, 3),
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
        "simulator_cpu_s_per_s": round(sum(s["cpu_s"] for s in sims) / virtual, 2),
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
        f"  wall clock (what the scans took on this machine, shared with the simulators): "
        f"steady median {figures['scan_wall_median_s']:.3f} s, max "
        f"{figures['scan_wall_max_s']:.3f} s against the {args.scan_interval:g} s interval; "
        f"{figures['scan_wall_over_interval']} of {len(steady)} longer than the interval"
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
