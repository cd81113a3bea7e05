"""What both checkpoint tiers share around torch.distributed.checkpoint (DCP): its lazy
import, its errors in one line, and the in-place copy of a loaded state into the live one.

DCP is imported at the first save or load that needs it (:func:`dcp`): a rank that never
checkpoints does not pay for its import (DTensor, sympy: about as long as torch's).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rankguard.checkpoint.files import CheckpointError
from rankguard.checkpoint.group import CheckpointGroup
from rankguard.checkpoint.stager import dtensor_type

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemWriter

__all__ = [
    "checkpoint_exception",
    "copy_into",
    "dcp",
    "default_writer",
    "describe",
    "iso_now",
    "localize",
    "save_errors",
    "single_process_quiet",
]


def dcp() -> Any:
    """``torch.distributed.checkpoint``, imported at the first save or load that needs it."""
    import torch.distributed.checkpoint as dcp

    return dcp


def checkpoint_exception() -> type[BaseException]:
    """DCP's ``CheckpointException`` (a ``BaseException``: caught by name)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def save_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises (gathered: every rank decides the same)."""
    return (Exception, checkpoint_exception())


def default_writer(path: Path) -> FileSystemWriter:
    return dcp().FileSystemWriter(path, sync_files=True)


def iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def single_process_quiet(group: CheckpointGroup) -> Iterator[None]:
    """DCP warns on every single-process call that it assumes one process: it is meant."""
    if group.distributed:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def describe(exc: BaseException) -> str:
    """One line for an error; DCP's CheckpointException carries each rank's failure."""
    if isinstance(exc, checkpoint_exception()):
        parts = []
        failures: dict[int, Any] = getattr(exc, "failures", {})
        for rank, item in sorted(failures.items()):
            failure: Any = item[0] if isinstance(item, tuple) and item else item
            text = describe(failure) if isinstance(failure, BaseException) else str(failure)
            parts.append(f"DCP rank {rank}: {text}")
        return "; ".join(parts)
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({cause})"
    return text if len(text) < 2000 else text[:1997] + "..."


def localize(obj: Any) -> Any:
    """DTensors -> their local shard (a local checkpoint is per rank)."""
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(obj, dtensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: localize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [localize(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(localize(v) for v in obj)
    return obj


def copy_into(current: Any, loaded: Any, key: str) -> Any:
    """Load ``loaded`` into the live ``current`` structure in place (tensors copied into
    the existing ones); a shape or structure that does not fit raises, naming the key."""
    dtensor = dtensor_type()
    where = key.lstrip(".") or "<root>"
    if isinstance(current, torch.Tensor):
        target = (
            current.to_local() if dtensor is not None and isinstance(current, dtensor) else current
        )
        if not isinstance(loaded, torch.Tensor):
            raise CheckpointError(f"{where}: the checkpoint has no tensor there")
        if target.shape != loaded.shape:
            raise CheckpointError(
                f"{where}: shape {tuple(loaded.shape)} in the checkpoint, "
                f"{tuple(target.shape)} in the state"
            )
        with torch.no_grad():
            target.copy_(loaded)
        return current
    if isinstance(current, dict) and isinstance(loaded, dict):
        missing = [k for k in current if k not in loaded]
        if missing:
            raise CheckpointError(f"{where}: key(s) {missing[:5]} missing from the checkpoint")
        for k, v in loaded.items():
            current[k] = copy_into(current.get(k), v, f"{key}.{k}")
        return current
    return loaded
