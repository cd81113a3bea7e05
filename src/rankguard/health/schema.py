"""Shared vocabulary of the GPU health collector: field names, verdicts, raw results.

NVML and nvidia-smi report the same facts in different shapes (bytes vs MiB, bit masks vs
"Active", exceptions vs "[N/A]"). Both backends normalise into one flat per-GPU dict with
exactly ``GPU_FIELDS`` as keys, so the rules and every reader of
``gpu_health_node_<n>.json`` see one schema whatever the source. A value a backend cannot
obtain is ``None``; it never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "GPU_FIELDS",
    "SCHEMA_VERSION",
    "CollectionResult",
    "GpuHealth",
    "NodeStatus",
    "empty_gpu",
]

SCHEMA_VERSION = 1

#: Keys of every per-GPU entry, in file order. ``query_error`` is set when the backend
#: could not even address the GPU (e.g. NVML "GPU is lost"); the rules treat it as fatal.
#: ``xid_errors``: the critical XID errors NVML reported for the GPU since the launcher
#: started watching (:class:`~rankguard.health.nvml.XidWatcher`; ``None``: not watched).
GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "pci_bus_id",
    "name",
    "driver_version",
    "temperature_c",
    "utilization_gpu_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_draw_w",
    "power_limit_w",
    "thermal_slowdown",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "recovery_action",
    "query_error",
    "xid_errors",
)


class GpuHealth(str, Enum):
    """Verdict for one GPU; ordered from best to worst (see ``severity``)."""

    OK = "ok"
    WARNING = "warning"
    UNHEALTHY = "unhealthy"

    @property
    def severity(self) -> int:
        return _SEVERITY[self.value]


class NodeStatus(str, Enum):
    """Status of one node's snapshot.

    ``ok``/``warning``/``unhealthy``: the worst GPU verdict. ``unavailable``: no GPU, no
    NVML and no nvidia-smi (a CPU node; not an error). ``error``: collection was attempted
    and failed (timeout, non-zero exit, unexpected exception); ``error`` in the snapshot
    says why.
    """

    OK = "ok"
    WARNING = "warning"
    UNHEALTHY = "unhealthy"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


_SEVERITY = {"ok": 0, "warning": 1, "unhealthy": 2}


@dataclass(slots=True)
class CollectionResult:
    """What one backend returned, before the rules are applied.

    ``status`` is ``NodeStatus.OK`` (data collected), ``UNAVAILABLE`` (backend absent on
    this node) or ``ERROR`` (backend present but failed; ``gpus`` may hold partial data).
    """

    source: str
    status: NodeStatus
    gpus: list[JsonObject] = field(default_factory=list)
    error: str | None = None

    def __post_init__(self) -> None:
        assert self.status in (NodeStatus.OK, NodeStatus.UNAVAILABLE, NodeStatus.ERROR), (
            f"backend result status must be ok/unavailable/error, got {self.status}"
        )


def empty_gpu(index: int | None = None) -> JsonObject:
    """A per-GPU entry with every field present and unknown."""
    gpu: JsonObject = dict.fromkeys(GPU_FIELDS)
    gpu["index"] = index
    return gpu
