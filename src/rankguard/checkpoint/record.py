"""``CheckpointRecord``: the account of one rank's checkpoints that ``checkpoints.json``
holds: the last committed step, the count and the last save of each tier, the failures
and the last error, the save in flight and the checkpoint loaded.

The manager reports each event (a save started, committed or failed, a checkpoint
loaded); rank 0 replaces ``checkpoints.json`` after each, atomically, under its lock
(the background thread of async saves reports too)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from rankguard.checkpoint.dcpio import iso_now
from rankguard.schema.jsontypes import JsonObject
from rankguard.util.fs import atomic_write_json

__all__ = ["CheckpointRecord", "InFlightSave", "LoadedCheckpoint", "TierSave"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierSave:
    """A tier's last committed save: where, when and how long (seconds)."""

    step: int
    path: str
    time: str  # ISO 8601, UTC
    stage_s: float  # the copy into host buffers
    write_s: float  # the write and the commit
    total_s: float  # from the call to the commit

    def to_json(self) -> JsonObject:
        return {
            "step": self.step,
            "path": self.path,
            "time": self.time,
            "stage_s": self.stage_s,
            "write_s": self.write_s,
            "total_s": self.total_s,
        }


@dataclass(frozen=True, slots=True)
class InFlightSave:
    """The async save being written in the background."""

    tier: str
    step: int
    since: str  # ISO 8601, UTC

    def to_json(self) -> JsonObject:
        return {"tier": self.tier, "step": self.step, "since": self.since}


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """The checkpoint ``load_latest`` loaded."""

    tier: str
    step: int
    path: str

    def to_json(self) -> JsonObject:
        return {"tier": self.tier, "step": self.step, "path": self.path}


class CheckpointRecord:
    """One rank's checkpoints, and rank 0's ``checkpoints.json`` (``status_path``; None:
    not written)."""

    def __init__(
        self,
        tiers: tuple[str, ...],
        *,
        rank: int,
        world: int,
        job: str,
        async_save: bool,
        status_path: Path | None,
    ) -> None:
        self.rank, self.world, self.job, self.async_save = rank, world, job, async_save
        self.last_committed: dict[str, int | None] = dict.fromkeys(tiers)
        self.saves: dict[str, int] = dict.fromkeys(tiers, 0)
        self.failures = 0
        self.last_error: str | None = None
        self.last: dict[str, TierSave | None] = dict.fromkeys(tiers)
        self.inflight: InFlightSave | None = None
        self.loaded: LoadedCheckpoint | None = None
        self._path = status_path if rank == 0 else None
        self._lock = threading.Lock()

    def save_started(self, tier: str, step: int) -> None:
        """An async save of ``step`` is being written in the background."""
        self.inflight = InFlightSave(tier, step, iso_now())
        self.write()

    def save_committed(
        self, tier: str, step: int, path: Path, *, stage_s: float, write_s: float, total_s: float
    ) -> None:
        """``step`` is committed in ``tier`` at ``path``, in these durations (seconds)."""
        self.last_committed[tier] = step
        self.saves[tier] += 1
        self.last[tier] = TierSave(
            step, str(path), iso_now(), round(stage_s, 4), round(write_s, 4), round(total_s, 4)
        )
        self.inflight = None
        self.write()

    def save_failed(self, message: str) -> None:
        """A save failed, nothing committed (``message``: what the manager raises)."""
        self.failures += 1
        self.inflight = None
        self.last_error = message
        self.write()

    def checkpoint_loaded(self, tier: str, step: int, path: Path) -> None:
        """The state was loaded from ``step`` of ``tier``."""
        if (self.last_committed[tier] or -1) < step:
            self.last_committed[tier] = step
        self.loaded = LoadedCheckpoint(tier, step, str(path))
        self.write()

    def to_json(self) -> JsonObject:
        """What ``checkpoints.json`` holds, its keys in this order."""
        return {
            "rank": self.rank,
            "world_size": self.world,
            "job": self.job,
            "async_save": self.async_save,
            "last_committed": dict(self.last_committed),
            "saves": dict(self.saves),
            "failures": self.failures,
            "last_error": self.last_error,
            "last": {k: v.to_json() if v is not None else None for k, v in self.last.items()},
            "inflight": self.inflight.to_json() if self.inflight is not None else None,
            "loaded": self.loaded.to_json() if self.loaded is not None else None,
            "updated": iso_now(),
        }

    def write(self) -> None:
        """Replace ``checkpoints.json`` (rank 0; a failure is a warning)."""
        if self._path is None:
            return
        with self._lock:
            try:
                atomic_write_json(self._path, self.to_json())
            except OSError as exc:
                logger.warning("rankguard: cannot write %s: %s", self._path, exc)
