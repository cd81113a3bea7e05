"""Per-node GPU hardware health: NVML first, nvidia-smi as fallback, rules, a collector.

The third of the three facts kept about every rank (liveness, progress, hardware): what
the driver says about the GPU a rank runs on. See ``docs/heartbeat.md`` for the file
``gpu_health_node_<node_rank>.json`` this package writes.
"""

from __future__ import annotations

from rankguard.health.collector import (
    HealthCollector,
    collect_gpu_health,
    gpu_for_rank,
    health_file_name,
)
from rankguard.health.nvml import collect_nvml
from rankguard.health.rules import apply_rules, evaluate_gpu, gpu_key, node_status
from rankguard.health.schema import (
    GPU_FIELDS,
    SCHEMA_VERSION,
    CollectionResult,
    GpuHealth,
    NodeStatus,
)
from rankguard.health.smi import collect_smi, parse_csv

__all__ = [
    "GPU_FIELDS",
    "SCHEMA_VERSION",
    "CollectionResult",
    "GpuHealth",
    "HealthCollector",
    "NodeStatus",
    "apply_rules",
    "collect_gpu_health",
    "collect_nvml",
    "collect_smi",
    "evaluate_gpu",
    "gpu_for_rank",
    "gpu_key",
    "health_file_name",
    "node_status",
    "parse_csv",
]
