"""The side services the launcher runs next to the workers of one node.

- GPU health collector (every node, when ``heartbeat.hardware_health.enabled``);
- job monitor (node 0) reading local files and, with several nodes, the relay keys;
- store relay (nodes > 0) pushing this node's heartbeats to node 0.

All run as daemon threads of the launcher process: they die with it (no orphan), never
touch the workers, and :meth:`NodeServices.stop` ends them in order whatever way the
training ended.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard._fs import append_jsonl
from rankguard.config import RankguardConfig, config_to_dict
from rankguard.heartbeat.monitor import JobMonitor
from rankguard.heartbeat.relay import StoreRelay, StoreRemoteSource

__all__ = ["NodeServices", "ft_state_path"]

logger = logging.getLogger(__name__)


def _iso_ms(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


def fastest_step_s(records: list[dict[str, Any]]) -> float | None:
    """The shortest recent step time any rank shows (the latest perf window, or the
    average since the first step), so a stop step is far enough ahead for all."""
    times = []
    for rec in records:
        perf = rec.get("perf")
        if isinstance(perf, dict) and isinstance(perf.get("step_time_ms"), (int, float)):
            times.append(float(perf["step_time_ms"]) / 1e3)
        seq, elapsed = rec.get("progress_seq"), rec.get("phase_elapsed_s")
        if rec.get("phase") == "train" and isinstance(seq, int) and seq > 0 and elapsed:
            times.append(float(elapsed) / seq)
    positive = [t for t in times if t > 0]
    return min(positive) if positive else None


def ft_state_path(cfg: RankguardConfig) -> Path:
    """Directory of ``ft_state.json``."""
    ft = cfg.fault_tolerance
    return Path(ft.state_dir) if ft.state_dir else Path(cfg.log_dir).resolve() / "ft"


@dataclass
class NodeServices:
    cfg: RankguardConfig
    run_dir: Path
    run_id: str
    node_rank: int
    nnodes: int
    expected_world_size: int | None
    store: Any = None  # a TCPStore client of the rendezvous store (several nodes)
    monitor: JobMonitor | None = None
    relay: StoreRelay | None = None
    collector: Any = None
    exporter: Any = None
    faults: Any = None  # FaultHandler on node 0 with fault tolerance on
    timeouts: dict[str, Any] | None = None  # timeouts in force and their sources
    stop_at: int | None = None  # the step every rank was asked to stop at
    restarts: list[dict[str, Any]] | None = None

    @property
    def relaying(self) -> bool:
        return self.nnodes > 1 and self.cfg.no_shared_fs and self.store is not None

    def attach_agent(self, agent: Any) -> None:
        """Node 0 with fault tolerance: act on findings through the agent."""
        ft = self.cfg.fault_tolerance
        if self.monitor is None or not ft.enable_ft_package:
            return
        from rankguard.ft.actions import FaultHandler

        remote = None
        if self.relaying:
            from rankguard.heartbeat.relay import request_kill

            def remote(node: int, targets: list[dict[str, Any]]) -> None:
                request_kill(self.store, self.run_id, node, targets)

        self.faults = FaultHandler(ft, self.run_dir, self.monitor, agent, remote_kill=remote)
        self.faults.attach()

    def _save_learned_timeouts(self) -> None:
        from rankguard.ft.learned import STATE_FILE, learn, load_state, measured_maxima

        assert self.monitor is not None
        ft = self.cfg.fault_tolerance
        records = [s.record for s in self.monitor.rules.ranks.values() if s.record]
        measured = measured_maxima(records)
        if not measured:
            logger.warning("rankguard: calc_ft_timeouts: nothing measured, ft_state unchanged")
            return
        path = ft_state_path(self.cfg) / STATE_FILE
        try:
            previous = load_state(path)
        except ValueError as exc:
            logger.warning("rankguard: %s; starting a new one", exc)
            previous = None
        state = learn(
            measured, previous, safety_factor=ft.safety_factor, floor_s=ft.min_learned_timeout_s
        )
        from rankguard.ft.learned import save_state

        save_state(path, state)
        logger.warning(
            "rankguard: learned timeouts saved in %s: %s", path, json.dumps(state["timeouts"])
        )

    def _stop_on_straggler(self, finding: dict[str, Any]) -> None:
        detector = self.monitor.straggler if self.monitor is not None else None
        if (
            finding.get("finding_type") != "straggler_detected"
            or detector is None
            or not detector.stop_requested  # stop_if_detected decides, in the detector
            or self.stop_at is not None
        ):
            return
        self.request_stop(f"straggler: {finding.get('message')}")

    def request_stop(self, reason: str) -> int:
        """Every rank stops at one step (see :mod:`rankguard.agree`)."""
        from rankguard.agree import choose_stop_step, write_control

        assert self.monitor is not None
        hb = self.cfg.heartbeat
        ranks = self.monitor.rules.ranks
        records = [s.record for s in ranks.values() if s.record]
        progress = {r: int((s.record or {}).get("progress_seq") or 0) for r, s in ranks.items()}
        lead = 2 * hb.publish_interval_s + 2 * hb.scan_interval_s + 1.0
        self.stop_at = choose_stop_step(progress, fastest_step_s(records), lead)
        write_control(self.run_dir, self.stop_at, reason)
        if self.relaying:
            from rankguard.heartbeat.relay import publish_control

            publish_control(self.store, self.run_id, self.stop_at, reason)
        self.monitor.extra_status["stop_requested"] = {
            "stop_at_step": self.stop_at,
            "reason": reason,
        }
        logger.warning("rankguard: all ranks stop at step %d: %s", self.stop_at, reason)
        return self.stop_at

    def on_restart(self, count: int, cause: dict[str, Any] | None) -> None:
        """The agent restarts the worker group: record it (restarts.jsonl, status)."""
        import time as _time

        cause = cause or {}
        entry = {
            "schema_version": 1,
            "run_id": self.run_id,
            "restart": count,
            "wall_time": _iso_ms(_time.time()),
            "cause": cause.get("finding_type"),
            "rank": cause.get("rank"),
            "reason": cause.get("reason"),
            "message": cause.get("message") or cause.get("error"),
            "exit_code": cause.get("exit_code"),
            "stack_dump": cause.get("stack_dump"),
        }
        if self.node_rank == 0:
            append_jsonl(self.run_dir / "restarts.jsonl", [entry])
        if self.restarts is None:
            self.restarts = []
        self.restarts.append(entry)
        if self.monitor is not None:
            self.monitor.extra_status["restarts"] = list(self.restarts)
            self.monitor.note_restart(f"restart {count}: {entry['cause']}")
        if self.faults is not None:
            self.faults.restarted()

    def start(self) -> None:
        hb = self.cfg.heartbeat
        prometheus = self.cfg.perf.prometheus
        if prometheus.enabled and self.node_rank == 0 and not hb.enabled:
            logger.warning(
                "rankguard: perf.prometheus.enabled=true has NO effect while "
                "heartbeat.enabled=false (the exporter serves the job monitor's state)"
            )
        if not hb.enabled:
            return
        if hb.hardware_health.enabled:
            from rankguard.health import HealthCollector

            self.collector = HealthCollector(hb.hardware_health, self.run_dir, self.node_rank)
            self.collector.start()
        if self.node_rank == 0:
            remote = (
                StoreRemoteSource(self.store, self.run_id, self.nnodes) if self.relaying else None
            )
            self.monitor = JobMonitor(
                hb,
                self.run_dir,
                self.run_id,
                expected_world_size=self.expected_world_size,
                remote=remote,
                config_snapshot=config_to_dict(self.cfg),
                section_timeouts=self.cfg.fault_tolerance.rank_section_timeouts,
                out_of_section_timeout=self.cfg.fault_tolerance.rank_out_of_section_timeout,
            )
            if self.timeouts:
                self.monitor.extra_status["timeouts"] = self.timeouts
            if self.cfg.straggler.enabled:
                from rankguard.straggler.detector import StragglerDetector

                self.monitor.straggler = StragglerDetector(
                    self.cfg.straggler, self.run_id, started_at=self.monitor.clock()
                )
                self.monitor.on_finding.append(self._stop_on_straggler)
            if prometheus.enabled:  # before the first scan: no finding goes uncounted
                from rankguard.exporter import start_for_monitor

                self.exporter = start_for_monitor(self.monitor, prometheus, self.run_dir)
            self.monitor.start()
        elif self.relaying:
            from rankguard.ft.kill import DumpPolicy

            self.relay = StoreRelay(
                self.store,
                self.run_dir,
                self.run_id,
                self.node_rank,
                hb.publish_interval_s,
                dump_policy=DumpPolicy.from_config(self.cfg.fault_tolerance),
            )
            self.relay.start()

    def note_shutdown(self, reason: str) -> None:
        """The launcher stops the workers (e.g. it received ``reason``, a signal name)."""
        if self.monitor is not None:
            self.monitor.note_shutdown(f"launcher received {reason}")

    def stop(self) -> dict[str, Any] | None:
        """Stop everything; on node 0 return the monitor's final status."""
        hb = self.cfg.heartbeat
        status = None
        if self.collector is not None:
            try:
                self.collector.stop()
            except Exception:
                logger.exception("rankguard: stopping the GPU health collector failed")
        if self.relay is not None:
            self.relay.stop()
        if self.monitor is not None:
            # Give the last records (and the other nodes' relays) time to arrive.
            drain = 2 * hb.publish_interval_s + hb.scan_interval_s
            if self.relaying:
                drain += 2 * hb.publish_interval_s
            status = self.monitor.stop(drain_timeout_s=drain)
            if self.cfg.fault_tolerance.calc_ft_timeouts:
                self._save_learned_timeouts()
        if self.exporter is not None:  # after the final status: it stays scrapable
            self.exporter.stop()
        return status
