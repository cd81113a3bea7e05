"""A clean hand-over between two worker groups on a node.

When the agent restarts its workers, torch elastic stops the old ones (SIGTERM, then
SIGKILL after the grace period) and starts new ones at once. A killed process can linger
for a while (a zombie not yet reaped, a process stuck in the driver on its way out) and,
on a GPU, the driver releases its memory only once the process is really gone: new
workers started then fail with an out-of-memory error that has nothing to do with them.

:func:`wait_for_handover` waits, bounded, until every old worker pid is gone and no GPU
on the node still has memory held by one of them (NVML's per-process compute list),
as NVRx's launcher does. Without NVML (no GPU, no driver) only the processes are waited
for. Past the bound it says which pids still run or hold how much memory, and the
restart goes on: the new workers may then fail, which the launcher reports as usual.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rankguard.util.procs import pid_running

__all__ = ["HandoverResult", "gpu_memory_by_pid", "wait_for_handover"]

logger = logging.getLogger(__name__)
_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")


@dataclass(frozen=True, slots=True)
class HandoverResult:
    ok: bool  # every old pid gone and no GPU memory held by one
    waited_s: float
    running: tuple[int, ...] = ()  # old pids still running at the end
    gpu_bytes: dict[int, int] = field(default_factory=dict)  # old pid -> bytes still held

    def describe(self) -> str:
        parts = []
        if self.running:
            parts.append(f"pids {', '.join(map(str, self.running))} still running")
        if self.gpu_bytes:
            held = ", ".join(f"{p}: {b / 2**20:.0f} MiB" for p, b in sorted(self.gpu_bytes.items()))
            parts.append(f"GPU memory still held ({held})")
        return "; ".join(parts) or "clean"


def gpu_memory_by_pid(nvml: Any = None) -> dict[int, int] | None:
    """Bytes of GPU memory each process holds on this node's GPUs (NVML's compute and
    graphics process lists, summed over GPUs); None when NVML cannot tell."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        out: dict[int, int] = {}
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            for name in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ):
                fn = getattr(nvml, name, None)
                if fn is None:
                    continue
                try:
                    procs = fn(handle)
                except Exception:
                    continue
                for proc in procs or ():
                    used = getattr(proc, "usedGpuMemory", None)
                    pid = int(getattr(proc, "pid", -1))
                    # None: the driver does not say (MIG, no permission): held, size unknown
                    out[pid] = out.get(pid, 0) + (int(used) if isinstance(used, int) else 0)
        return out
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def wait_for_handover(
    pids: Iterable[int],
    *,
    timeout_s: float,
    poll_s: float = 0.1,
    running: Callable[[int], bool] = pid_running,
    gpu_memory: Callable[[], dict[int, int] | None] = gpu_memory_by_pid,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HandoverResult:
    """Wait until every pid in ``pids`` is gone and holds no GPU memory, at most
    ``timeout_s`` seconds."""
    old = {int(p) for p in pids if int(p) > 0}
    start = clock()
    use_gpu = True
    while True:
        alive = tuple(sorted(p for p in old if running(p)))
        held: dict[int, int] = {}
        if use_gpu:
            memory = gpu_memory()
            if memory is None:
                use_gpu = False  # no NVML on this node: processes only
            else:
                held = {p: memory[p] for p in old if p in memory}
        waited = clock() - start
        if not alive and not held:
            return HandoverResult(True, waited)
        if waited >= timeout_s:
            result = HandoverResult(False, waited, alive, held)
            logger.warning(
                "rankguard: the old workers are not all gone after %.1fs (%s): the new "
                "workers start anyway and may fail (out of GPU memory)",
                waited,
                result.describe(),
            )
            return result
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
