"""The checkpoint tiers behind one small interface (no torch).

A :class:`~rankguard.checkpoint.manager.CheckpointManager` keeps each checkpoint in a
*tier*: ``persistent`` (the shared ``checkpoint.save`` directory, DCP files with a
manifest and a commit marker) and ``local`` (each node's
``non_persistent_local_ckpt_dir``, with replicas on other nodes). The manager reaches
both through :class:`CheckpointTier`: it starts a save in a tier, asks every tier for the
checkpoints it could load, and loads the newest one that verifies, falling back tier by
tier. A tier's methods are collectives: every rank calls them at the same point.

:class:`~rankguard.checkpoint.persistent.PersistentTier` and
:class:`~rankguard.checkpoint.localtier.LocalTier` implement the protocol, each in its own
module; they reach what the manager keeps (the state, the group, the staging buffers, the
bookkeeping of ``checkpoints.json``) through :class:`TierHost`. :class:`BoundTier` is a
tier made of three callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rankguard.checkpoint.config import CheckpointConfig
    from rankguard.checkpoint.group import CheckpointGroup
    from rankguard.checkpoint.stager import HostStager
    from rankguard.checkpoint.state import StatePlan

__all__ = ["BoundTier", "Candidate", "CheckpointTier", "SaveJob", "TierHost"]

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


class TierHost(Protocol):
    """What a tier uses of the manager that owns it (one per rank)."""

    config: CheckpointConfig
    plan: StatePlan  # the state: global state dict, per-rank bytes
    group: CheckpointGroup  # the checkpoint's own gloo group (its collectives)
    rank: int
    world: int
    job: str  # the job's id (directory locks, manifests)
    attempt: int  # torch elastic's restart count
    stager: HostStager  # async saves' host buffers
    seq: int  # the number of the save under way in this process (temporary names)

    def writer(self, path: Path, background: bool = False) -> Any:
        """DCP's storage writer for ``path`` (``background``: an async save's)."""
        ...

    def say(self, message: str, level: int, *, everywhere: bool = False) -> None: ...

    def note_committed(
        self, tier: str, step: int, path: Path, t0: float, stage_s: float, w0: float
    ) -> None:
        """Every rank: ``step`` is committed in ``tier`` (``checkpoints.json``)."""
        ...

    def note_failed(self, tier: str, step: int, why: str) -> None:
        """Every rank: the save of ``step`` failed; raises ``CheckpointError``."""
        ...

    def note_loaded(self, tier: str, step: int, path: Path) -> None:
        """Every rank: the state was loaded from ``step`` of ``tier``."""
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
