"""Memory now and peak, without touching the device queue.

GPU: the caching allocator's counters (host-side bookkeeping, no synchronisation).
CPU: the process's resident set size and its peak, both from one read of
``/proc/self/status`` (``VmRSS``, ``VmHWM``): the kernel computes the peak there as at
least the current size. ``getrusage``'s ``ru_maxrss`` is not used beside ``statm``: it
lags behind the resident size the kernel reports now, so a peak read from it was below
the current figure in most perf lines. Where ``/proc`` has no such lines (not Linux),
``getrusage`` gives the peak alone and the current size is unknown.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["cpu_memory_bytes", "memory_gb"]

_GB = 1e9


def cpu_memory_bytes(status_text: str | None = None) -> tuple[int | None, int]:
    """(resident now, resident peak) of this process in bytes, from one read of
    ``/proc/self/status`` (``status_text``: its text, for a test); peak >= now."""
    if status_text is None:
        try:
            with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
                status_text = fh.read()
        except OSError:
            status_text = ""
    values: dict[str, int] = {}
    for line in status_text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024  # the kernel says kB
    now, peak = values.get("VmRSS"), values.get("VmHWM")
    if peak is None:
        peak = _peak_rss_bytes()
    if now is not None:
        peak = max(peak, now)
    return now, peak


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_gb(cuda_device: int | None) -> tuple[float | None, float | None, str]:
    """(now, peak, kind) in GB; kind is ``cuda_allocated`` or ``cpu_rss``."""
    if cuda_device is not None:
        try:
            import torch  # here, not at the top: `import rankguard` stays torch-free

            if torch.cuda.is_initialized():
                now = torch.cuda.memory_allocated(cuda_device) / _GB
                peak = torch.cuda.max_memory_allocated(cuda_device) / _GB
                return now, peak, "cuda_allocated"
        except Exception:
            pass
    rss, peak = cpu_memory_bytes()
    return (None if rss is None else rss / _GB), peak / _GB, "cpu_rss"
