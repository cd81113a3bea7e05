"""Verdicts: which GPU readings make a GPU unhealthy, which only deserve a warning.

The rules follow what the field has learned about GPUs that kill training runs:

- **unhealthy** (the GPU will corrupt or lose work; move the job off it): uncorrected
  volatile ECC errors, a failed row remap (the spare rows of a bank are exhausted), a GPU
  recovery action other than ``none`` requested by the driver, a GPU the backend
  cannot even address (NVML "GPU is lost"), or a hardware XID error (``XID_HARDWARE``:
  ECC, page retirement, NVLink, fallen off the bus, GSP).
- **warning** (still usable, watch it): corrected ECC errors increasing since the first
  sample of that GPU (a corrected count that is merely non-zero may be years old), page
  retirement or row remapping pending (takes effect at the next GPU reset), thermal
  slowdown, an XID error the application can cause (an illegal address: XID 13, 31, 43).

Missing values (``None``) never trigger a rule. Each problem is a short
machine-readable string (``"ecc_uncorrected_volatile=3"``) that the monitor copies into
its findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from rankguard.health.schema import GpuHealth, NodeStatus
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "XID_HARDWARE",
    "apply_rules",
    "evaluate_gpu",
    "gpu_key",
    "node_status",
    "update_baseline",
]

#: XID errors that mean the GPU itself is at fault (NVIDIA's XID catalogue): double-bit
#: ECC (48), internal micro-controller (61, 62), page retirement / row remap events (63,
#: 64), NVLink (74), fallen off the bus (79), high single-bit ECC rate (92), contained and
#: uncontained ECC (94, 95), GSP errors (119, 120), unrecovered ECC (140). Other XIDs (13,
#: 31, 43: an illegal address, a killed context) are usually the application's.
XID_HARDWARE = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


def gpu_key(gpu: Mapping[str, Any]) -> str:
    """Stable identity of a GPU across samples: its UUID, else its index."""
    uuid = gpu.get("uuid")
    return str(uuid) if uuid else f"index:{gpu.get('index')}"


def evaluate_gpu(
    gpu: Mapping[str, Any], baseline_corrected: int | None = None
) -> tuple[GpuHealth, list[str]]:
    """Verdict and problems of one GPU entry (see the module docstring for the rules)."""
    unhealthy: list[str] = []
    warnings: list[str] = []
    if gpu.get("query_error"):
        unhealthy.append("gpu_query_failed")
    uncorrected = gpu.get("ecc_uncorrected_volatile")
    if uncorrected is not None and uncorrected > 0:
        unhealthy.append(f"ecc_uncorrected_volatile={uncorrected}")
    if gpu.get("remapped_rows_failure") is True:
        unhealthy.append("remapped_rows_failure")
    action = gpu.get("recovery_action")
    if action not in (None, "none"):
        unhealthy.append(f"recovery_action={action}")
    for xid in gpu.get("xid_errors") or ():
        (unhealthy if xid in XID_HARDWARE else warnings).append(f"xid={xid}")
    corrected = gpu.get("ecc_corrected_volatile")
    if corrected is not None and baseline_corrected is not None and corrected > baseline_corrected:
        warnings.append(f"ecc_corrected_volatile_increase={corrected - baseline_corrected}")
    for flag in ("retired_pages_pending", "remapped_rows_pending", "thermal_slowdown"):
        if gpu.get(flag) is True:
            warnings.append(flag)
    if unhealthy:
        return GpuHealth.UNHEALTHY, unhealthy + warnings
    if warnings:
        return GpuHealth.WARNING, warnings
    return GpuHealth.OK, []


def apply_rules(
    gpus: Iterable[Mapping[str, Any]], baseline: Mapping[str, int] | None = None
) -> list[JsonObject]:
    """Copies of ``gpus`` with ``health`` and ``problems`` added.

    ``baseline`` maps ``gpu_key`` to the corrected-ECC count of that GPU's first sample;
    without it the corrected-ECC rule cannot fire.
    """
    out: list[JsonObject] = []
    for gpu in gpus:
        reference = None if baseline is None else baseline.get(gpu_key(gpu))
        health, problems = evaluate_gpu(gpu, reference)
        out.append({**gpu, "health": health.value, "problems": [*problems]})
    return out


def update_baseline(baseline: MutableMapping[str, int], gpus: Iterable[Mapping[str, Any]]) -> None:
    """Record the first known corrected-ECC count of every GPU.

    Volatile counters restart at zero after a driver reload or GPU reset; a count below
    the baseline therefore lowers the baseline, so the next increase is still seen.
    """
    for gpu in gpus:
        corrected = gpu.get("ecc_corrected_volatile")
        if corrected is None:
            continue
        key = gpu_key(gpu)
        if key not in baseline or corrected < baseline[key]:
            baseline[key] = int(corrected)


def node_status(result_status: NodeStatus, gpus: Iterable[Mapping[str, Any]]) -> NodeStatus:
    """The node's status: the backend's ``unavailable``/``error``, else the worst GPU."""
    if result_status in (NodeStatus.UNAVAILABLE, NodeStatus.ERROR):
        return result_status
    worst = GpuHealth.OK
    for gpu in gpus:
        health = GpuHealth(gpu.get("health", GpuHealth.OK.value))
        if health.severity > worst.severity:
            worst = health
    return NodeStatus(worst.value)
