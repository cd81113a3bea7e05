"""The side services the launcher runs next to the workers of one node.

The core, which every feature plugs into:

- job monitor (node 0) reading local files and, with several nodes, the relay keys,
  with the stop agreement (every rank stops at one step);
- store relay (nodes > 0) pushing this node's heartbeats to node 0.

Every feature (GPU health, stragglers, re-runs, in-process restarts, preemption,
checkpoints, learned timeouts, the metrics exporter) is a node service
(:mod:`.nodeservice`) of the registry in :mod:`.features`, called at each step of the
node's life; this module names none of them.

All run as daemon threads of the launcher process: they die with it (no orphan), never
touch the workers, and :meth:`NodeServices.stop` ends them in order whatever way the
training ended.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankguard.config import RankguardConfig, config_to_dict
from rankguard.ft.actions import LIVE_RECOVERY, AgentControl, FaultHandler, HangTraces
from rankguard.ft.frremote import TRACE_DUMP_S, RemoteTraces
from rankguard.ft.kill import DumpPolicy
from rankguard.goodput.status import GoodputStatus
from rankguard.inprocess.wrapper import RESTART_PHASE
from rankguard.launcher.console import live_recovery_line, restart_line
from rankguard.launcher.features import FACTORIES
from rankguard.launcher.nodeservice import NodeContext, NodeService, build_services
from rankguard.monitor.agree import StopAgreement, finished_before_stop
from rankguard.monitor.api import StatusFields
from rankguard.monitor.monitor import JobMonitor
from rankguard.monitor.rules import peer_failure
from rankguard.relay.relay import StoreRelay, StoreRemoteSource, publish_control, request_kill
from rankguard.schema.cadence import Cadence
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import RunLayout, StoreKeys, ft_state_dir
from rankguard.schema.restarts import LostRank, RestartCause, RestartEntry, RestartsBlock
from rankguard.schema.statusblocks import TimeoutsBlock, block_json
from rankguard.util.fs import QueuedJsonl

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from rankguard.ft.kill import WorkerRegistry
    from rankguard.launcher.exitcodes import JobOutcome
    from rankguard.launcher.live import LiveRecovery
    from rankguard.monitor.rules import RankState

__all__ = ["NodeServices", "ft_state_path", "node_cadence"]

logger = logging.getLogger(__name__)


def _iso_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


def ft_state_path(cfg: RankguardConfig) -> Path:
    """Directory of ``ft_state.json``."""
    return ft_state_dir(cfg.log_dir, cfg.fault_tolerance.state_dir)


def node_cadence(cfg: RankguardConfig, sources: Mapping[str, str] | None = None) -> Cadence:
    """The job's cadence and timeouts in force (:mod:`rankguard.schema.cadence`) from the
    validated configuration: NVRx's section timeouts, and the in-process restart's phase,
    which a rank re-entering in-process has until ``hard_timeout`` (then it exits).
    ``sources``: where the timeouts that were not configured came from (learned ones)."""
    ft = cfg.fault_tolerance
    shown: dict[str, str] = {}
    if RESTART_PHASE not in ft.rank_section_timeouts:
        shown[f"section.{RESTART_PHASE}"] = "config (inprocess_restart.hard_timeout)"
    for nvrx, key in (
        ("initial_rank_heartbeat_timeout", "initial_process_timeout_s"),
        ("rank_heartbeat_timeout", "process_timeout_s"),
    ):
        if getattr(ft, nvrx) is not None:  # NVRx's name set the heartbeat timeout
            shown[f"heartbeat.{key}"] = f"config (fault_tolerance.{nvrx})"
    shown.update(sources or {})
    return Cadence.of(
        cfg.heartbeat,
        sections={RESTART_PHASE: cfg.inprocess_restart.hard_timeout, **ft.rank_section_timeouts},
        out_of_section_s=ft.rank_out_of_section_timeout,
        sources=shown,
    )


@dataclass
class NodeServices:
    """The services of one node, started by :meth:`start`, ended by :meth:`stop`.

    It is also the monitor's status source for what the launcher knows (``timeouts``
    in force, ``restarts``) and what its features' services add."""

    cfg: RankguardConfig
    run_dir: Path
    run_id: str
    node_rank: int | None  # None until the first rendezvous round numbers this node
    nnodes: int
    expected_world_size: int | None
    max_world_size: int | None = None  # the most ranks the rendezvous allows
    store: Any = None  # a TCPStore client of the rendezvous store (several nodes)
    # the intervals and the timeouts in force (default, None: the configuration's)
    cadence: Cadence = None  # type: ignore[assignment]
    # the agent's current workers: the only processes the fault handler or the relay
    # may signal (set before start; without it the relay kills nothing)
    workers: WorkerRegistry | None = None
    agent: AgentControl | None = None  # the agent, set before start (for the services)
    say: Callable[[str], None] = lambda line: None  # the launcher's console line
    round_tag: str | None = None  # the current rendezvous round (launcher.rendezvous)
    round_nodes: int | None = None  # its node count
    #: the features' services the launch built (default, None: built from the registry)
    features: Sequence[NodeService] | None = None
    live: LiveRecovery | None = None  # this node's standbys (--standby-ranks)
    # node 0's monitor scans on its own thread; False: the owner calls its scan_once
    # (a test stepping the monitor by hand)
    scan_thread: bool = True
    status_errors: dict[str, int] = field(default_factory=dict, init=False)  # per block
    monitor: JobMonitor | None = field(default=None, init=False)
    relay: StoreRelay | None = field(default=None, init=False)
    faults: FaultHandler | None = field(default=None, init=False)  # node 0, fault tolerance
    agreement: StopAgreement | None = field(default=None, init=False)  # node 0
    restarts: list[RestartEntry] = field(default_factory=list, init=False)
    #: the features' services (:mod:`.features`), a null one for each feature that is off
    services: list[NodeService] = field(default_factory=list, init=False)
    _stop_votes: list[Callable[[], bool]] = field(default_factory=list, init=False, repr=False)
    _restarts_out: QueuedJsonl | None = field(default=None, init=False, repr=False)
    _remote: StoreRemoteSource | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.cadence is None:
            self.cadence = node_cadence(self.cfg)
        if self.features is None:
            self.services = build_services(self.cfg, FACTORIES)
        else:
            self.services = list(self.features)

    def service(self, name: str) -> NodeService:
        """The feature's service named ``name`` (a null one when the feature is off)."""
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def note_round(self, nodes: int) -> None:
        """A rendezvous round's node count: kept for the ``elastic`` block, and told to
        node 0's relayed source (its final drain waits for the round's nodes only)."""
        self.round_nodes = nodes
        if self._remote is not None:
            self._remote.note_round(nodes)

    def note_node_lost(self, node: int) -> None:
        """Live recovery gave lost node ``node``'s ranks to other nodes' standbys: its
        relay will never say it is done (node 0's final drain does not wait for it)."""
        if self._remote is not None:
            self._remote.note_lost(node)

    @property
    def restarts_file(self) -> QueuedJsonl:
        """``restarts.jsonl``: lines a failed write left are retried at each scan."""
        if self._restarts_out is None:
            self._restarts_out = QueuedJsonl(RunLayout(self.run_dir).restarts)
        return self._restarts_out

    @property
    def relaying(self) -> bool:
        return self.nnodes > 1 and self.cfg.no_shared_fs and self.store is not None

    def rank_states(self) -> Mapping[int, RankState]:
        """Node 0: the monitor's latest state of every rank (empty without one)."""
        return self.monitor.rules.ranks if self.monitor is not None else {}

    @property
    def stop_at(self) -> int | None:
        """The step every rank was asked to stop at, if any."""
        return self.agreement.stop_at if self.agreement is not None else None

    def finished_before_stop(self) -> bool:
        """After :meth:`stop`: every rank whose end this node knows (node 0: every rank
        of the job; another node: its own, from its relay) finished training and
        exited 0 on its own, not at a stop request: a stop step agreed after the signal
        or a straggler came too late, the job completed."""
        if self.monitor is not None:
            states = self.monitor.rules.ranks
            records = [s.record for s in states.values() if s.record is not None]
            return finished_before_stop(records, len(states))
        if self.relay is not None:
            return finished_before_stop(self.relay.latest_records())
        return False

    def status_fields(self) -> JsonObject:
        """Called by the monitor at each scan (each source's blocks in turn); also
        retries unwritten restart lines."""
        out: JsonObject = {}
        # each source alone: one that raises (a store entry anyone can write) is counted
        # and said, the others stay in status.json
        for name, source in self._status_sources():
            try:
                # a typed block (rankguard.schema.statusblocks) is written as its dict
                out.update({k: block_json(v) for k, v in source().items()})
            except Exception:
                self.status_errors[name] = self.status_errors.get(name, 0) + 1
                log = logger.exception if self.status_errors[name] == 1 else logger.debug
                log("rankguard: the %s block of status.json failed", name)
        if self.status_errors:
            out["status_errors"] = dict(self.status_errors)
        return out

    def _status_sources(self) -> list[tuple[str, Callable[[], StatusFields]]]:
        """What :meth:`status_fields` merges, in ``status.json``'s order, by name."""
        return [
            ("unwritten_restarts", self._unwritten_fields),
            ("timeouts", self._timeout_fields),
            ("restarts", self._restart_fields),
            ("live", self._live_fields),
            *((service.name, service.status_fields) for service in self.services),
        ]

    def _unwritten_fields(self) -> StatusFields:
        if self._restarts_out is None or self._restarts_out.flush():
            return {}
        return {
            "unwritten_restarts": self._restarts_out.unwritten,
            "restarts_write_error": self._restarts_out.last_error,
        }

    def _timeout_fields(self) -> StatusFields:
        return {TimeoutsBlock.name: TimeoutsBlock.from_dict(self.cadence.in_force())}

    def _restart_fields(self) -> StatusFields:
        return {RestartsBlock.name: RestartsBlock(tuple(self.restarts))} if self.restarts else {}

    def _live_fields(self) -> StatusFields:
        return {} if self.live is None else {"live": self.live.status()}

    def move(self, node_rank: int) -> None:
        """A new rendezvous round renumbered this node: its services stop and start
        again as node ``node_rank`` (the new round's node 0 runs the monitor). The
        monitor of a node that is no longer node 0 writes its last status first."""
        if self.monitor is not None:  # not ``monitor_done``: the job's monitor goes on
            self.monitor.stop(drain_timeout_s=0.0, write_wait_s=1.0)
        if self.relay is not None:
            try:
                self.relay.stop()
            except Exception:
                logger.exception("rankguard: stopping %s before the move failed", self.relay)
        self.monitor = self.relay = None
        self.faults = self.agreement = None
        self.node_rank = node_rank
        self._start(moved=True)

    def regrouped(self) -> None:
        """A new rendezvous round formed and this node kept its number (its services go
        on): each service is told (a node that did not come back is named by the
        elastic service)."""
        if self.node_rank is None:
            return
        node = self._node()
        for service in self.services:
            service.regrouped(node)

    def last_push(self) -> None:
        """This node is about to leave the job (excluded), still in the rendezvous: its
        node number is its own until it leaves. Its relay pushes once more and stops:
        what its ranks wrote since the last push reaches node 0 (a crashed rank's
        ``process_end``: node 0 names that exit, not the silence after it). A rank
        forked by ``--preload``'s fork server leaves through ``os._exit``, with no
        interpreter teardown after that record: the agent's poll sees the end and the
        exclusion is decided before the relay's next push, which :meth:`leave`'s halt
        then lost. After this, no push (:meth:`leave`, :meth:`stop`), no ``done``
        mark."""
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.halt()
            relay.push_now()

    def leave(self) -> None:
        """This node was excluded from the job (its launcher may stay a while, holding
        the rendezvous store or node 0's monitor): its relay stops at once, without a
        last push now or at :meth:`stop`, since the new round may have given its node
        number to another agent (:meth:`StoreRelay.halt`). Node 0's monitor, if it runs
        here, goes on."""
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.halt()
        for service in self.services:
            service.leave()

    def attach_agent(self, agent: AgentControl) -> None:
        """Node 0 with fault tolerance: act on findings through the agent (without: a
        hang's finding still gets the flight-recorder verdict)."""
        ft = self.cfg.fault_tolerance
        if self.monitor is None:
            return
        if not ft.enable_ft_package:  # no action, but a hang still gets its verdict
            if not any(isinstance(s, HangTraces) for s in self.monitor.sinks):
                traces = HangTraces(self.run_dir, self.monitor, remote=self._remote_traces())
                if self.relaying:  # another node's ranks dump into that node's run dir
                    host = traces.hostname
                    traces.here = lambda rec: (rec.node_rank or 0) == 0 and rec.hostname == host
                self.monitor.add_sink(traces)
            return
        remote = None
        if self.relaying:

            def remote(node: int, targets: list[JsonObject]) -> None:
                request_kill(self.store, self.run_id, node, targets)

        self.faults = FaultHandler(
            ft,
            self.run_dir,
            self.monitor,
            agent,
            remote_kill=remote,
            remote_traces=self._remote_traces(),
            workers=self.workers,
            replaced_live=self._replaced_live,
        )
        self.monitor.add_sink(self.faults)

    def _replaced_live(self, rank: int) -> bool:
        """A standby of this node would take ``rank``'s place (:mod:`.live`)."""
        live = self.live
        return live is not None and live.would_replace(rank)

    def _remote_traces(self) -> RemoteTraces | None:
        """Node 0 of several: the other nodes' flight-recorder traces on a hang, through
        their relays (each looks once per push interval; its ranks have
        ``TRACE_DUMP_S`` to dump)."""
        if not self.relaying:
            return None
        wait_s = TRACE_DUMP_S + 2 * self.cadence.publish_interval_s + 1.0
        return RemoteTraces(self.store, self.run_id, timeout_s=wait_s)

    def report_finding(self, finding: Finding) -> bool:
        """Hand a launcher's finding to node 0's monitor (written and counted with the
        scan's own); False on a node without one (the caller writes it itself)."""
        monitor = self.monitor
        return monitor is not None and monitor.report(finding)

    def request_stop(self, reason: str, lead_s: float | None = None) -> int | None:
        """Every rank stops at one step (see :mod:`rankguard.monitor.agree`); None without a
        monitor (only node 0 with heartbeat monitoring can agree on a step)."""
        if self.agreement is None:
            return None
        return self.agreement.request_stop(reason, lead_s)

    def on_restart(self, count: int, cause: RestartCause | None) -> None:
        """The agent restarts the worker group: record it (restarts.jsonl, status)."""
        cause = cause or RestartCause()
        reason, message = cause.reason, cause.message or cause.error
        cause_pending = False  # the monitor may yet hear of the rank that failed first
        if (
            cause.finding_type == FindingType.WORKER_FAILED.value
            and not cause.signal
            and peer_failure(cause.error)
        ):
            # this node's rank failed because its peer went away (a lost node): the
            # cause is elsewhere; name the rank the monitor saw fail first, if any
            first = self.monitor.first_failed_rank() if self.monitor is not None else None
            reason = "peer_failure"
            culprit = (
                f"rank {first} failed first, as the monitor saw"
                if first is not None and first != cause.rank
                else "the root cause is on another rank"
            )
            message = f"its peer went away ({culprit}): {message}"
            cause_pending = first is None
        entry = RestartEntry(
            kind="process",
            run_id=self.run_id,
            restart=count,
            wall_time=_iso_ms(time.time()),
            cause=cause.finding_type,
            rank=cause.rank,
            reason=reason,
            message=message,
            exit_code=cause.exit_code,
            stack_dump=cause.stack_dump,
            extra=dict(cause.decision),
        )
        if self.node_rank == 0:  # a failed write is kept and retried: never raised here
            self.restarts_file.append([entry.to_dict()])
        self.restarts.append(entry)
        print(f"[rankguard] {restart_line(entry)}", file=sys.stderr, flush=True)
        if self.monitor is not None:
            self.monitor.note_restart(
                f"restart {count}: {entry.cause}", cause_pending=cause_pending
            )
        if self.faults is not None:
            self.faults.restarted()

    def on_inprocess_restart(self, entry: RestartEntry) -> None:
        """The ranks re-entered their training function (seen in their heartbeats):
        a ``restarts.jsonl`` line of kind ``inprocess``; the processes were not restarted."""
        entry = entry.stamped(_iso_ms(time.time()))
        self.restarts_file.append([entry.to_dict()])
        self.restarts.append(entry)

    def on_live_recovery(self, entry: RestartEntry) -> None:
        """A standby took a lost rank's place (:mod:`.live`): a ``restarts.jsonl`` line
        of kind ``live_recovery`` with its cost, and a console line."""
        entry = entry.stamped(_iso_ms(time.time()))
        if self.node_rank == 0:  # a failed write is kept and retried: never raised here
            self.restarts_file.append([entry.to_dict()])
        self.restarts.append(entry)
        print(f"[rankguard] {live_recovery_line(entry)}", file=sys.stderr, flush=True)

    def on_rank_lost(self, lost: LostRank) -> None:
        """Live recovery: a rank's process ended and a standby takes its place. The
        monitor would not see that end (the rank's new pid replaces the old one before
        its scan): its ``rank_process_exited`` finding is written here, once. Fault
        tolerance acts on the next fault again: a finding of the monitor's own for this
        exit (a scan that saw it first) made it wait for a group restart that live
        recovery does not do (a hang after it was left alone: 'a restart is already
        under way'). A process fault tolerance killed (a hang) gets no second finding:
        the one that caused the kill names the rank."""
        killed = self.faults is not None and self.faults.killed(lost.rank, lost.pid)
        if self.faults is not None:
            self.faults.restarted()
        monitor, rank, pid = self.monitor, lost.rank, lost.pid
        if monitor is None or not monitor.note_replaced(rank, pid) or killed:
            return
        reason = Reason(lost.reason)
        host = lost.hostname or socket.gethostname()
        taken, took = (  # standby_pid 0: no standby was left, the job shrank without it
            (
                f"standby pid {lost.standby_pid} takes its place",
                f"standby pid {lost.standby_pid} took rank {rank}",
            )
            if lost.standby_pid > 0
            else ("no standby left: the job goes on without it", f"rank {rank} dropped (shrink)")
        )
        monitor.report(
            Finding.build(
                FindingType.PROCESS_EXITED,
                reason,
                run_id=self.run_id,
                rank=rank,
                message=f"rank {rank} (pid {pid} on {host}): process ended "
                f"({lost.exit}) without a clean end; {taken} (live recovery)",
                pid=pid,
                hostname=host,
                node_rank=lost.node,
                exit={"vanished": reason is Reason.DIED, "how": lost.exit},
                action=f"live recovery: {took}",
                detail={LIVE_RECOVERY: {"standby_pid": lost.standby_pid}},
            )
        )

    def on_group_failure(self, root: RestartCause) -> None:
        """The agent saw this node's worker group fail; ``root`` is its root cause (exit
        codes and error files: a rank killed by a signal before its peers' errors)."""
        if self.faults is not None:
            self.faults.group_failed()  # the restart under way is real
        rank, pid = root.rank, root.pid
        if rank is None or not root.signal:
            # Only a signal is news to the monitor (it sees a killed rank vanish, like
            # its peers); an error exit it orders better itself, with every node's view.
            return
        if self.monitor is not None:
            self.monitor.note_root_cause(rank, pid)
        if self.relay is not None:  # node 0 sees this node's exits, not their exit codes
            self.relay.note_root_cause(rank, pid)

    def _publish_stop(self, stop_at: int, reason: str) -> None:
        if self.relaying:
            publish_control(self.store, self.run_id, stop_at, reason)

    def _node(self) -> NodeContext:
        assert self.node_rank is not None
        return NodeContext(
            cfg=self.cfg,
            cadence=self.cadence,
            run_dir=self.run_dir,
            run_id=self.run_id,
            node_rank=self.node_rank,
            nnodes=self.nnodes,
            store=self.store,
            relaying=self.relaying,
            monitor=self.monitor,
            stop_votes=self._stop_votes,
            agent=self.agent,
            say=self.say,
            services=self,
        )

    def start(self) -> None:
        """Start this node's services (once the rendezvous told :attr:`node_rank`)."""
        self._start(moved=False)

    def _start(self, *, moved: bool) -> None:
        hb = self.cfg.heartbeat
        if self.node_rank is None:
            raise RuntimeError("the node's services start once the rendezvous numbered it")
        self._stop_votes.clear()
        if hb.enabled and self.node_rank == 0:
            self._build_monitor()
        node = self._node()
        for service in self.services:  # node 0: before the monitor's first scan
            if moved:
                service.move(node)
            else:
                service.start(node)
        if self.monitor is not None:
            self.monitor.start(thread=self.scan_thread)
            self._say_monitor_started()
        elif hb.enabled and self.relaying:
            self.relay = StoreRelay(
                self.store,
                self.run_dir,
                self.run_id,
                self.node_rank,
                self.cadence.publish_interval_s,
                dump_policy=DumpPolicy.from_config(self.cfg.fault_tolerance),
                workers=self.workers,
            )
            self.relay.start()

    def _build_monitor(self) -> None:
        """Node 0: the job monitor (not scanning yet) and the stop agreement."""
        hb = self.cfg.heartbeat
        remote = (
            StoreRemoteSource(
                self.store,
                self.run_id,
                self.nnodes,
                disk_max_age_s=self.cadence.process_timeout_s,
                silent_s=self.cadence.process_timeout_s,  # a relay that stopped: left
                push_interval_s=self.cadence.publish_interval_s,  # ticks read when due
            )
            if self.relaying
            else None
        )
        if remote is not None and self.round_nodes is not None:
            remote.note_round(self.round_nodes)
        self._remote = remote
        monitor = self.monitor = JobMonitor(
            hb,
            self.run_dir,
            self.run_id,
            expected_world_size=self.expected_world_size,
            max_world_size=self.max_world_size,
            remote=remote,
            config_snapshot=config_to_dict(self.cfg),
            cadence=self.cadence,
            status_sources=[self],
        )
        votes = self._stop_votes
        self.agreement = StopAgreement(
            self.run_dir,
            monitor.rules.cadence,
            lambda: monitor.rules.ranks,
            publish=self._publish_stop,
            stop_on_straggler=lambda: any(vote() for vote in votes),
        )
        monitor.add_sink(self.agreement)
        monitor.add_status_source(self.agreement)
        # the goodput ledger, final in the monitor's last status
        monitor.add_status_source(GoodputStatus(self.run_dir, ended=lambda: monitor.ended))

    def _say_monitor_started(self) -> None:
        if self.store is None or not self.relaying:
            return
        try:
            self.store.set(StoreKeys(self.run_id).monitor_started, b"1")
        except Exception as exc:  # the store host is gone already: nobody waits
            logger.debug("rankguard: cannot mark the monitor started: %s", exc)

    def monitor_ever_started(self) -> bool:
        """Whether a node 0 of this job ever started its monitor (the store says); True
        when the store cannot be asked (then the caller waits, as before)."""
        if self.store is None:
            return False
        try:
            return bool(self.store.check([StoreKeys(self.run_id).monitor_started]))
        except Exception:
            return True

    def _say_monitor_done(self) -> None:
        if self.store is None:
            return
        try:
            self.store.set(StoreKeys(self.run_id).monitor_done, b"1")
        except Exception as exc:  # the store host is gone already: nobody waits
            logger.debug("rankguard: cannot mark the monitor done: %s", exc)

    def wait_for_monitor(self, timeout_s: float) -> bool:
        """This node hosts the rendezvous store but is not node 0: keep the store until
        node 0's monitor has drained the relays (or ``timeout_s``). True if it said so."""
        if self.store is None:
            return True
        key = StoreKeys(self.run_id).monitor_done
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.store.check([key]):
                    return True
            except Exception as exc:
                logger.warning("rankguard: cannot ask the store about node 0's monitor: %s", exc)
                return False
            time.sleep(0.1)
        return False

    def note_shutdown(self, reason: str) -> None:
        """The launcher stops the workers (e.g. it received ``reason``, a signal name)."""
        if self.monitor is not None:
            self.monitor.note_shutdown(f"launcher received {reason}")
        if self.relay is not None:
            self.relay.note_shutdown(reason)

    def stop(self) -> JsonObject | None:
        """Stop everything; on node 0 return the monitor's final status."""
        status = None
        for service in self.services:
            service.stop()
        if self.relay is not None:
            self.relay.stop()
        if self.monitor is not None:
            # Give the last records (and the other nodes' relays) time to arrive.
            status = self.monitor.stop(drain_timeout_s=self.cadence.drain_s(self.relaying))
            self._say_monitor_done()
        if self.node_rank is not None:
            node = self._node()
            for service in self.services:  # after the final status
                service.finish(node)
        return status

    def outcome(self, outcome: JobOutcome) -> JobOutcome:
        """The job's outcome as the services amend it (a preemption marks it)."""
        for service in self.services:
            outcome = service.outcome(outcome)
        return outcome
