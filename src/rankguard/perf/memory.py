"""Memory now and peak, without touching the device queue.

GPU: the caching allocator's counters (host-side bookkeeping, no synchronisation).
CPU: the process's resident set size from ``/proc/self/statm`` and its peak from
``getrusage``.
"""

from __future__ import annotations

import os
import resource
import sys

__all__ = ["memory_gb"]

_GB = 1e9
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


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
    rss = _rss_bytes()
    return (None if rss is None else rss / _GB), _peak_rss_bytes() / _GB, "cpu_rss"
