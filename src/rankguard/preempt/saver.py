"""What preemption saves through: anything with ``save(step)`` and ``wait()``.

rankguard's checkpoint manager fits (``save(step)`` then ``wait()`` for an async write
to commit); so does :class:`TorchFileSaver`, a plain one: ``torch.save`` of the state to
a temporary file, fsync, then an atomic rename, so a preemption that kills a save never
leaves a torn file under the final name, and :meth:`TorchFileSaver.load_latest` only
ever sees complete ones. A failed write (a full disk) removes its temporary file. Loads
go through ``torch.load(weights_only=True)``: tensors and plain data, never code.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rankguard.rank.timeline import ProgressTracker

__all__ = ["Saver", "TorchFileSaver", "save_and_wait", "set_save_listener"]

_listener: ProgressTracker | None = None
"""The step clock of this process's rank (its preemption sets it): where a completed
save is noted, the evidence of a preemption's "every rank saved step N"."""


def set_save_listener(tracker: ProgressTracker | None) -> ProgressTracker | None:
    """Saves of this module note their step on ``tracker`` from now on (None: nowhere);
    the one it replaces. Called by the rank's preemption when it installs and releases."""
    global _listener
    previous, _listener = _listener, tracker
    return previous


@runtime_checkable
class Saver(Protocol):
    def save(self, step: int) -> Any: ...

    def wait(self) -> Any: ...


def save_and_wait(saver: Saver, step: int) -> None:
    """Save ``step`` and wait until it is committed (an async save included); the
    rank's step clock then knows ``step`` is saved (:func:`set_save_listener`)."""
    tracker = _listener
    steps = tracker.training_steps() if tracker is not None else None
    saver.save(step)
    saver.wait()
    if tracker is not None:
        tracker.note_saved(step, steps)


class TorchFileSaver:
    """``<directory>/rank_<r>/step_<n>.pt`` holding ``state()``; the newest complete one
    is loaded by :meth:`load_latest`. One file per rank (no collective)."""

    _NAME = re.compile(r"^step_(\d+)\.pt$")

    def __init__(
        self, directory: str | Path, rank: int, state: Callable[[], dict[str, Any]]
    ) -> None:
        self.directory = Path(directory) / f"rank_{rank}"
        self.state = state

    def save(self, step: int) -> Path:
        import torch  # here: the light commands import rankguard.preempt

        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step_{step}.pt"
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                torch.save({"step": step, "state": self.state()}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        _note_saved(step)
        return final

    def wait(self) -> None:
        """Saves are synchronous: nothing to wait for."""

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        found = (self._NAME.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest complete save (step, state), or None. Only tensors and plain data
        are loaded (``weights_only``): a planted file cannot run code; a file that is not
        a save of this shape raises ValueError naming it."""
        import torch

        steps = self.steps()
        if not steps:
            return None
        path = self.directory / f"step_{steps[-1]}.pt"
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{path}: not loadable as tensors and plain data: {exc}") from None
        if not isinstance(blob, dict) or type(blob.get("step")) is not int or "state" not in blob:
            raise ValueError(f"{path}: not a save of TorchFileSaver (step and state)")
        return blob["step"], blob["state"]


def _note_saved(step: int) -> None:
    """The rank's step clock learns that ``step`` is saved (a preemption's "saved"
    rests on it)."""
    tracker = _listener
    if tracker is not None:
        tracker.note_saved(step)
