"""The job monitor (node 0): tails every rank's heartbeat file, applies the rules,
writes ``findings.jsonl`` and ``status.json``.

One scan = discover files -> read new lines -> pull records relayed from other nodes
(mirrored into local files so node 0 holds every rank's history) -> note each node's disk
state -> mark this node's pids that vanished -> read GPU health files -> evaluate -> append
findings -> replace status.json.
A scan touches only files that grew (one ``stat`` each otherwise), so its cost is linear
in the number of ranks.

The monitor runs in a daemon thread of the launcher; it never signals or waits on a
training process, and every exception inside a scan is logged and counted, not raised.
A scan that fails as a whole (an exception in the scan, or escaping it into the thread)
is logged with its traceback, counted (``monitor.errors``, ``monitor.last_error``) and
written into ``status.json`` at once (``monitor.state: "failing"``); the thread goes on
scanning, backing off (up to :data:`MAX_BACKOFF_S`) while scans keep failing. Should the
thread itself end on an error, ``status.json`` says ``monitor.state: "stopped"``.

A write that fails (a full disk) loses nothing and stops nothing: the sinks act on a
finding whether or not its line could be appended; lines of ``findings.jsonl`` and
``perf_ranks.jsonl`` that could not be written wait in memory (bounded, counted) and are
written first at the next scan, in order; a ``status.json`` that could not be replaced
is counted and written again at the next scan. ``status.json``'s ``monitor`` block says
how many lines wait and the last write error; its ``disks`` block says, per node,
whether the disk of the run directory is full (:mod:`.disk`).
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from rankguard.monitor import status as status_rows
from rankguard.monitor.api import Evaluator, FindingSink, RemoteSource, StatusSource
from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.ingest import Ingest
from rankguard.monitor.lostnode import LostNode
from rankguard.monitor.perfranks import PerfRanks
from rankguard.monitor.rules import HeartbeatRules, Liveness, RankState
from rankguard.monitor.status import DETAIL_COLUMNS
from rankguard.schema.blocks import PerfBlock, read_block
from rankguard.schema.cadence import Cadence
from rankguard.schema.coerce import as_dict, as_list, as_str
from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import RunLayout
from rankguard.schema.records import SCHEMA_VERSION, HeartbeatRecord
from rankguard.schema.status import FINAL_STATES, MonitorInfo, NodeHealth, RankRow, StatusDoc
from rankguard.schema.statusblocks import block_json
from rankguard.util.fs import QueuedJsonl, append_bytes, atomic_write_json
from rankguard.util.procs import process_start_time
from rankguard.util.textsafe import safe_text

__all__ = [
    "DETAIL_COLUMNS",
    "Evaluator",
    "FindingSink",
    "JobMonitor",
    "RemoteSource",
    "StatusSource",
]

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0  # longest wait between scans while scans keep failing
EPISODE_FINDINGS = 16  # error findings kept for the launcher's root cause


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class JobMonitor:
    def __init__(
        self,
        cfg: HeartbeatConfig,
        run_dir: Path,
        run_id: str,
        *,
        expected_world_size: int | None = None,
        max_world_size: int | None = None,
        remote: RemoteSource | None = None,
        check_pids: bool = True,
        clock: Callable[[], float] = time.monotonic,
        config_snapshot: JsonObject | None = None,
        section_timeouts: dict[str, float] | None = None,
        out_of_section_timeout: float | None = None,
        cadence: Cadence | None = None,
        evaluators: Sequence[Evaluator] = (),
        sinks: Sequence[FindingSink] = (),
        status_sources: Sequence[StatusSource] = (),
    ) -> None:
        """``evaluators``, ``sinks`` and ``status_sources`` extend the monitor; more can
        be added with :meth:`add_evaluator`, :meth:`add_sink` and
        :meth:`add_status_source` before :meth:`start`. ``cadence``: the launcher's
        timeouts in force (:mod:`rankguard.schema.cadence`), instead of the section timeouts."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self.run_id = run_id
        self.remote = remote
        self.check_pids = check_pids
        self.clock = clock
        self.hostname = socket.gethostname()
        self._pid_start = process_start_time(os.getpid())
        self.rules = HeartbeatRules(
            cfg,
            run_id,
            expected_world_size=expected_world_size,
            max_world_size=max_world_size,
            started_at=clock(),
            section_timeouts=section_timeouts,
            out_of_section_timeout=out_of_section_timeout,
            cadence=cadence,
        )
        self.config_snapshot = config_snapshot
        self.scan_count = 0
        self.scan_errors = 0
        self.errors = 0  # scans that failed as a whole (status not built)
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self.state = "scanning"  # "failing" while scans fail; "stopped": the thread ended
        self.last_scan_s = 0.0
        self.last_scan_cpu_s = 0.0  # the scanning thread's CPU time of the last scan
        self.holds = 0  # times the scanning thread woke later than planned by > p
        self.held_s = 0.0  # the total of those delays (see _note_hold)
        self.last_status_write_s = 0.0
        self.status_bytes = 0
        self._detail_due = 0.0  # monitor time of the next status_ranks.json
        self._detail_written: str | None = None
        self._complete = True  # the last status listed every rank
        self._detail_thread: threading.Thread | None = None
        self.last_detail_write_s = 0.0
        self.sink_errors = 0
        self.write_errors = 0  # failed writes of mirrored records and health copies
        self.status_write_errors = 0
        self._status_unwritten = False  # the last status could not be written
        self.last_write_error: str | None = None
        self._findings_out = QueuedJsonl(self.layout.findings)
        self._perf_out = QueuedJsonl(self.layout.perf_ranks)
        self._evaluators: list[Evaluator] = []
        self._sinks: list[FindingSink] = list(sinks)
        self._reported: queue.SimpleQueue[Finding] = queue.SimpleQueue()  # report()
        self._report_lock = threading.Lock()
        self._report_closed = False  # stop() has taken the last ones
        self._status_sources: list[StatusSource] = list(status_sources)
        self.recent_findings: deque[JsonObject] = deque(maxlen=20)
        self._episode: list[JsonObject] = []  # error findings since the last restart
        self._episode_of = 0  # the rules' generation they belong to
        self.status: JsonObject = {}
        self.outcome: str | None = None  # the launcher's word on the end (note_end)
        self.ended = False  # stop() drained the ranks: the status is the final one
        self._run_over = False  # note_end(): the launcher's run is over
        self.ingest = Ingest(
            cfg,
            self.layout,
            self.rules,
            remote=remote,
            hostname=self.hostname,
            clock=clock,
            write_failed=self._write_failed,
        )
        for evaluator in evaluators:
            self.add_evaluator(evaluator)
        self.perf_ranks = PerfRanks(run_id)
        # rank -> its record and that record's perf block, parsed once per record
        self._perf_blocks: dict[int, tuple[HeartbeatRecord, PerfBlock | None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scan_lock = threading.Lock()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if expected_world_size and expected_world_size > cfg.status_rank_rows:
            _large_job_gc()

    # ---- extension points -----------------------------------------------------------

    def add_evaluator(self, evaluator: Evaluator) -> None:
        """An evaluator; one with an ``on_record(record)`` method is also given every
        record of the job as it is read (:class:`~rankguard.monitor.api.Evaluator`)."""
        self._evaluators.append(evaluator)
        on_record = getattr(evaluator, "on_record", None)
        if callable(on_record):
            self.rules.record_watchers.append(on_record)

    def add_sink(self, sink: FindingSink) -> None:
        self._sinks.append(sink)

    def remove_sink(self, sink: FindingSink) -> None:
        self._sinks = [s for s in self._sinks if s is not sink]

    @property
    def sinks(self) -> tuple[FindingSink, ...]:
        return tuple(self._sinks)

    def add_status_source(self, source: StatusSource) -> None:
        self._status_sources.append(source)

    def evaluator(self, name: str) -> Evaluator | None:
        return next((e for e in self._evaluators if e.name == name), None)

    # ---- lifecycle ------------------------------------------------------------------

    def start(self, *, thread: bool = True) -> None:
        """Start scanning. ``findings.jsonl`` exists from now on, empty until a first
        finding (tools tail it from the start of a run). ``thread`` False: no scanning
        thread, the owner calls :meth:`scan_once` (a test stepping the monitor)."""
        try:
            append_bytes(self.layout.findings, b"", fsync=False)
        except OSError as exc:  # a full disk: the first finding creates it
            self._write_failed(self.layout.findings, exc)
        if not thread:
            return
        self._thread = threading.Thread(target=self._loop, name="rankguard-monitor", daemon=True)
        self._thread.start()

    def note_restart(self, reason: str, *, cause_pending: bool = False) -> None:
        """See :meth:`HeartbeatRules.note_restart`."""
        self.rules.note_restart(reason, cause_pending=cause_pending, now=self.clock())

    def note_lost_node(self, lost: LostNode) -> None:
        """See :meth:`HeartbeatRules.note_lost_node` (between two scans)."""
        with self._scan_lock:
            self.rules.note_lost_node(lost)

    def episode_findings(self) -> list[JsonObject]:
        """The first findings of an error (not warnings) since the ranks' processes
        were last replaced (a restart that happened, not one only noted), in the order
        found (at most :data:`EPISODE_FINDINGS`): what the launcher's root cause agrees
        with."""
        if self._episode_of != self.rules.generation:
            return []
        return list(self._episode)

    def first_failed_rank(self) -> int | None:
        """The rank the monitor saw fail first in the failure under way (None: none)."""
        first = self.rules.first_failure
        return None if first is None else first[0]

    def retire_ranks(self, world: int) -> list[int]:
        """See :meth:`HeartbeatRules.retire_ranks` (between two scans)."""
        with self._scan_lock:
            return self.rules.retire_ranks(world, self.clock())

    def note_replaced(self, rank: int, pid: int) -> bool:
        """See :meth:`HeartbeatRules.note_replaced`."""
        with self._scan_lock:
            return self.rules.note_replaced(rank, pid)

    def note_root_cause(self, rank: int, pid: int | None) -> None:
        """See :meth:`HeartbeatRules.note_root_cause`."""
        self.rules.note_root_cause(rank, pid)

    def note_shutdown(self, reason: str) -> None:
        """See :meth:`HeartbeatRules.note_shutdown` (safe from a signal handler)."""
        self.rules.note_shutdown(reason)

    def note_end(self, outcome: str | None) -> None:
        """The launcher's run is over: :meth:`stop` writes the final status, in a final
        state (:data:`FINAL_STATES`). ``outcome``: the launcher's word on how it ended
        (``completed``, ``failed`` or ``stopped``; None: it has none), said where the
        ranks' own ends leave it open (a rank that never published, a kill by fault
        tolerance with no restart left). Without this note :meth:`stop` leaves the
        state as the ranks' ends make it (a monitor that moves to another node: the job
        goes on)."""
        if outcome is not None and outcome not in FINAL_STATES:
            raise ValueError(f"outcome {outcome!r}: one of {sorted(FINAL_STATES)}")
        self.outcome = outcome
        self._run_over = True

    def stop(self, drain_timeout_s: float = 0.0, write_wait_s: float = 5.0) -> JsonObject:
        """Stop scanning; first keep scanning up to ``drain_timeout_s`` until every rank
        has ended (and every relaying node said it is done), then, while findings or the
        status could not be written (a full disk), up to ``write_wait_s`` more. Returns
        the final status; after :meth:`note_end` in a final state
        (:data:`FINAL_STATES`), an end still held back waiting for its cause judged with
        what is known."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        deadline = self.clock() + drain_timeout_s
        while True:
            self.scan_once()
            if self._all_ended() or self.clock() >= deadline:
                break
            time.sleep(min(0.2, self.cfg.scan_interval_s))
        if self._run_over:
            with self._scan_lock:
                held = self.rules.end_run()
                self.ended = True
                if not held:  # the final state and notes: no new record to read
                    now = self.clock()
                    # the disks measured again: space may have come back since the
                    # last scan (the status a user reads says how the run left them)
                    self.ingest.check_disks(now)
                    self._write_status(now)
            if held:  # their ends are judged now
                self.scan_once()
        with self._report_lock:  # report() says False from now on: its caller writes
            self._report_closed = True
        if not self._reported.empty():  # reported during the last scan
            self.scan_once()
        if not (as_dict(self.status.get("rank_detail")) or {}).get("complete", True):
            self._detail_due = 0.0  # the final rows of every rank
            self._write_rank_detail(self.clock())
        self.wait_rank_detail()
        give_up = time.monotonic() + write_wait_s
        while self._unwritten() and time.monotonic() < give_up:
            time.sleep(0.5)
            self.scan_once()
        if self._unwritten():
            logger.error(
                "rankguard monitor: the job ended with %d finding(s) and %s unwritten "
                "(%s): they are lost",
                self._findings_out.unwritten,
                "the final status" if self._status_unwritten else "no status",
                self.last_write_error,
            )
        return self.status

    def _unwritten(self) -> bool:
        return bool(self._status_unwritten or self._findings_out.unwritten)

    def _all_ended(self) -> bool:
        world = self.rules.world_size()
        ended = all(
            (s := self.rules.ranks.get(r)) is not None
            and s.liveness is Liveness.EXITED
            and s.held_until is None  # a victim's end waits for its cause's
            for r in range(world)
        )
        return ended and (self.remote is None or self.remote.nodes_done())

    def _loop(self) -> None:
        try:
            self._scan_loop()
        except BaseException as exc:  # the thread ends: say so where people look
            self._scan_failed(exc, thread=True)
            self.state = "stopped"
            self._write_error_status()
            raise

    def _scan_loop(self) -> None:
        # Fixed rate: a slow scan does not push every later scan back by its duration.
        # A rank's timeout that runs out between two scans is scanned for when it does
        # (the rules know when), not up to one interval later.
        interval = self.cfg.scan_interval_s
        next_at = time.monotonic() + interval
        last, last_cpu = time.monotonic(), time.thread_time()
        while True:
            wait = max(0.0, self._wake_at(next_at) - time.monotonic())
            if self._stop.wait(wait):
                break
            now, cpu = time.monotonic(), time.thread_time()
            # since the last scan began: neither scanning (CPU) nor waiting as planned
            self._note_hold(now - last - (cpu - last_cpu) - wait, now)
            last, last_cpu = now, cpu
            try:
                self.scan_once()
            except Exception as exc:  # a bug escaping the scan's own guard
                self._scan_failed(exc, thread=True)
            if self.consecutive_errors:  # bounded back-off while scans keep failing
                wait = min(MAX_BACKOFF_S, interval * 2.0 ** min(self.consecutive_errors, 16))
                next_at = time.monotonic() + max(interval, wait)
            elif now >= next_at:
                next_at = max(next_at + interval, time.monotonic() + 0.1 * interval)

    def _note_hold(self, late: float, now: float) -> None:
        """Since the last scan began, the scanning thread spent ``late`` seconds neither
        on the CPU nor in its planned wait (woken late, or stuck inside the scan): longer
        than a publish interval, the monitor itself was held up (its process not
        scheduled, the host stalled, another thread holding the interpreter, a write
        blocked), and the ranks are not blamed for the time it did not watch
        (:meth:`HeartbeatRules.observer_held`, the hold placed just before ``now``). A
        scan that is long because it has much to do is no hold. Counted in the status
        (``holds``, ``held_s``); said on the console when longer than the process timeout
        (a rank silent that long would have been named)."""
        cadence = self.rules.cadence
        if self.clock is not time.monotonic or late <= cadence.publish_interval_s:
            return
        with self._scan_lock:
            self.rules.observer_held(now - late, now)
        self.holds += 1
        self.held_s += late
        if late > cadence.process_timeout_s:
            logger.warning(
                "rankguard monitor: held up for %.1fs (scan planned every %gs; %d such "
                "hold(s), %.1fs in all): the ranks' silence during it is not counted",
                late,
                self.cfg.scan_interval_s,
                self.holds,
                self.held_s,
            )

    def _wake_at(self, next_at: float) -> float:
        if self.clock is not time.monotonic or self.consecutive_errors:
            return next_at  # the rules' times are of another clock, or backing off
        due = self.rules.next_due()
        if due is None:
            return next_at
        # not sooner than a tenth of an interval after the last scan
        return min(next_at, max(due + 0.001, time.monotonic() + 0.1 * self.cfg.scan_interval_s))

    # ---- one scan -------------------------------------------------------------------

    def scan_once(self) -> list[Finding]:
        with self._scan_lock:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                findings = self._scan()
            except Exception as exc:
                self.scan_errors += 1
                self._scan_failed(exc)
                return []
            self.last_scan_s = time.perf_counter() - t0
            self.last_scan_cpu_s = time.thread_time() - c0
            if self.consecutive_errors:
                logger.warning(
                    "rankguard monitor: scanning again after %d failed scan(s)",
                    self.consecutive_errors,
                )
            self.consecutive_errors = 0
            self.state = "scanning"
            return findings

    def _scan_failed(self, exc: BaseException, *, thread: bool = False) -> None:
        """A whole scan failed: logged with its traceback (the first of a run of
        failures, then every 20th), counted, and said in ``status.json`` at once."""
        self.errors += 1
        self.consecutive_errors += 1
        where = "monitor thread" if thread else "scan"
        self.last_error = f"{_iso_now()} {where}: {type(exc).__name__}: {exc}"[:500]
        if self.state != "stopped":
            self.state = "failing"
        if self.consecutive_errors == 1 or self.consecutive_errors % 20 == 0:
            logger.error(
                "rankguard monitor: SCAN FAILED (%d in a row, %d in all); nothing is "
                "monitored until a scan succeeds again",
                self.consecutive_errors,
                self.errors,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self._write_error_status()

    def _write_error_status(self) -> None:
        """The last status with the monitor's error state, written at once."""
        try:
            status: JsonObject = dict(self.status) or {
                "schema_version": SCHEMA_VERSION,
                "run_id": self.run_id,
                "state": "starting",
            }
            monitor: JsonObject = dict(as_dict(status.get("monitor")) or {})
            status["updated_wall_time"] = _iso_now()
            status["monitor"] = {**monitor, **self._error_fields()}
            self.status = status
            atomic_write_json(self.layout.status, status, indent=None)
        except Exception as exc:  # nothing may escape the error path
            logger.error("rankguard monitor: cannot write the error status: %s", exc)

    def _error_fields(self) -> JsonObject:
        return {
            "state": self.state,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_error": self.last_error,
        }

    def _scan(self) -> list[Finding]:
        now = self.clock()
        # Lines a failed write left behind go first, before any new one.
        self._written(self._findings_out, self._findings_out.flush())
        self._written(self._perf_out, self._perf_out.flush())
        ingest = self.ingest
        if self.remote is not None:
            ingest.ingest_remote(now)
        ingest.check_disks(now)
        ingest.read_local_files(now)
        if self.check_pids:
            ingest.mark_vanished(now)
        ingest.read_health(now)
        ingest.note_stale_health(now)
        findings = self.rules.evaluate(now, ingest.health_for)
        for evaluator in self._evaluators:
            more = evaluator.evaluate(now, self.rules.ranks)
            self.rules.findings_total += len(more)
            findings += more
        while True:  # findings the launcher made (a node excluded): as the scan's own
            try:
                findings.append(self._reported.get_nowait())
            except queue.Empty:
                break
            self.rules.findings_total += 1
        if findings:
            self._emit(findings)
        try:  # after the findings were handled: bad perf data must not lose them
            self._cross_rank_perf()
        except Exception:
            self.scan_errors += 1
            logger.exception("rankguard monitor: cross-rank performance failed")
        self.scan_count += 1
        self._write_status(now)
        if not self._complete and now >= self._detail_due:
            self._write_rank_detail(now)
        return findings

    def _write_status(self, now: float) -> None:
        self.status = self._build_status(now)
        self._store_status()

    def _store_status(self) -> None:
        t0 = time.perf_counter()
        try:
            # Compact: at thousands of ranks indentation alone costs a third of a scan.
            atomic_write_json(self.layout.status, self.status, indent=None)
            self._status_unwritten = False
            self.status_bytes = os.stat(self.layout.status).st_size
        except OSError as exc:  # written again at the next scan
            self._status_unwritten = True
            self._write_failed(self.layout.status, exc, status=True)
        self.last_status_write_s = time.perf_counter() - t0

    def report(self, finding: Finding) -> bool:
        """A finding made outside the scan, by the launcher (bad-node exclusion's
        ``node_excluded``): any thread; the next scan writes it through the sinks and
        counts it with its own (``findings.jsonl``, the status, the end-of-run line).
        False once the monitor has stopped: the caller writes it itself."""
        with self._report_lock:
            if self._report_closed:
                return False
            self._reported.put(finding)
            return True

    def _written(self, out: QueuedJsonl, ok: bool) -> None:
        if not ok:
            self.last_write_error = out.last_error

    def _write_failed(self, path: Path, exc: OSError, *, status: bool = False) -> None:
        """A run file could not be written: counted, kept as the last write error."""
        if status:
            self.status_write_errors += 1
        else:
            self.write_errors += 1
        self.last_write_error = f"{path.name}: {exc}"
        failed = self.write_errors + self.status_write_errors
        if failed == 1 or failed % 100 == 0:
            logger.error(
                "rankguard monitor: cannot write %s (%d failed writes so far): %s",
                path,
                failed,
                exc,
            )

    def _emit(self, findings: list[Finding]) -> None:
        """Sinks complete each finding, it is appended to findings.jsonl (queued when
        that fails), then sinks act, whether or not it could be written yet."""
        stamp = _iso_now()
        for f in findings:
            f.detected_wall_time = stamp
            self._each_sink("before_write", f)
        lines = [f.to_dict() for f in findings]
        self._written(self._findings_out, self._findings_out.append(lines))
        self.recent_findings.extend(lines)
        if self._episode_of != self.rules.generation:  # the ranks restarted since
            self._episode_of, self._episode = self.rules.generation, []
        for f, line in zip(findings, lines, strict=True):
            if f.finding_type.info.severity == "error" and len(self._episode) < EPISODE_FINDINGS:
                self._episode.append(line)
        for f in findings:
            logger.warning("rankguard finding: %s", safe_text(f.message))
            self._each_sink("after_write", f)

    def _each_sink(self, step: str, finding: Finding) -> None:
        for sink in self._sinks:
            try:
                getattr(sink, step)(finding)
            except Exception:
                self.sink_errors += 1
                logger.exception("rankguard monitor: %s.%s failed", type(sink).__name__, step)

    def _cross_rank_perf(self) -> None:
        latest: dict[int, int] = {}
        for rank, state in self.rules.ranks.items():
            rec = state.record
            if rec is None or not rec.perf:
                continue
            seen = self._perf_blocks.get(rank)
            if seen is not None and seen[0] is rec:
                perf = seen[1]
            else:  # a new record: its windows parsed once, not at every scan
                perf = read_block(rec, PerfBlock)
                self._perf_blocks[rank] = (rec, perf)
            if perf is not None:
                latest[rank] = self.perf_ranks.add(rank, perf)
        if latest:
            world = self.rules.world_size()
            lines = self.perf_ranks.complete(world, latest if len(latest) >= world else {})
            if lines:
                self._written(self._perf_out, self._perf_out.append(lines))

    # ---- status ---------------------------------------------------------------------

    def _perf_status(self) -> JsonObject | None:
        latest = self.perf_ranks.latest
        if latest is None:
            return None
        return {
            "step": latest["step"],
            "iteration": latest["iteration"],
            "step_time_ms": latest["step_time_ms"],
            "slowest_rank": latest["slowest_rank"],
            "n_ranks": latest["n_ranks"],
        }

    def _build_status(self, now: float) -> JsonObject:
        return self.status_doc(now).to_dict()

    def status_doc(self, now: float) -> StatusDoc:
        """The status as of now (what the scan writes to ``status.json``)."""
        rules, cfg = self.rules, self.cfg
        rows, summary, detail = status_rows.counts(
            rules, cfg.status_rank_rows, cfg.status_worst_ranks
        )
        complete = self._complete = detail.complete
        if not complete:
            detail.file = self.layout.status_ranks.name
            detail.written_wall_time = self._detail_written
        health = {
            str(node): NodeHealth(
                status=as_str(snap.get("status")),
                source=as_str(snap.get("source")),
                hostname=as_str(snap.get("hostname")),
                age_s=_round(now - seen),
                gpus=len(as_list(snap.get("gpus"))),
            )
            for node, (snap, _, seen) in sorted(
                item
                for item in self.ingest.health.items()
                if complete or item[1][0].get("status") not in ("ok", "unavailable")
            )
        }
        disks = {  # a large job: only the nodes in trouble (thousands of nodes otherwise)
            str(node): disk.to_dict()
            for node, disk in sorted(
                item
                for item in self.ingest.disks.items()
                if complete or item[1].full or item[1].error
            )
        }
        return StatusDoc(
            run_id=self.run_id,
            updated_wall_time=_iso_now(),
            state=status_rows.job_state(
                rules,
                summary,
                status_rows.n_ranks(rules),
                ended=self.ended,
                outcome=self.outcome,
            ),
            monitor=self._monitor_info(),
            summary=summary,
            ranks=rows,
            rank_detail=detail,
            gpu_health=health,
            disks=disks,
            perf=self._perf_status(),
            stragglers=None,  # a stable key, filled by the straggler evaluator when on
            blocks={e.name: block_json(e.status()) for e in self._evaluators},
            recent_findings=list(self.recent_findings),
            fields=self._status_fields(),
        )

    def _monitor_info(self) -> MonitorInfo:
        rules = self.rules
        ignored, last_ignored = self._remote_ignored()
        return MonitorInfo(
            hostname=self.hostname,
            pid=os.getpid(),  # the launcher's: the monitor is its thread
            pid_start=self._pid_start,  # with the pid: is that launcher alive?
            scan_count=self.scan_count,
            scan_errors=self.scan_errors,
            state=self.state,
            errors=self.errors,
            consecutive_errors=self.consecutive_errors,
            last_error=self.last_error,
            last_scan_s=round(self.last_scan_s, 6),
            last_scan_cpu_s=round(self.last_scan_cpu_s, 6),
            last_status_write_s=round(self.last_status_write_s, 6),
            status_bytes=self.status_bytes,
            expected_world_size=rules.world_size(),
            ignored_records=rules.ignored_records + ignored,
            last_ignored=rules.last_ignored or last_ignored,
            rank_errors=rules.rank_errors,
            sink_errors=self.sink_errors,
            unwritten_findings=self._findings_out.unwritten,
            unwritten_perf_lines=self._perf_out.unwritten,
            dropped_lines=self._findings_out.dropped + self._perf_out.dropped,
            write_errors=self.write_errors + self._findings_out.errors + self._perf_out.errors,
            status_write_errors=self.status_write_errors,
            last_write_error=self.last_write_error,
            config=self.config_snapshot,
            holds=self.holds,
            held_s=round(self.held_s, 3),
        )

    def _remote_ignored(self) -> tuple[int, str | None]:
        if self.remote is None:
            return 0, None
        try:
            return self.remote.ignored()
        except Exception:
            return 0, None

    def rank_rows(self) -> list[RankRow]:
        """Every rank's status row now (all of them, whatever the job's size: slow at
        100,000 ranks, for a request, not for every scan)."""
        rules = self.rules
        return [
            status_rows.rank_row(rules.ranks.get(rank) or RankState(rank=rank))
            for rank in range(status_rows.n_ranks(rules))
        ]

    def worst_ranks(self, n: int) -> list[RankState]:
        """See :func:`rankguard.monitor.status.worst_ranks`."""
        return status_rows.worst_of(self.rules, n)

    def _write_rank_detail(self, now: float) -> None:
        """Every rank's row, compact (one list a rank, ``columns`` names them), for
        ``rankguard status --ranks`` and the report of a large job. The scan takes a
        snapshot (a tuple a rank); a thread formats and writes it (about a second at
        100,000 ranks, which must not hold up the next scan). At most one at a time."""
        self._detail_due = now + self.cfg.status_detail_interval_s
        if self._detail_thread is not None and self._detail_thread.is_alive():
            return
        self._detail_thread = threading.Thread(
            target=self._detail_to_file,
            args=(status_rows.detail_snapshot(self.rules), status_rows.n_ranks(self.rules)),
            name="rankguard-status-ranks",
            daemon=True,
        )
        self._detail_thread.start()

    def wait_rank_detail(self, timeout_s: float = 60.0) -> None:
        """Wait until ``status_ranks.json`` being written is written; ``status.json``
        then says so at once (``rank_detail.written_wall_time``), not at the next scan:
        the last status of a run, written before the last rows, names the file as it
        is left."""
        thread = self._detail_thread
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            return
        with self._scan_lock:
            detail = as_dict(self.status.get("rank_detail"))
            written = self._detail_written
            if (
                detail is None
                or detail.get("complete", True)
                or written is None
                or detail.get("written_wall_time") == written
            ):
                return
            self.status = {**self.status, "rank_detail": {**detail, "written_wall_time": written}}
            self._store_status()

    def _detail_to_file(self, snapshot: list[status_rows.DetailSnapshot], n_ranks: int) -> None:
        t0 = time.perf_counter()
        rows = status_rows.detail_rows(snapshot, n_ranks)
        stamp = _iso_now()
        detail = {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "updated_wall_time": stamp,
            "columns": list(DETAIL_COLUMNS),
            "rows": rows,
        }
        try:
            atomic_write_json(self.layout.status_ranks, detail, indent=None)
            self._detail_written = stamp
        except OSError as exc:
            self._write_failed(self.layout.status_ranks, exc)
        except Exception:
            logger.exception("rankguard monitor: cannot write %s", self.layout.status_ranks)
        self.last_detail_write_s = time.perf_counter() - t0

    def _status_fields(self) -> JsonObject:
        out: JsonObject = {}
        for source in self._status_sources:
            try:
                # a typed block (rankguard.schema.statusblocks) is written as its dict
                out.update({k: block_json(v) for k, v in source.status_fields().items()})
            except Exception:
                self.sink_errors += 1
                logger.exception("rankguard monitor: status source failed")
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


#: Young-generation threshold of the garbage collector for a large job's node 0.
LARGE_JOB_GC_THRESHOLD = (50_000, 20, 100)


def _large_job_gc() -> None:
    """A large job's monitor replaces ~20,000 records a second among the ~1 million
    objects it keeps: with the collector's default thresholds (700, 10, 10) its young
    collections take about a third of a scan's CPU at 100,000 ranks (bench/README.md).
    The launcher's process is rankguard's own; a threshold someone already changed is
    left as it is."""
    if gc.get_threshold() == (700, 10, 10):
        gc.set_threshold(*LARGE_JOB_GC_THRESHOLD)
        logger.info(
            "rankguard monitor: garbage collector thresholds %s (large job)",
            LARGE_JOB_GC_THRESHOLD,
        )
