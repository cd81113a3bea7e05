"""The side services the launcher runs next to the workers of one node.

- GPU health collector (every node, when ``heartbeat.hardware_health.enabled``);
- job monitor (node 0) reading local files and, with several nodes, the relay keys;
- store relay (nodes > 0) pushing this node's heartbeats to node 0.

All run as daemon threads of the launcher process: they die with it (no orphan), never
touch the workers, and :meth:`NodeServices.stop` ends them in order whatever way the
training ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard.config import RankguardConfig, config_to_dict
from rankguard.heartbeat.monitor import JobMonitor
from rankguard.heartbeat.relay import StoreRelay, StoreRemoteSource

__all__ = ["NodeServices"]

logger = logging.getLogger(__name__)


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

    @property
    def relaying(self) -> bool:
        return self.nnodes > 1 and self.cfg.no_shared_fs and self.store is not None

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
            )
            if prometheus.enabled:  # before the first scan: no finding goes uncounted
                from rankguard.exporter import start_for_monitor

                self.exporter = start_for_monitor(self.monitor, prometheus, self.run_dir)
            self.monitor.start()
        elif self.relaying:
            self.relay = StoreRelay(
                self.store, self.run_dir, self.run_id, self.node_rank, hb.publish_interval_s
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
        if self.exporter is not None:  # after the final status: it stays scrapable
            self.exporter.stop()
        return status
