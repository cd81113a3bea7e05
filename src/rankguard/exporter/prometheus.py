"""Opt-in Prometheus endpoint for the job monitor (``perf.prometheus``, node 0).

The launcher calls :func:`start_for_monitor` next to the job monitor and
:meth:`MetricsExporter.stop` when the job ends. The endpoint serves ``/metrics`` from
its own ``CollectorRegistry`` (never the process-global one, so two monitors in one
process, or tests, cannot collide), through a collector that reads the monitor's status
at scrape time (:mod:`rankguard.exporter.collector`). It binds to loopback by default:
the metrics name hosts and ranks, and the endpoint has no authentication.

``prometheus-client`` is an optional dependency, imported only when the exporter is
enabled; a disabled exporter costs one ``if``. The bound address is written to
``<run_dir>/metrics_endpoint.json`` (atomically) so users and scripts find a port picked
with ``port: 0``; on stop the file stays, marked ``"active": false``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from rankguard.monitor.api import FindingSink
from rankguard.perf.config import PrometheusConfig
from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonInput
from rankguard.util.fs import atomic_write_json

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from rankguard.exporter.collector import FindingCounts
    from rankguard.monitor.monitor import JobMonitor

__all__ = ["ENDPOINT_FILE", "MetricsExporter", "start_for_monitor"]

logger = logging.getLogger(__name__)

ENDPOINT_FILE = "metrics_endpoint.json"
_INSTALL_HINT = "perf.prometheus.enabled needs prometheus-client: pip install prometheus-client"


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MetricsExporter:
    """Serves the monitor's state as Prometheus metrics; see the module docstring.

    Lifecycle: construct -> :meth:`start` (once) -> :meth:`stop` (idempotent). Findings
    are counted by a finding sink that :meth:`attach` adds to the monitor
    (:func:`start_for_monitor` does both).
    """

    def __init__(
        self,
        monitor: JobMonitor,
        *,
        run_dir: Path | None = None,
        rank_series: int | None = 64,
        all_rank_series: bool = False,
    ) -> None:
        """``rank_series``: per-rank series for at most this many ranks, the worst first
        (None: every rank in the monitor's status); ``all_rank_series``: every rank of
        the job, even those a large job's status does not list."""
        try:  # prometheus-client is optional: imported here and below, never at the top
            from prometheus_client import CollectorRegistry

            from rankguard.exporter.collector import FindingCounts, StatusCollector
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        self.monitor = monitor
        self.run_dir = Path(run_dir) if run_dir is not None else Path(monitor.run_dir)
        self.findings = FindingCounts()
        self.counter = _CountFindings(self.findings)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            StatusCollector(
                monitor, self.findings, rank_series=rank_series, all_ranks=all_rank_series
            )
        )
        self.host: str | None = None
        self.port: int | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._started_at: str | None = None

    # ---- findings -------------------------------------------------------------------

    def observe_finding(self, finding: JsonInput) -> None:
        """Count one finding (a line of ``findings.jsonl``)."""
        self.findings.observe(finding)

    def attach(self) -> None:
        """Count the monitor's findings from now on (idempotent)."""
        if self.counter not in self.monitor.sinks:
            self.monitor.add_sink(self.counter)

    def detach(self) -> None:
        """Stop counting findings (the counts are kept)."""
        self.monitor.remove_sink(self.counter)

    # ---- serving --------------------------------------------------------------------

    def render(self) -> bytes:
        """The ``/metrics`` body (Prometheus text format), without HTTP."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics`` while serving, else None."""
        if self.host is None or self.port is None or self._server is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self, host: str = "127.0.0.1", port: int = 9464) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); return the bound port.

        Raises ``OSError`` when the address cannot be bound (port in use).
        """
        from prometheus_client import start_http_server

        with self._lock:
            if self._server is not None:
                raise RuntimeError(f"exporter already serving at {self.url}")
            result = start_http_server(port, addr=host, registry=self.registry)
            if not isinstance(result, tuple):  # old prometheus-client returned None
                raise RuntimeError(
                    "prometheus-client >= 0.20 is required (start_http_server must return "
                    "the server so that the exporter can be stopped)"
                )
            server, thread = result
            self._server, self._thread = server, thread
            self.host = str(server.server_address[0])
            self.port = int(server.server_address[1])
            self._started_at = _iso_now()
            try:
                self._write_endpoint(active=True)
            except BaseException:
                self._shutdown()
                raise
            return self.port

    def stop(self) -> None:
        """Close the socket and join the server thread; idempotent."""
        with self._lock:
            if self._server is None:
                return
            self._shutdown()
            try:
                self._write_endpoint(active=False)
            except OSError as exc:
                logger.warning("rankguard metrics: cannot update %s: %s", ENDPOINT_FILE, exc)

    def _shutdown(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def _write_endpoint(self, *, active: bool) -> None:
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        atomic_write_json(
            self.run_dir / ENDPOINT_FILE,
            {
                "schema_version": 1,
                "run_id": self.monitor.run_id,
                "active": active,
                "host": self.host,
                "port": self.port,
                "url": f"http://{host}:{self.port}/metrics",
                "pid": os.getpid(),
                "started_wall_time": self._started_at,
                "stopped_wall_time": None if active else _iso_now(),
            },
        )

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_for_monitor(
    monitor: JobMonitor, cfg: PrometheusConfig, run_dir: Path
) -> MetricsExporter | None:
    """Start the exporter for ``monitor`` when ``cfg.enabled``; else do nothing.

    Registers the findings callback (call it before ``monitor.start()`` so no finding is
    missed; do not register ``observe_finding`` again). An address that cannot be bound
    (port in use) logs a warning and returns None: metrics must not stop a training job.
    A missing ``prometheus-client`` raises ``ImportError`` with the install command.
    """
    if not cfg.enabled:
        return None
    exporter = MetricsExporter(
        monitor,
        run_dir=run_dir,
        rank_series=cfg.rank_series,
        all_rank_series=cfg.all_rank_series,
    )
    exporter.attach()
    try:
        exporter.start(cfg.host, cfg.port)
    except OSError as exc:
        exporter.detach()
        logger.warning(
            "rankguard metrics: cannot serve on %s:%s (%s); perf.prometheus is NOT active",
            cfg.host,
            cfg.port,
            exc,
        )
        return None
    if not _is_loopback(cfg.host):
        logger.warning(
            "rankguard metrics: %s is reachable from other hosts and has no authentication",
            exporter.url,
        )
    logger.info("rankguard metrics: serving %s", exporter.url)
    return exporter


class _CountFindings(FindingSink):
    """The exporter's finding sink: one more in ``rankguard_findings_total``."""

    def __init__(self, counts: FindingCounts) -> None:
        self.counts = counts

    def after_write(self, finding: Finding) -> None:
        self.counts.observe(finding)
