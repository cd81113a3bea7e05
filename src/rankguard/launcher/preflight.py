"""Pre-launch GPU health check (``enable_gpu_health_check``, FlagScale's switch).

Before any rank starts, the launcher reads this node's GPUs through NVML (nvidia-smi as
fallback) and applies the health rules of the heartbeat monitor: an unhealthy GPU
(uncorrected ECC errors, a row-remap failure, a pending recovery action) stops the
launch with exit code :data:`EXIT_UNHEALTHY_GPU` and says which GPU and why; warnings
are printed and the job starts; a machine without GPUs or NVML says ``unavailable`` and
goes on. The snapshot is kept as ``preflight_node_<n>.json`` in the run directory
(``preflight_<hostname>.json`` when ``--node-rank`` is not given: the check runs before
the rendezvous numbers the nodes).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from rankguard.health import collect_gpu_health
from rankguard.schema.coerce import as_list
from rankguard.schema.layout import preflight_file_name
from rankguard.util.fs import atomic_write_json

__all__ = ["EXIT_UNHEALTHY_GPU", "preflight_gpu_check"]

from rankguard.launcher.exitcodes import EXIT_UNHEALTHY_GPU
from rankguard.schema.jsontypes import JsonInput


def _describe(gpu: JsonInput) -> str:
    problems = ", ".join(str(p) for p in as_list(gpu.get("problems"))) or "no detail"
    return f"GPU {gpu.get('index')} ({gpu.get('name')}, {gpu.get('uuid')}): {problems}"


def _node(node_rank: int | None) -> str:
    return f"node {node_rank}" if node_rank is not None else f"host {socket.gethostname()}"


def preflight_gpu_check(
    *,
    command_timeout_s: float,
    node_rank: int | None,
    run_dir: Path,
    say: Callable[[str], None],
) -> int | None:
    """None to go on, or the exit code to stop with."""
    snapshot = collect_gpu_health(command_timeout_s=command_timeout_s)
    atomic_write_json(run_dir / preflight_file_name(node_rank, socket.gethostname()), snapshot)
    status = snapshot.get("status")
    gpus = [g for g in as_list(snapshot.get("gpus")) if isinstance(g, dict)]
    if status == "unavailable":
        say(f"GPU health check: unavailable ({snapshot.get('error') or 'no GPU'}); going on")
        return None
    if status == "error":
        say(f"GPU health check could NOT run ({snapshot.get('error')}); going on unchecked")
        return None
    bad = [g for g in gpus if g.get("health") == "unhealthy"]
    for gpu in gpus:
        if gpu.get("health") == "warning":
            say(f"GPU health check: warning: {_describe(gpu)}")
    if bad:
        for gpu in bad:
            say(f"GPU health check: UNHEALTHY: {_describe(gpu)}")
        say(
            f"refusing to launch on {_node(node_rank)}: {len(bad)} unhealthy GPU(s) "
            f"(enable_gpu_health_check=true); exit code {EXIT_UNHEALTHY_GPU}"
        )
        return EXIT_UNHEALTHY_GPU
    say(f"GPU health check: {len(gpus)} GPU(s) {status} via {snapshot.get('source')}")
    return None
