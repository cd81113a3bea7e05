"""Per-node GPU health collector: one snapshot file per node, refreshed in a thread.

The launcher of every node runs one ``HealthCollector``. It asks NVML first (in-process,
precise), falls back to ``nvidia-smi`` when NVML cannot be used, applies the rules and
atomically replaces ``<run_dir>/gpu_health_node_<node_rank>.json``. The job monitor reads
those files and maps each rank to its GPU with ``gpu_for_rank`` (by hostname, then by the
device token of ``CUDA_VISIBLE_DEVICES``), so a hang can be blamed on a sick GPU.

Collection never raises out of the thread: a failure becomes a snapshot with status
``error`` (and a log line), because a broken health probe must not take the job down.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankguard.health.config import HardwareHealthConfig
from rankguard.health.nvml import collect_nvml
from rankguard.health.rules import apply_rules, node_status, update_baseline
from rankguard.health.schema import SCHEMA_VERSION, CollectionResult, NodeStatus
from rankguard.health.smi import collect_smi
from rankguard.schema.coerce import as_list
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import health_file_name
from rankguard.util.fs import atomic_write_json

__all__ = ["HealthCollector", "collect_gpu_health", "gpu_for_rank", "health_file_name"]

logger = logging.getLogger(__name__)

_PREFER = ("auto", "nvml", "nvidia-smi")


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _snapshot(source: str, status: NodeStatus, error: str | None, gpus: list[Any]) -> JsonObject:
    return {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "status": status.value,
        "error": error,
        "hostname": socket.gethostname(),
        "collected_wall_time": _now_iso(),
        "gpus": gpus,
    }


def collect_gpu_health(
    *,
    command_timeout_s: float,
    baseline: Mapping[str, int] | None = None,
    prefer: str = "auto",
    xids: Mapping[int, list[int]] | None = None,
) -> JsonObject:
    """Collect one health snapshot of this node's GPUs.

    ``prefer``: ``auto`` (NVML, then nvidia-smi), ``nvml`` or ``nvidia-smi`` only.
    ``baseline``: corrected-ECC counts of the first sample per GPU (see
    ``rules.update_baseline``). ``error`` in the snapshot says why there is no (or only
    partial) data; it is ``None`` whenever ``status`` is a GPU verdict. ``xids``: the
    XID errors seen per NVML index (:class:`~rankguard.health.nvml.XidWatcher`), put in
    each GPU's ``xid_errors`` before the rules run.
    """
    if prefer not in _PREFER:
        raise ValueError(f"prefer: must be one of {', '.join(_PREFER)}, got {prefer!r}")
    if command_timeout_s <= 0:
        raise ValueError(f"command_timeout_s: must be > 0, got {command_timeout_s}")
    results: list[CollectionResult] = []
    if prefer in ("auto", "nvml"):
        results.append(collect_nvml())
    if prefer == "nvidia-smi" or (prefer == "auto" and results[-1].status is not NodeStatus.OK):
        results.append(collect_smi(command_timeout_s=command_timeout_s))
    chosen = next((r for r in results if r.status is NodeStatus.OK), None)
    if chosen is not None and xids is not None:
        for gpu in chosen.gpus:
            gpu["xid_errors"] = list(xids.get(gpu.get("index"), ()))  # type: ignore[arg-type]
    if chosen is not None:
        for other in results:
            if other.status is NodeStatus.ERROR:
                logger.warning("%s failed, used %s: %s", other.source, chosen.source, other.error)
        gpus = apply_rules(chosen.gpus, baseline)
        return _snapshot(chosen.source, node_status(chosen.status, gpus), None, gpus)
    failed = [r for r in results if r.status is NodeStatus.ERROR]
    reasons = "; ".join(f"{r.source}: {r.error}" for r in (failed or results))
    if failed:
        gpus = apply_rules(failed[-1].gpus, baseline)
        return _snapshot(failed[-1].source, NodeStatus.ERROR, reasons, gpus)
    return _snapshot("none", NodeStatus.UNAVAILABLE, reasons, [])


class HealthCollector:
    """Writes ``gpu_health_node_<node_rank>.json`` now and every ``cfg.interval_s``.

    Lifecycle: ``start()`` launches a daemon thread that collects at once, then every
    interval; ``stop()`` wakes it and joins it. ``collect_once()`` may also be called
    directly (tests, a pre-launch check). The corrected-ECC baseline is the first sample
    of each GPU seen by this collector.
    """

    def __init__(self, cfg: HardwareHealthConfig, run_dir: Path, node_rank: int) -> None:
        if node_rank < 0:
            raise ValueError(f"node_rank: must be >= 0, got {node_rank}")
        self._cfg = cfg
        self._node_rank = node_rank
        self._path = Path(run_dir) / health_file_name(node_rank)
        self._baseline: dict[str, int] = {}
        self._latest: JsonObject | None = None
        self._collect_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.collections = 0
        self.errors = 0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def latest(self) -> JsonObject | None:
        return self._latest

    def collect_once(self) -> JsonObject:
        """Collect, write the file atomically and return the snapshot."""
        with self._collect_lock:
            try:
                snap = collect_gpu_health(
                    command_timeout_s=self._cfg.command_timeout_s, baseline=self._baseline
                )
            except Exception as exc:
                logger.exception("node %d: GPU health collection failed", self._node_rank)
                error = f"{type(exc).__name__}: {exc}"
                snap = _snapshot("none", NodeStatus.ERROR, error, [])
            update_baseline(
                self._baseline, [g for g in as_list(snap["gpus"]) if isinstance(g, dict)]
            )
            snap["node_rank"] = self._node_rank
            self.collections += 1
            if snap["status"] == NodeStatus.ERROR.value:
                self.errors += 1
            self._latest = snap
            atomic_write_json(self._path, snap)
            return snap

    def start(self) -> None:
        """Start the collection thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"rankguard-gpu-health-node{self._node_rank}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            logger.warning(
                "node %d: GPU health thread still running after %.1f s (a slow nvidia-smi?)",
                self._node_rank,
                timeout,
            )
        else:
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.collect_once()
            except Exception:  # e.g. the run directory became unwritable
                self.errors += 1
                logger.exception("node %d: writing GPU health failed", self._node_rank)
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self._cfg.interval_s - elapsed))


def gpu_for_rank(
    snapshot: Mapping[str, Any] | None, hostname: str, token: str | None, ordinal: int | None
) -> JsonObject | None:
    """The GPU entry of ``snapshot`` used by a rank, or ``None`` when it cannot be told.

    Only a snapshot of the rank's own host counts. ``token`` is the rank's entry of
    ``CUDA_VISIBLE_DEVICES``: ``GPU-<uuid>``/``MIG-<uuid>`` (a unique prefix is enough,
    as for CUDA) is matched against the uuid, a number against the NVML index. Without a
    token, the visible ``ordinal`` is taken as the index. A numeric token or an ordinal
    equals the NVML index only when CUDA enumerates devices in PCI bus order
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID``); UUID tokens are always exact.
    """
    if not snapshot or snapshot.get("hostname") != hostname:
        return None
    gpus: list[JsonObject] = [g for g in snapshot.get("gpus") or [] if isinstance(g, dict)]
    tok = (token or "").strip()
    if tok.upper().startswith(("GPU-", "MIG-")):
        wanted = tok.lower()
        exact = [g for g in gpus if str(g.get("uuid") or "").lower() == wanted]
        if exact:
            return exact[0]
        prefixed = [g for g in gpus if str(g.get("uuid") or "").lower().startswith(wanted)]
        return prefixed[0] if len(prefixed) == 1 else None
    if tok.isdigit():
        index: int | None = int(tok)
    elif tok:
        return None
    else:
        index = ordinal
    if index is None:
        return None
    return next((g for g in gpus if g.get("index") == index), None)
