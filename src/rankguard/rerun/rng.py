"""Snapshot and restore of every random generator an iteration may draw from: torch's
CPU generator, each CUDA device's (when CUDA is initialised), Python's ``random`` and
NumPy's global generator (when NumPy is imported), plus any generators the caller names.

A snapshot is plain data (tensors, tuples, lists), so it can ride in the rerun state
file (``torch.save`` / ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["RngSnapshot", "restore_rng", "snapshot_rng"]

RngSnapshot = dict[str, Any]


def snapshot_rng(generators: Sequence[torch.Generator] = (), *, host: bool = True) -> RngSnapshot:
    """The state of every generator now (host copies only: no device synchronisation).
    ``host``: Python's ``random`` and NumPy's too (the dearer part: tens of us)."""
    snap: RngSnapshot = {
        "torch": torch.get_rng_state(),
        "generators": [g.get_state() for g in generators],
    }
    if host:
        snap["python"] = random.getstate()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        snap["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy") if host else None
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        snap["numpy"] = [kind, torch.from_numpy(keys.copy()), pos, has_gauss, gauss]
    return snap


def restore_rng(snap: RngSnapshot, generators: Sequence[torch.Generator] = ()) -> None:
    """Put every generator back as ``snap`` found it."""
    torch.set_rng_state(snap["torch"])
    state = snap.get("python")
    if state is not None:
        random.setstate((state[0], tuple(state[1]), state[2]))
    saved = snap.get("generators") or []
    if len(saved) != len(generators):
        raise ValueError(
            f"rerun: {len(generators)} generator(s) to restore, the snapshot has {len(saved)}"
        )
    for gen, gstate in zip(generators, saved, strict=True):
        gen.set_state(gstate)
    if "cuda" in snap and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(snap["cuda"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in snap:
        kind, keys, pos, has_gauss, gauss = snap["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
