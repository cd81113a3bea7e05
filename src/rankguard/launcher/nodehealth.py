"""The node health service (``node_health``): the node's NIC and storage checks before
each rendezvous round, and the watch over its workers' uninterruptible sleep.

- With ``fault_tolerance.exclude_bad_nodes``, before this node joins each rendezvous
  round (the first one included: bad-node exclusion asks before every round); without
  it, when the node's services start (the first round numbered it, before its workers
  start). The checks of :mod:`rankguard.health.node_checks` run; the result is written as
  ``node_health_node_<n>.json`` beside ``gpu_health_node_<n>.json``, and every failed
  check is a ``node_health_failure`` finding (once per failing target and problem).
- With ``fault_tolerance.exclude_bad_nodes``, a failure excludes the node through
  :class:`~rankguard.launcher.exclusion.NodeExclusion`, as a bad GPU does: it does not
  join the round (a failure found while a round runs: the next one), the host named in
  ``excluded_nodes.json`` and the scheduler's ``--exclude``.
- A thread looks at the workers' states every ``watch_interval_s``: one in ``D`` state
  past ``uninterruptible_timeout_s`` is a ``rank_uninterruptible_sleep`` finding
  (a process in that state cannot be killed until the kernel call it waits in returns:
  usually a storage or driver fault of the node), and with exclusion on the node leaves
  before the next round.

A node without the monitor writes its findings into its own run directory's
``findings.jsonl``; node 0 hands them to its monitor.
"""

from __future__ import annotations

import logging
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankguard.health.node_checks import (
    CheckResult,
    NodeHealthReport,
    UninterruptibleWatch,
    run_node_checks,
)
from rankguard.launcher.nodeservice import LaunchContext, NodeContext, NullService
from rankguard.monitor.api import StatusFields
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import FINDINGS_FILE, HEARTBEAT_FILE_RE, node_health_file_name
from rankguard.util.fs import append_jsonl, atomic_write_json

if TYPE_CHECKING:
    from rankguard.config import RankguardConfig

__all__ = ["NodeHealthService"]

logger = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _ranks_by_pid(run_dir: Path) -> dict[int, int]:
    """The ranks of this node's workers by pid, from their heartbeat files' names."""
    out: dict[int, int] = {}
    try:
        names = [p.name for p in run_dir.iterdir()]
    except OSError:
        return out
    for name in names:
        m = HEARTBEAT_FILE_RE.match(name)
        if m:
            out[int(m.group(2))] = int(m.group(1))
    return out


class NodeHealthService(NullService):
    """Every node, with ``node_health.enabled`` (see the module's docstring)."""

    name = "node_health"

    def __init__(self) -> None:
        self.node: NodeContext | None = None
        self.latest: NodeHealthReport | None = None
        self.reported: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._exclusion: Any = None
        self._launch: LaunchContext | None = None
        #: the checks run before the round now starting, not yet written (the node had
        #: no number yet)
        self._before_round: NodeHealthReport | None = None

    # ---- the checks ------------------------------------------------------------------

    @staticmethod
    def _directories(cfg: RankguardConfig) -> list[str]:
        dirs = [cfg.log_dir]
        if cfg.checkpoint.save:
            dirs.append(cfg.checkpoint.save)
        return dirs

    def _run_checks(self, cfg: RankguardConfig) -> NodeHealthReport | None:
        try:
            report = run_node_checks(cfg.node_health, self._directories(cfg))
        except Exception:
            logger.exception("rankguard: the node health checks failed to run")
            return None
        self.latest = report
        return report

    def check_now(self) -> NodeHealthReport | None:
        """Run the checks, write the file, report the failures; None without a node."""
        node = self.node
        if node is None:
            return None
        with self._lock:
            report, self._before_round = self._before_round, None
            if report is None:
                report = self._run_checks(node.cfg)
            if report is None:
                return None
            name = node_health_file_name(node.node_rank)
            try:
                atomic_write_json(node.run_dir / name, report.to_dict(node.node_rank))
            except OSError as exc:
                node.say(f"node health: cannot write {name}: {exc}")
            for failed in report.failed:
                self._report_check(node, failed)
        return report

    def attach(self, agent: Any, launch: LaunchContext) -> None:
        """With bad-node exclusion: the checks run before every round the node joins,
        the first one included (the node has no number yet: the file is written when
        its services start)."""
        exclusion = getattr(agent, "exclusion", None)
        if exclusion is not None and self._exclusion is None:
            self._exclusion, self._launch = exclusion, launch
            exclusion.add_check(self.before_round)

    def before_round(self) -> tuple[list[str], str] | None:
        """Bad-node exclusion's check before a round: fresh checks. Before the first
        round (no node number yet) the result is kept for the file the node's services
        write as they start; a failure is the exclusion's finding and line."""
        if self.node is not None:
            report = self.check_now()
        else:
            launch = self._launch
            if launch is None:
                return None
            with self._lock:
                report = self._run_checks(launch.cfg)
                self._before_round = report
        if report is None or report.healthy:
            return None
        problems = [f"{r.check} {r.target}: {r.problem}" for r in report.failed]
        return problems, f"failed its node health check before the round: {report.summary()}"

    def _report_check(self, node: NodeContext, result: CheckResult) -> None:
        key = (result.check, result.target, str(result.problem))
        if key in self.reported:
            return
        self.reported.add(key)
        node.say(f"node health: {result.check} {result.target}: {result.problem}")
        self._finding(
            node,
            FindingType.NODE_HEALTH_FAILURE,
            Reason.NODE_CHECK_FAILED,
            rank=-1,
            message=(f"node {node.node_rank}: {result.check} {result.target}: {result.problem}"),
            detail={"check": result.check, "target": result.target, **result.detail},
        )

    def _finding(
        self,
        node: NodeContext,
        finding_type: FindingType,
        reason: Reason,
        *,
        rank: int,
        message: str,
        detail: JsonObject,
        **fields: Any,
    ) -> None:
        finding = Finding.build(
            finding_type,
            reason,
            run_id=node.run_id,
            rank=rank,
            message=message,
            hostname=socket.gethostname(),
            node_rank=node.node_rank,
            detected_wall_time=_now(),
            detail=detail,
            **fields,
        )
        services = node.services
        if services is not None and services.report_finding(finding):
            return  # node 0's monitor writes it with its own
        try:
            append_jsonl(node.run_dir / FINDINGS_FILE, [finding.to_dict()])
        except OSError as exc:
            node.say(f"node health: cannot write the finding: {exc}")

    # ---- uninterruptible sleep --------------------------------------------------------

    def _watch(self, node: NodeContext) -> None:
        cfg = node.cfg.node_health
        watch = UninterruptibleWatch(cfg.procfs_root, cfg.uninterruptible_timeout_s)
        while not self._stop.wait(cfg.watch_interval_s):
            try:
                self._look(node, watch)
            except Exception:
                logger.exception("rankguard: looking at the workers' states failed")

    def _look(self, node: NodeContext, watch: UninterruptibleWatch) -> None:
        workers = getattr(node.services, "workers", None)
        pids_of = getattr(workers, "pids", None)
        pids = list(pids_of()) if callable(pids_of) else []
        stuck = watch.look(pids)
        if not stuck:
            return
        ranks = _ranks_by_pid(node.run_dir)
        for pid, seconds in stuck:
            rank = ranks.get(pid, -1)
            who = f"rank {rank} (pid {pid})" if rank >= 0 else f"worker pid {pid}"
            why = (
                f"{who} in uninterruptible sleep (D state) for {seconds:.0f} s "
                f"(node_health.uninterruptible_timeout_s={watch.timeout_s:g}): it cannot be "
                "killed until the kernel call it waits in returns (a storage or driver fault?)"
            )
            node.say(f"node health: {why}")
            self._finding(
                node,
                FindingType.UNINTERRUPTIBLE,
                Reason.UNINTERRUPTIBLE_SLEEP,
                rank=rank,
                message=f"node {node.node_rank}: {why}",
                detail={"state": "D"},
                pid=pid,
                timeout_s=watch.timeout_s,
                observed_s=round(seconds, 1),
            )
            if self._exclusion is not None:
                self._exclusion.exclude_next_round(
                    [f"uninterruptible_sleep pid={pid} s={seconds:.0f}"], why
                )

    # ---- the service's life -----------------------------------------------------------

    def start(self, node: NodeContext) -> None:
        self.node = node
        exclusion = getattr(node.agent, "exclusion", None)
        if exclusion is not None and self._exclusion is None:
            self._exclusion = exclusion
            exclusion.add_check(self.before_round)  # every later round, fresh
        report = self.check_now()  # the checks just run before this round, if any
        if report is not None:
            if report.healthy:
                node.say(f"node health: {report.summary()}")
            elif self._exclusion is not None:  # this round has begun: leave before the next
                problems = [f"{r.check} {r.target}: {r.problem}" for r in report.failed]
                self._exclusion.exclude_next_round(
                    problems, f"failed its node health check: {report.summary()}"
                )
        if node.cfg.node_health.uninterruptible_timeout_s > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._watch,
                args=(node,),
                name=f"rankguard-node-health-node{node.node_rank}",
                daemon=True,
            )
            self._thread.start()

    def move(self, node: NodeContext) -> None:
        self.node = node  # the watch goes on; the file takes the new number next time

    def leave(self) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5.0)

    def status_fields(self) -> StatusFields:
        report = self.latest
        if report is None:
            return {}
        return {
            "node_health": {
                "status": "ok" if report.healthy else "unhealthy",
                "checked_wall_time": report.checked_wall_time,
                "failed": [r.to_dict() for r in report.failed],
            }
        }
