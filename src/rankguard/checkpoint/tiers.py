"""The checkpoint tiers behind one small interface (no torch).

A :class:`~rankguard.checkpoint.manager.CheckpointManager` keeps each checkpoint in a
*tier*: ``persistent`` (the shared ``checkpoint.save`` directory, DCP files with a
manifest and a commit marker) and ``local`` (each node's
``non_persistent_local_ckpt_dir``, with replicas on other nodes). The manager reaches
both through :class:`CheckpointTier`: it starts a save in a tier, asks every tier for the
checkpoints it could load, and loads the newest one that verifies, falling back tier by
tier. A tier's methods are collectives: every rank calls them at the same point.

:class:`BoundTier` is a tier made of three callables (how the manager exposes the two
tiers it implements); another tier implements the protocol directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["BoundTier", "Candidate", "CheckpointTier", "SaveJob"]

#: The rest of a started save (write and commit): run at once (blocking) or in the
#: manager's background thread. Raises ``CheckpointError`` when the save fails.
SaveJob = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A checkpoint a tier could load: its step and where it is (tier-specific)."""

    step: int
    tier: str
    where: Any


@runtime_checkable
class CheckpointTier(Protocol):
    """One place checkpoints are kept."""

    @property
    def name(self) -> str:
        """``persistent`` or ``local`` (the ``tier=`` of ``save``)."""
        ...

    def start_save(self, step: int, blocking: bool, t0: float) -> SaveJob:
        """Begin saving ``step`` (``t0``: when the save began, monotonic): what must
        happen before training goes on (the staging copy) happens here."""
        ...

    def candidates(self) -> list[Candidate]:
        """Checkpoints of this tier that every rank can load, newest first."""
        ...

    def load(self, candidate: Candidate) -> bool:
        """Load ``candidate`` into the state; False (with a warning) when it does not
        verify, so the manager falls back to the next one."""
        ...


@dataclass(frozen=True, slots=True)
class BoundTier:
    """A :class:`CheckpointTier` from three callables."""

    name: str
    start: Callable[[int, bool, float], SaveJob]
    list_steps: Callable[[], list[tuple[int, Any]]]
    load_step: Callable[[int, Any], bool]

    def start_save(self, step: int, blocking: bool, t0: float) -> SaveJob:
        return self.start(step, blocking, t0)

    def candidates(self) -> list[Candidate]:
        return [Candidate(step, self.name, where) for step, where in self.list_steps()]

    def load(self, candidate: Candidate) -> bool:
        return self.load_step(candidate.step, candidate.where)
