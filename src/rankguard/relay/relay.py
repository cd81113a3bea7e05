"""Heartbeats of other nodes reach node 0 through the rendezvous store.

Nodes share no filesystem, but every node's launcher already talks to the c10d
rendezvous ``TCPStore`` (hosted by node 0's launcher). On node k > 0 a
:class:`StoreRelay` thread tails the node's heartbeat files and, every publish
interval, sends the latest record of every local rank in two keys:

- ``rankguard/<run_id>/hb/tick/<k>``, every push: a small *tick* with the fields of each
  rank that move with time (counters, clocks, progress, the main thread's frame, see
  :mod:`.delta`) and the node's disk state;
- ``rankguard/<run_id>/hb/node/<k>``, only when anything else changed (a new process, an
  event, a phase, a checkpoint, an exit, a perf window, the GPU health snapshot, a
  shutdown): the full records plus the node's GPU health.

Both carry the relay's ``epoch`` (one per relay process) and the ``gen`` of the full
records; node 0 lays a tick over the records of the same epoch and generation and gets
back exactly the relay's records. Each key is overwritten, never appended to, so a
missed push loses nothing (the keys always hold the latest state), a restarted relay
starts a new epoch (its first push sends every record in full) and a node that drops
out simply stops changing its keys (its ranks' heartbeats age on node 0 as they would
without the relay). Node 0's :class:`StoreRemoteSource` reads with one ``multi_get`` per
scan the ticks of the nodes whose push was due (every tick after a relay's push off its
schedule: ``early_pushes``), parses only the ticks that changed and reads the full
records only of the nodes whose generation moved.

The latest-record model loses nothing the rules need: every record carries the rank's
full state, and ``process_end`` is always a rank's last record. The relay also notices
local pids that vanished without ``process_end`` (SIGKILL, hard crash) and relays a
synthesized ``process_end``, because node 0 cannot look at another node's process
table (it never looks up a relayed rank's pid, even on a host the nodes share). The
tick also says whether the node's disk is full (:mod:`.disk`), so a rank that cannot
write its heartbeats is not taken for a dead one.

The relay also answers node 0's requests for its ranks' flight-recorder traces on a hang
(``fr/request/<k>``, :mod:`rankguard.ft.frremote`), mirrors the stop step (``control``)
and serves node 0's kill requests (``kill/node/<k>``); it looks for them only when the
counter node 0 bumps after each request (``requests``) moved since its last look: one
store read a push instead of a check of each key. Any client of the
store can write that key, so the relay signals only its own node's current workers
(``workers``, the agent's registry): a request for any other pid (``-1``, ``0``, the
launcher, a pid reused since) is refused and logged. Without a registry it kills
nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankguard.ft.frremote import answer_request
from rankguard.ft.kill import (
    DEFAULT_DUMP_POLICY,
    DumpPolicy,
    OwnedWorkers,
    WorkerRegistry,
    dump_then_kill,
)
from rankguard.monitor.agree import write_control
from rankguard.monitor.api import RemoteSource
from rankguard.relay.delta import RecordPatcher, patch_rows, stable_part, tick_row
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import HEARTBEAT_FILE_RE, RunLayout, StoreKeys, note_request
from rankguard.schema.payloads import NodeBase, PayloadError, Tick, parse_kill_request
from rankguard.schema.records import Event, HeartbeatRecord, RecordError, supersedes
from rankguard.util.disk import DiskState, disk_state
from rankguard.util.procs import pid_running, process_state
from rankguard.util.tailer import JsonlTailer
from rankguard.util.wakeup import Wakeup

# Keys per ``multi_get`` round trip. TCPStore's server spends time quadratic in the size
# of one request and its reply: every 12,500 ticks of about 1 KB cost it about 400 ms of
# CPU in chunks of 4,096 keys, about 35 ms in chunks of 128 (and the client the same
# either way); much smaller chunks pay a round trip each.
MULTI_GET_KEYS = 128

__all__ = ["StoreRelay", "StoreRemoteSource", "publish_control", "request_kill"]

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0  # longest wait between pushes while pushes keep failing


def publish_control(store: Any, run_id: str, stop_at_step: int, reason: str) -> None:
    """Node 0: tell the other nodes' relays to write ``control.json`` for their ranks."""
    payload = json.dumps({"stop_at_step": stop_at_step, "reason": reason})
    keys = StoreKeys(run_id)
    store.set(keys.control, payload)
    note_request(store, keys)  # after the request: a relay that sees it looks


def request_kill(store: Any, run_id: str, node_rank: int, targets: list[JsonObject]) -> None:
    """Node 0: ask node ``node_rank``'s relay to dump the stacks of ``targets`` (dicts
    with rank, pid) and SIGKILL those marked ``kill``."""
    keys = StoreKeys(run_id)
    store.set(keys.kill(node_rank), json.dumps(targets))
    note_request(store, keys)


class StoreRelay:
    """Node k > 0: push the latest local records and health to the store."""

    def __init__(
        self,
        store: Any,
        run_dir: Path,
        run_id: str,
        node_rank: int,
        interval_s: float,
        *,
        dump_policy: DumpPolicy = DEFAULT_DUMP_POLICY,
        workers: WorkerRegistry | None = None,
    ) -> None:
        self.store = store
        # the only processes a kill request may reach; none without the agent's registry
        self.workers: WorkerRegistry = workers if workers is not None else OwnedWorkers()
        self.dump_policy = dump_policy  # fault_tolerance.stack_dump and its timeout
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self.keys = StoreKeys(run_id)
        self.run_id = run_id
        self.node_rank = node_rank
        self.interval_s = interval_s
        self.pushes = 0
        self.errors = 0
        self.last_error: str | None = None
        self.stopped: str | None = None  # why the relay thread ended on an error
        self.ignored_records = 0
        self._latest: dict[int, HeartbeatRecord] = {}
        # rank -> start time (ns) of its latest process: wall clock, monotonic clock
        self._started: dict[int, tuple[int, int | None]] = {}
        self._tailers: dict[str, JsonlTailer] = {}
        self._stop = threading.Event()
        self._wake = Wakeup()  # push now (set from a signal handler: no lock)
        self.shutdown: str | None = None  # why this node's launcher stops its workers
        self.root_cause: tuple[int, int | None] | None = None  # from this node's agent
        self.killed: dict[int, int] = {}  # pid -> rank killed on node 0's request
        self._thread: threading.Thread | None = None
        self._control_done = False
        self.epoch = f"{os.getpid():x}-{time.time_ns():x}"  # a restarted relay: a new one
        self.gen = 0  # generation of the full records last sent (``hb/node/<k>``)
        self.base_pushes = 0  # pushes that had to send the full records
        self._sent: tuple[Any, ...] | None = None  # what the last full records said
        # node 0's request counter as last read (requests served); None: not read yet
        self._requests_seen: int | None = None
        self.request_polls = 0  # pushes that looked for the requests themselves
        # the next push is off the schedule node 0 expects (the first, one asked for at
        # once, the last): it bumps ``early_pushes`` so that node 0 reads it at once
        self._early = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rankguard-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Final push, then mark this node done so node 0 can stop draining."""
        self.halt()  # the thread ends at once, not after a whole interval's wait
        self.push_now()
        try:
            self.store.set(self.keys.done(self.node_rank), b"1")
        except Exception as exc:
            logger.warning("rankguard relay: cannot mark node %d done: %s", self.node_rank, exc)

    def push_now(self) -> None:
        """One push now, off the schedule node 0 expects (a last push): flagged as
        early, so node 0 reads it at its next scan."""
        self._early = True
        self.push_once()

    def halt(self) -> None:
        """Stop pushing, with no last push and no ``done`` mark: this node left the job
        (excluded) and its number may already be another agent's in the new round; two
        relays writing one node's keys would hide that agent's ranks from node 0 (each
        push undoes the other's), and the other agent marks the number done itself."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def note_shutdown(self, reason: str) -> None:
        """This node's launcher is stopping its workers (a signal): node 0 must know
        before their exits reach it, so they are not taken for failures. Only sets
        flags (safe from a signal handler); the relay thread pushes at once."""
        if self.shutdown is None:
            self.shutdown = reason
        self._early = True
        self._wake.set()

    def note_root_cause(self, rank: int, pid: int | None) -> None:
        """This node's agent saw its workers fail and names ``rank`` from their exit
        codes: node 0 orders the exits it sees by it. The relay thread pushes at once."""
        self.root_cause = (rank, pid)
        self._early = True
        self._wake.set()

    def _loop(self) -> None:
        try:
            self._push_loop()
        except BaseException as exc:  # the thread ends: node 0 stops hearing from us
            self.stopped = f"{type(exc).__name__}: {exc}"
            logger.critical(
                "rankguard relay: THE RELAY THREAD OF NODE %d STOPPED; node 0 no longer "
                "receives this node's heartbeats",
                self.node_rank,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            raise

    def _push_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            # bounded back-off while pushes keep failing in a way push_once did not catch
            wait = min(MAX_BACKOFF_S, self.interval_s * 2.0 ** min(failures, 16))
            self._wake.wait(max(self.interval_s, wait) if failures else self.interval_s)
            if self._stop.is_set():
                break
            try:
                self.push_once()
                failures = 0
            except Exception as exc:  # a bug escaping push_once's own guards
                failures += 1
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                if failures == 1 or failures % 20 == 0:
                    logger.error(
                        "rankguard relay: PUSH FAILED (%d in a row, %d in all); node 0 "
                        "gets nothing from node %d until a push succeeds again",
                        failures,
                        self.errors,
                        self.node_rank,
                        exc_info=(type(exc), exc, exc.__traceback__),
                    )

    def collect(self) -> None:
        """Read what the node's ranks wrote since the last push (their heartbeat files)
        and synthesize ``process_end`` for pids that vanished. A simulation of many
        nodes in one process replaces this with :meth:`offer` calls."""
        with os.scandir(self.run_dir) as it:
            for entry in it:
                if not HEARTBEAT_FILE_RE.match(entry.name):
                    continue
                tailer = self._tailers.setdefault(entry.name, JsonlTailer(entry.path))
                for raw in tailer.read():
                    self._offer(raw)
        for rank, rec in list(self._latest.items()):
            if not rec.ended and not pid_running(rec.pid):
                self._latest[rank] = rec.vanished(time.time_ns())

    def latest_records(self) -> list[HeartbeatRecord]:
        """The newest record of each local rank (after :meth:`stop`: their ends)."""
        return list(self._latest.values())

    def offer(self, raw: JsonObject) -> None:
        """One record of a local rank, as its heartbeat file holds it."""
        self._offer(raw)

    def _offer(self, raw: JsonObject) -> None:
        """Keep ``raw`` if it is this run's newest record of its rank (the rules'
        :func:`~rankguard.schema.records.supersedes`); bad records are counted."""
        try:
            rec = HeartbeatRecord.from_dict(raw)
        except RecordError as exc:
            self.ignored_records += 1
            if self.ignored_records == 1:
                logger.warning("rankguard relay: invalid heartbeat record skipped: %s", exc)
            return
        if rec.run_id != self.run_id:
            return
        if rec.node_rank is not None and rec.node_rank != self.node_rank:
            # a rank of this agent under another node number (a round before the
            # agent was renumbered): relayed then, by that number's relay
            return
        if rec.relayed_age_s is not None:
            # another node's rank, mirrored here while this agent ran node 0's monitor
            # (a round before it was renumbered): its own node relays it and judges its
            # pid, which names no process of this node
            return
        old = self._latest.get(rec.rank)
        start, start_mono = self._started.get(rec.rank, (None, None))
        if not supersedes(rec, old, old_start_ns=start, old_start_mono_ns=start_mono):
            return
        if old is None or old.pid != rec.pid or rec.event is Event.PROCESS_START:
            self._started[rec.rank] = (rec.wall_time_ns, rec.monotonic_ns)
        self._latest[rec.rank] = rec

    def _health(self) -> JsonObject | None:
        path = self.layout.health(self.node_rank)
        try:
            snapshot = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return snapshot if isinstance(snapshot, dict) else None

    def _serve_kill_requests(self) -> None:
        key = self.keys.kill(self.node_rank)
        if not self.store.check([key]):
            return
        raw = self.store.get(key)
        self.store.delete_key(key)
        targets, dropped = parse_kill_request(raw)
        if dropped:
            logger.warning(
                "rankguard relay: kill request: %d duplicate or malformed entr%s dropped",
                dropped,
                "y" if dropped == 1 else "ies",
            )
        # In parallel: N hung ranks hold this loop for about one dump timeout, not N.
        done = dump_then_kill(self.run_dir, targets, self.dump_policy, owner=self.workers)
        for res in done.dumps:
            logger.warning(
                "rankguard relay: stacks of rank %d: %s", res.rank, res.path or res.error
            )
        for target in targets:
            if target.pid in done.killed:
                self.killed[target.pid] = target.rank  # its exit is fault tolerance's doing
                logger.warning(
                    "rankguard relay: killed rank %d (pid %d) on request", target.rank, target.pid
                )
        for refusal in done.refused:
            logger.error(
                "rankguard relay: refused to kill rank %d (pid %d) on request: %s",
                refusal.rank,
                refusal.pid,
                refusal.reason,
            )

    def _answering(self, asked: list[int]) -> list[int]:
        """Of the ranks node 0 asks traces of: this node's live ones, not stopped (a
        stopped rank cannot answer: the wait would only be longer)."""
        self.collect()
        out = []
        for rank in asked:
            rec = self._latest.get(rank)
            if rec is not None and not rec.ended and process_state(rec.pid) not in ("T", "t"):
                out.append(rank)
        return out

    def _mirror_control(self) -> None:
        key = self.keys.control
        if self._control_done or not self.store.check([key]):
            return
        control = json.loads(self.store.get(key))
        write_control(self.run_dir, int(control["stop_at_step"]), str(control["reason"]))
        self._control_done = True

    def _request_counter(self) -> int | None:
        """Node 0's request counter (:attr:`StoreKeys.requests`, bumped after each
        request it writes), read with ``add`` of 0 (which creates it): the one store
        operation of a push without a request. None: a store without ``add`` (every
        request key checked at every push)."""
        add = getattr(self.store, "add", None)
        return None if add is None else int(add(self.keys.requests, 0))

    def push_once(self) -> None:
        try:
            seen = self._request_counter()
        except Exception as exc:  # look for them: a failed read must not hide one
            logger.warning("rankguard relay: request counter unreadable: %s", exc)
            seen = None
        # The requests themselves only when the counter moved; at the first push anyway
        # (a relay started again finds those written before), and again after a look
        # that failed (the count it read is not taken as served).
        if seen is None or seen != self._requests_seen:
            self.request_polls += 1
            if self._serve_requests() and seen is not None:
                self._requests_seen = seen
        try:
            self.collect()
            self._push()
            self.pushes += 1
        except Exception as exc:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                logger.warning("rankguard relay: push failed (%d so far): %s", self.errors, exc)
            return
        if self._early:
            self._early = False
            self._say_early()

    def _say_early(self) -> None:
        """This push came off the schedule node 0 expects: bump the counter that makes
        it read every node's tick at its next scan (after the tick's ``set``: a scan that
        sees the bump finds the tick). Without ``add``, node 0 reads every tick anyway;
        if the bump fails, it reads this tick when the next push is due."""
        add = getattr(self.store, "add", None)
        if add is None:
            return
        try:
            add(self.keys.early_pushes, 1)
        except Exception as exc:
            logger.warning("rankguard relay: cannot flag an early push: %s", exc)

    def _serve_requests(self) -> bool:
        """Node 0's requests waiting in the store: the stop step, traces, kills. False
        when one of them failed (looked for again at the next push)."""
        ok = True
        try:
            self._mirror_control()
        except Exception as exc:
            ok = False
            logger.warning("rankguard relay: control mirror failed: %s", exc)
        try:  # before a kill request: node 0 asks for the traces before it kills
            answer_request(self.store, self.keys, self.node_rank, self.run_dir, self._answering)
        except Exception as exc:
            ok = False
            logger.warning("rankguard relay: flight-recorder request failed: %s", exc)
        try:
            self._serve_kill_requests()
        except Exception as exc:
            ok = False
            logger.warning("rankguard relay: kill request failed: %s", exc)
        return ok

    def _push(self) -> None:
        now = time.monotonic_ns()
        latest = sorted(self._latest.values(), key=lambda r: r.rank)
        # How old each record already is (same host's clock as its writer), so node 0
        # ages it from its creation, not from its arrival.
        ages = [
            max(0.0, (now - rec.monotonic_ns) / 1e9)
            if rec.monotonic_ns and not rec.synthesized
            else None
            for rec in latest
        ]
        health = self._health()
        disk = disk_state(self.run_dir).to_dict()
        root = list(self.root_cause) if self.root_cause else None
        sent = (tuple(stable_part(r) for r in latest), health, self.shutdown, root)
        if sent != self._sent:
            self.gen += 1
            records = [
                {**rec.to_dict(), "relayed_age_s": age} if age is not None else rec.to_dict()
                for rec, age in zip(latest, ages, strict=True)
            ]
            payload = {
                "epoch": self.epoch,
                "gen": self.gen,
                "records": records,
                "health": health,
                "disk": disk,
                "shutdown": self.shutdown,
                "root_cause": root,
            }
            self.store.set(self.keys.heartbeats(self.node_rank), json.dumps(payload))
            self._sent = sent
            self.base_pushes += 1
        tick = {
            "epoch": self.epoch,
            "gen": self.gen,
            "seq": self.pushes,  # node 0 tells a live relay from a stuck one by it
            "disk": disk,
            "ranks": [tick_row(rec, age) for rec, age in zip(latest, ages, strict=True)],
        }
        self.store.set(self.keys.tick(self.node_rank), json.dumps(tick, separators=(",", ":")))


class _Node:
    """Node 0's view of one relaying node: its last tick and full records."""

    __slots__ = (
        "base_gen",
        "due",
        "health",
        "patchers",
        "raw_records",
        "read_at",
        "tick_key",
        "tick_raw",
    )

    def __init__(self, tick_key: str) -> None:
        self.tick_key = tick_key
        self.tick_raw: bytes | None = None
        self.read_at: float | None = None  # when its tick was last read (source's clock)
        self.due = -math.inf  # from when its tick is read at every scan
        self.base_gen: tuple[Any, Any] | None = None  # (epoch, gen) of the full records
        self.patchers: dict[int, RecordPatcher] = {}  # rank -> its base record
        self.raw_records: list[JsonObject] = []  # full records that failed validation
        self.health: JsonObject | None = None


class StoreRemoteSource(RemoteSource):
    """Node 0: read what the relays of nodes 1..nnodes-1 pushed.

    :meth:`fetch_changed` (the monitor's call, once per scan) returns only the records
    that changed since the previous call: one ``multi_get`` of the ticks it reads, and
    one of the full records of the nodes whose generation moved. :meth:`fetch` returns
    every node's current records (the same state, as dicts).

    Which ticks a scan reads: given the relays' push interval (``push_interval_s``) and
    a store with ``add``, only those of the nodes whose next push may have come (a
    relay pushes at most once per interval: from 0.9 interval after the read before
    the one that saw its last push, every scan until it changed), and every tick when
    the relays' ``early_pushes`` counter moved (a push off that schedule: a relay's
    first, one its launcher or agent asked for at once, its last). A regular push is
    seen at the first scan after it, as when every tick is read at every scan; a
    relay that pushes every 5 s is read about twice an interval instead of at each
    of five 1 s scans. Otherwise every tick, every scan."""

    def __init__(
        self,
        store: Any,
        run_id: str,
        nnodes: int,
        *,
        disk_max_age_s: float = 10.0,
        silent_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        push_interval_s: float | None = None,
    ) -> None:
        """``disk_max_age_s``: a node's relayed disk state counts for that long after
        its relay's last new push; then it is unknown (not full): a relay that died
        while its disk was full must not keep its ranks from being found dead.
        ``silent_s``: a node of an earlier round whose relay pushed nothing new for that
        long left the job (excluded: its relay halted; lost: it died) and never says it
        is done: :meth:`nodes_done` no longer waits for it (None: waited for).
        ``push_interval_s``: the relays' push interval (``heartbeat.publish_interval_s``;
        None: every tick read at every scan)."""
        if push_interval_s is not None and not 0 < push_interval_s < math.inf:
            raise ValueError(f"push_interval_s: expected a number > 0, got {push_interval_s}")
        # a tick unchanged since it was last read is read again from this long after
        # the read before the one that saw its last push
        self._next_push_s = None if push_interval_s is None else 0.9 * push_interval_s
        self._early_seen: int | None = None  # ``early_pushes`` as last read
        self.store = store
        self.run_id = run_id
        self.keys = StoreKeys(run_id)
        self.nodes = list(range(1, nnodes))
        self._round_nodes: int | None = None  # the current round's node count, once told
        self.lost: set[int] = set()  # nodes live recovery took over (their relay is gone)
        self.disk_max_age_s = disk_max_age_s
        self.silent_s = silent_s
        self.clock = clock
        self._shutdowns: dict[int, str] = {}
        self._root_causes: dict[int, tuple[int, int | None]] = {}
        self._disks: dict[int, DiskState] = {}
        self._pushed: dict[int, tuple[Any, float]] = {}  # node -> (its push seq, seen at)
        self._state: dict[int, _Node] = {}  # nodes whose tick key exists
        self._current: dict[int, HeartbeatRecord] = {}  # rank -> latest relayed record
        self.ignored_rows = 0  # tick rows or payloads that could not be used
        self.last_ignored: str | None = None
        self.store_reads = 0  # round trips to the store (reads and checks)
        self.ticks_read = 0  # tick keys read

    def root_causes(self) -> dict[int, tuple[int, int | None]]:
        """Each node's agent's root cause of its failed workers (last :meth:`fetch`)."""
        return dict(self._root_causes)

    def shutdowns(self) -> dict[int, str]:
        """Nodes whose launcher is stopping their workers, and why (last :meth:`fetch`)."""
        return dict(self._shutdowns)

    def disks(self) -> dict[int, DiskState]:
        """Each node's disk state as of the last :meth:`fetch` (nodes that said); a
        state whose relay has not pushed anything new for ``disk_max_age_s`` is
        replaced by an unknown one (``full`` False, ``error`` saying why)."""
        now = self.clock()
        out = {}
        for node, disk in self._disks.items():
            _, seen = self._pushed.get(node, (None, now))
            age = now - seen
            if age > self.disk_max_age_s:
                disk = DiskState(
                    full=False, error=f"no new push from node {node}'s relay for {age:.0f}s"
                )
            out[node] = disk
        return out

    def fetch(self) -> tuple[list[JsonObject], dict[int, JsonObject]]:
        """Every node's current records (dicts, as the relays sent them) and health."""
        self.fetch_changed()
        records: list[JsonObject] = [r.to_dict() for _, r in sorted(self._current.items())]
        for node in self._state.values():
            records.extend(node.raw_records)
        health = {n: st.health for n, st in sorted(self._state.items()) if st.health}
        return records, health

    def fetch_changed(
        self,
    ) -> tuple[list[JsonObject | HeartbeatRecord], dict[int, JsonObject]]:
        """Records that changed since the last call (typed, or the raw dict of a full
        record that failed validation, for the monitor to count) and the health
        snapshots that changed."""
        self._discover()
        now = self.clock()
        present, early = self._to_read(now)
        ticks = self._multi_get([self._state[n].tick_key for n in present])
        self.ticks_read += len(present)
        if early is not None:
            self._early_seen = early  # read every tick after the early pushes
        # node -> its tick's generation, its rows, and (when the tick is of the full
        # records node 0 holds) the rows' records, built at once: the parsed tick is
        # freed before the next one is parsed (thousands of short-lived lists held
        # to the end of the scan cost the garbage collector more than building them)
        changed: dict[int, tuple[tuple[Any, Any], list[Any], list[HeartbeatRecord | str] | None]]
        changed = {}
        need_base: list[int] = []
        next_push_s = self._next_push_s
        for node, raw in zip(present, ticks, strict=True):
            st = self._state[node]
            read_before, st.read_at = st.read_at, now
            if raw == st.tick_raw:
                continue
            if next_push_s is not None:  # it pushed after the read before this one
                st.due = now if read_before is None else read_before + next_push_s
            try:
                tick = Tick.parse(raw)
            except PayloadError as exc:
                self._bad(f"node {node}: unusable tick: {exc}")
                continue
            st.tick_raw = raw
            # a new tick: the relay is alive (its disk state counts for a while)
            self._pushed[node] = (tick.seq, self.clock())
            if tick.disk is not None:
                self._disks[node] = tick.disk
            key = tick.key
            if key != st.base_gen:
                need_base.append(node)  # its rows are patched after its full records
                changed[node] = (key, tick.rows, None)
            else:  # the same patchers as after the full records below (not this node's)
                changed[node] = (key, [], patch_rows(st.patchers, tick.rows))
        out: list[JsonObject | HeartbeatRecord] = []
        health: dict[int, JsonObject] = {}
        bases = self._multi_get([self.keys.heartbeats(n) for n in need_base])
        for node, raw in zip(need_base, bases, strict=True):
            try:  # each node in isolation: one node's bad payload never stops the others
                snapshot = self._load_base(node, raw, out)
            except Exception as exc:
                self._bad(f"node {node}: records failed: {type(exc).__name__}: {exc}")
                continue
            if snapshot:
                health[node] = snapshot
        for node, (key, rows, built) in changed.items():
            st = self._state[node]
            if key != st.base_gen:
                continue  # full records newer than this tick: the next tick follows them
            self._take(node, patch_rows(st.patchers, rows) if built is None else built, out)
        return out, health

    def _to_read(self, now: float) -> tuple[list[int], int | None]:
        """The nodes whose tick this scan reads (see the class), and the early-push
        count when it moved (every node read)."""
        present = sorted(self._state)
        add = getattr(self.store, "add", None)
        if self._next_push_s is None or add is None:
            return present, None
        try:
            self.store_reads += 1
            early = int(add(self.keys.early_pushes, 0))
        except Exception as exc:  # every tick: an early push must not wait
            logger.warning("rankguard monitor: cannot read the relays' early pushes: %s", exc)
            return present, None
        if early != self._early_seen:
            return present, early
        state = self._state
        return [n for n in present if state[n].due <= now], None

    def _take(
        self,
        node: int,
        built: list[HeartbeatRecord | str],
        out: list[JsonObject | HeartbeatRecord],
    ) -> None:
        """The records built from node ``node``'s tick rows (:func:`.patch_rows`) that
        changed (a new process or ``seq``) into ``out``; a row that could not be used
        is counted."""
        current = self._current
        for rec in built:
            if isinstance(rec, str):
                self._bad(f"node {node}: {rec}")
                continue
            known = current.get(rec.rank)
            if known is None or known.seq != rec.seq or known.pid != rec.pid:
                current[rec.rank] = rec
                out.append(rec)

    def _load_base(
        self, node: int, raw: Any, out: list[JsonObject | HeartbeatRecord]
    ) -> JsonObject | None:
        """Node ``node``'s full records, used only when the whole payload parses; its
        records count only if they say they are of that node (``node_rank``)."""
        st = self._state[node]
        try:
            base = NodeBase.parse(raw)
        except PayloadError as exc:
            self._bad(f"node {node}: unusable records: {exc}")
            return None
        if base.key == st.base_gen:
            return None  # the records we have (a tick older than them was read)
        patchers: dict[int, RecordPatcher] = {}
        raw_records: list[JsonObject] = []
        typed: list[HeartbeatRecord] = []
        for item in base.records:
            try:
                rec = HeartbeatRecord.from_dict(item)
            except RecordError:
                raw_records.append(item)  # the monitor counts it
                continue
            if rec.node_rank != node:
                self._bad(f"node {node}: a record of node {rec.node_rank} under its key")
                continue
            patchers[rec.rank] = RecordPatcher(rec)
            typed.append(rec)
        st.base_gen = base.key
        st.patchers = patchers
        st.raw_records = raw_records
        out.extend(raw_records)
        for rec in typed:
            self._current[rec.rank] = rec
            out.append(rec)
        if base.root_cause is not None:
            self._root_causes[node] = base.root_cause
        if base.shutdown is not None:
            self._shutdowns[node] = base.shutdown
        if base.disk is not None and node not in self._disks:
            self._disks[node] = base.disk
        st.health = base.health
        return st.health

    def ignored(self) -> tuple[int, str | None]:
        return self.ignored_rows, self.last_ignored

    def _bad(self, why: str) -> None:
        self.ignored_rows += 1
        self.last_ignored = why
        if self.ignored_rows == 1 or self.ignored_rows % 1000 == 0:
            logger.warning(
                "rankguard monitor: relayed data skipped (%d so far): %s", self.ignored_rows, why
            )

    def _discover(self) -> None:
        """Nodes whose tick key appeared since the last call: ``check`` is true only
        when every key exists, so halve the missing ones (a few calls per new node)."""
        missing = [n for n in self.nodes if n not in self._state]
        if missing:
            for node in self._existing(missing):
                self._state[node] = _Node(self.keys.tick(node))

    def _existing(self, nodes: list[int]) -> list[int]:
        self.store_reads += 1
        if self.store.check([self.keys.tick(n) for n in nodes]):
            return nodes
        if len(nodes) == 1:
            return []
        mid = len(nodes) // 2
        return self._existing(nodes[:mid]) + self._existing(nodes[mid:])

    def _multi_get(self, keys: list[str]) -> list[bytes]:
        multi_get = getattr(self.store, "multi_get", None)
        out: list[bytes] = []
        for i in range(0, len(keys), MULTI_GET_KEYS):
            chunk = keys[i : i + MULTI_GET_KEYS]
            self.store_reads += 1 if multi_get is not None else len(chunk)
            if multi_get is not None:
                out.extend(multi_get(chunk))
            else:
                out.extend(self.store.get(k) for k in chunk)
        return [v if isinstance(v, bytes) else str(v).encode() for v in out]

    def note_round(self, nodes: int) -> None:
        """The current rendezvous round's node count (an elastic job's round may have
        fewer nodes than ``--nnodes`` allows); a new round has no lost node."""
        self._round_nodes = nodes
        self.lost.clear()

    def note_lost(self, node: int) -> None:
        """Node ``node`` was lost with its relay and live recovery gave its ranks to
        other nodes' standbys: lost, not late; :meth:`nodes_done` does not wait for it."""
        self.lost.add(node)

    def nodes_done(self) -> bool:
        """Every node that may still deliver records said it is done: the nodes of the
        current round and every node of an earlier round that relayed while its relay
        still pushes (its last records may be in flight). A node number past the round
        that never relayed anything (``--nnodes 1:2`` with one node) has nothing to
        deliver, nor has one whose relay went silent (``silent_s``: it left the job and
        never says it is done)."""
        round_nodes = self._round_nodes
        now = self.clock()
        waited = [
            n
            for n in self.nodes
            if (
                round_nodes is None
                or n < round_nodes
                or (n in self._state and not self._silent(n, now))
            )
            and n not in self.lost
        ]
        if not waited:
            return True
        try:
            return bool(self.store.check([self.keys.done(n) for n in waited]))
        except Exception:
            return True  # the store is gone: nothing more can arrive

    def _silent(self, node: int, now: float) -> bool:
        """Node ``node``'s relay pushed nothing new for ``silent_s`` (as fetched)."""
        pushed = self._pushed.get(node)
        return self.silent_s is not None and pushed is not None and now - pushed[1] > self.silent_s
