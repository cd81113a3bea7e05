"""A rank's saved re-run: what the job resumed after exit 16 needs to re-run the failed
iteration exactly (``rerun_state_rank_<r>.pt`` in the rerun ``state_dir``).

Plain data (``torch.load(weights_only=True)``): ``iteration``, ``rng`` (the snapshot),
``batches`` (one list per data iterator), ``results`` (the failed checks' first results),
``hardware`` (``hostname``, ``gpu`` of the first run) and ``injected`` (the injected
error type, if any). Written atomically: a torn file is never a state.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from rankguard.schema.layout import rerun_state_file_name

__all__ = ["load_state", "remove_state", "save_state", "state_path"]


def state_path(state_dir: Path | None, rank: int) -> Path | None:
    return None if state_dir is None else state_dir / rerun_state_file_name(rank)


def save_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_state(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def remove_state(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
