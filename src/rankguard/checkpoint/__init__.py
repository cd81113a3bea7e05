"""rankguard's checkpoint layer, on torch.distributed.checkpoint (DCP).

::

    from rankguard.checkpoint import CheckpointConfig, CheckpointManager, RNGState

    cfg = CheckpointConfig(save="ckpt", save_interval=100, async_save=True)
    ckpt = CheckpointManager(cfg, {"model": model, "optim": opt, "rng": RNGState()})
    start = (ckpt.load_latest() or 0) + 1          # newest complete, verified checkpoint
    for step in range(start, steps + 1):
        ...
        ckpt.maybe_save(step)                      # blocks only for the host copy
    ckpt.close()                                   # waits for the last write

Every recovery path (in-job restart, preemption, rerun, in-process restart) ends in
``load_latest()``. See docs/checkpointing.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankguard.checkpoint.config import CheckpointConfig
from rankguard.checkpoint.files import CheckpointError

if TYPE_CHECKING:
    from rankguard.checkpoint.manager import TIERS, CheckpointManager
    from rankguard.checkpoint.state import DataPosition, PerRank, RNGState

__all__ = [
    "TIERS",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointManager",
    "DataPosition",
    "PerRank",
    "RNGState",
]


_LAZY = {
    "TIERS": "rankguard.checkpoint.manager",
    "CheckpointManager": "rankguard.checkpoint.manager",
    "DataPosition": "rankguard.checkpoint.state",
    "PerRank": "rankguard.checkpoint.state",
    "RNGState": "rankguard.checkpoint.state",
}


def __getattr__(name: str) -> Any:
    """The torch-backed names load on first use: the config (read by the launcher and the
    light commands) must not import torch."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rankguard.checkpoint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
