"""The typed blocks of ``status.json`` that node 0's services write, and their registry
(as :mod:`rankguard.schema.blocks` is for the heartbeat records' blocks).

A writer returns its block (a :class:`StatusBlock`: ``name``, ``to_dict``), which the
node services turn into ``status.json``'s field of that name; a reader asks
:meth:`rankguard.schema.status.StatusDoc.block` for the class and gets the block parsed
(every value of the wrong type read as missing, never raised on: the ranks' files and
the store are not trusted), or None when the status has none. ``to_dict`` writes the
keys a reader found before, in their order, and keeps the ones it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from rankguard.schema.coerce import as_dict, as_int, as_number, as_str

__all__ = [
    "STATUS_BLOCKS",
    "CheckpointEntry",
    "CheckpointsBlock",
    "StatusBlock",
    "TimeoutInForce",
    "TimeoutsBlock",
    "status_block",
]


class StatusBlock(Protocol):
    """One block of ``status.json``: its key and its JSON form."""

    name: ClassVar[str]

    def to_dict(self) -> Any: ...


B = TypeVar("B")

#: Every typed block, by its key in ``status.json``.
STATUS_BLOCKS: dict[str, type[Any]] = {}


def status_block(cls: type[B]) -> type[B]:
    """Register a block class (its ``name`` is its key; one class per key)."""
    name = cls.name  # type: ignore[attr-defined]
    assert name not in STATUS_BLOCKS, name
    STATUS_BLOCKS[name] = cls
    return cls


# ---- checkpoints (rank 0's checkpoint manager, ``checkpoints.json``) --------------------


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """The last committed checkpoint of a tier: its step, where, when, how long."""

    step: int | None = None
    path: str | None = None
    time: str | None = None
    stage_s: float | None = None
    write_s: float | None = None
    total_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("step", "path", "time", "stage_s", "write_s", "total_s")

    @classmethod
    def from_dict(cls, raw: Any) -> CheckpointEntry | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            step=as_int(d.get("step")),
            path=as_str(d.get("path")),
            time=as_str(d.get("time")),
            stage_s=as_number(d.get("stage_s")),
            write_s=as_number(d.get("write_s")),
            total_s=as_number(d.get("total_s")),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._KEYS}, **self.extra}


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """A save in flight (``since``) or the checkpoint the job resumed from (``path``)."""

    tier: str | None = None
    step: int | None = None
    since: str | None = None
    path: str | None = None
    keys: tuple[str, ...] = ()  # the keys it was read with, in order

    @classmethod
    def from_dict(cls, raw: Any) -> CheckpointMark | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            tier=as_str(d.get("tier")),
            step=as_int(d.get("step")),
            since=as_str(d.get("since")),
            path=as_str(d.get("path")),
            keys=tuple(k for k in d if k in ("tier", "step", "since", "path")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys}


@status_block
@dataclass(frozen=True, slots=True)
class CheckpointsBlock:
    """``checkpoints``: the last committed step and entry per tier, the saves, the
    failures, the write in flight and what the job resumed from."""

    name: ClassVar[str] = "checkpoints"

    rank: int | None = None
    world_size: int | None = None
    job: str | None = None
    async_save: bool = False
    last_committed: dict[str, int | None] = field(default_factory=dict)
    saves: dict[str, int | None] = field(default_factory=dict)
    failures: int = 0
    last_error: str | None = None
    last: dict[str, CheckpointEntry | None] = field(default_factory=dict)
    inflight: CheckpointMark | None = None
    loaded: CheckpointMark | None = None
    updated: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "rank",
        "world_size",
        "job",
        "async_save",
        "last_committed",
        "saves",
        "failures",
        "last_error",
        "last",
        "inflight",
        "loaded",
        "updated",
    )

    @classmethod
    def from_dict(cls, raw: Any) -> CheckpointsBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        per_tier = {str(k): v for k, v in (as_dict(d.get("last_committed")) or {}).items()}
        last = {str(k): v for k, v in (as_dict(d.get("last")) or {}).items()}
        return cls(
            rank=as_int(d.get("rank")),
            world_size=as_int(d.get("world_size")),
            job=as_str(d.get("job")),
            async_save=d.get("async_save") is True,
            last_committed={k: as_int(v) for k, v in per_tier.items()},
            saves={str(k): as_int(v) for k, v in (as_dict(d.get("saves")) or {}).items()},
            failures=as_int(d.get("failures")) or 0,
            last_error=as_str(d.get("last_error")),
            last={k: CheckpointEntry.from_dict(v) for k, v in last.items()},
            inflight=CheckpointMark.from_dict(d.get("inflight")),
            loaded=CheckpointMark.from_dict(d.get("loaded")),
            updated=as_str(d.get("updated")),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "job": self.job,
            "async_save": self.async_save,
            "last_committed": dict(self.last_committed),
            "saves": dict(self.saves),
            "failures": self.failures,
            "last_error": self.last_error,
            "last": {k: v.to_dict() if v is not None else None for k, v in self.last.items()},
            "inflight": self.inflight.to_dict() if self.inflight is not None else None,
            "loaded": self.loaded.to_dict() if self.loaded is not None else None,
            "updated": self.updated,
            **self.extra,
        }


# ---- timeouts in force (the launcher's cadence) ----------------------------------------


@dataclass(frozen=True, slots=True)
class TimeoutInForce:
    """One timeout in force and where it came from (``config (<key>)``, ``learned``)."""

    value: float | None
    source: str | None


@status_block
@dataclass(frozen=True, slots=True)
class TimeoutsBlock:
    """``timeouts``: every phase's timeout in force, in the launcher's order."""

    name: ClassVar[str] = "timeouts"

    entries: dict[str, TimeoutInForce] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Any) -> TimeoutsBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        entries = {}
        for key, value in d.items():
            info = as_dict(value)
            if info is not None:
                entries[str(key)] = TimeoutInForce(
                    as_number(info.get("value")), as_str(info.get("source"))
                )
        return cls(entries)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {k: {"value": t.value, "source": t.source} for k, t in self.entries.items()}
