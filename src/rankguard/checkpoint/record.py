"""``CheckpointRecord``: the account of one rank's checkpoints that ``checkpoints.json``
holds: the last committed step, the count and the last save of each tier, the failures
and the last error, the save in flight and the checkpoint loaded.

The manager reports each event (a save started, committed or failed, a checkpoint
loaded); rank 0 replaces ``checkpoints.json`` after each, atomically, under its lock
(the background thread of async saves reports too)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from rankguard.checkpoint.dcpio import iso_now
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.statusblocks import CheckpointEntry, CheckpointMark, CheckpointsBlock
from rankguard.util.fs import atomic_write_json

__all__ = ["CheckpointRecord"]

logger = logging.getLogger(__name__)

_IN_FLIGHT = ("tier", "step", "since")  # a save in flight's keys, in the file's order
_LOADED = ("tier", "step", "path")  # the loaded checkpoint's


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
        # the entries as status.json's reader types them (schema's CheckpointsBlock)
        self.last: dict[str, CheckpointEntry | None] = dict.fromkeys(tiers)
        self.inflight: CheckpointMark | None = None
        self.loaded: CheckpointMark | None = None
        self._path = status_path if rank == 0 else None
        self._lock = threading.Lock()

    def save_started(self, tier: str, step: int) -> None:
        """An async save of ``step`` is being written in the background."""
        self.inflight = CheckpointMark(tier, step, since=iso_now(), keys=_IN_FLIGHT)
        self.write()

    def save_committed(
        self, tier: str, step: int, path: Path, *, stage_s: float, write_s: float, total_s: float
    ) -> None:
        """``step`` is committed in ``tier`` at ``path``, in these durations (seconds)."""
        self.last_committed[tier] = step
        self.saves[tier] += 1
        self.last[tier] = CheckpointEntry(
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
        self.loaded = CheckpointMark(tier, step, path=str(path), keys=_LOADED)
        self.write()

    def to_json(self) -> JsonObject:
        """What ``checkpoints.json`` holds: the ``checkpoints`` block its readers parse."""
        return CheckpointsBlock(
            rank=self.rank,
            world_size=self.world,
            job=self.job,
            async_save=self.async_save,
            last_committed=dict(self.last_committed),
            saves={tier: n for tier, n in self.saves.items()},
            failures=self.failures,
            last_error=self.last_error,
            last=dict(self.last),
            inflight=self.inflight,
            loaded=self.loaded,
            updated=iso_now(),
        ).to_dict()

    def write(self) -> None:
        """Replace ``checkpoints.json`` (rank 0; a failure is a warning)."""
        if self._path is None:
            return
        with self._lock:
            try:
                atomic_write_json(self._path, self.to_json())
            except OSError as exc:
                logger.warning("rankguard: cannot write %s: %s", self._path, exc)
