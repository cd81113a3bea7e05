"""Exporters of the job monitor's state to other systems (Prometheus for now).

Importing this package does not import ``prometheus-client``: it is loaded only when an
exporter is built, so the launcher can call :func:`start_for_monitor` unconditionally
and a disabled exporter costs nothing.
"""

from __future__ import annotations

from rankguard.exporter.prometheus import ENDPOINT_FILE, MetricsExporter, start_for_monitor

__all__ = ["ENDPOINT_FILE", "MetricsExporter", "start_for_monitor"]
