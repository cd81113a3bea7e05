"""The ``collectives`` block of a heartbeat record: where a rank stands in its sequence of
collectives, read from torch's flight recorder without touching the training thread.

For each process group the rank uses (at most :data:`MAX_GROUPS`), the sequence number
of the newest collective it enqueued and of the newest that completed: a rank whose
``enqueued`` is ahead of its ``completed`` is inside a collective (waiting for peers, or
for the transfer itself); a rank whose ``enqueued`` is behind a peer's has not reached
the collective that peer waits in. ``samples``/``waiting`` count, since the process
started, how often the rank's sampler looked and how often it found the rank inside a
collective (of any group): their ratio over an interval is the share of time the
rank's collectives waited, which is how long it waited for the slowest peer (a rank that
arrives last never waits).

``stuck`` names the collective the rank has waited in for a while (the same position for
:data:`~rankguard.ft.collectives.STUCK_AFTER_S`): its group, sequence number, operation
and input sizes, read once from the recorder's entries; node 0 compares the ranks'
``stuck`` to classify a hang (who did not join, a mismatch, a communication stall).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rankguard.schema.jsontypes import JsonObject

__all__ = ["MAX_GROUPS", "CollectivesBlock", "GroupPosition", "StuckCollective"]

MAX_GROUPS = 16  # groups carried per record (the first ones by name)
_MAX_NAME = 64  # characters of a group's name
_MAX_SEQ = 2**62
_MAX_TEXT = 200  # characters of an operation's name or sizes


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """One process group's newest enqueued and completed collective (-1: none yet)."""

    group: str
    enqueued: int
    completed: int

    @property
    def inside(self) -> bool:
        """The rank enqueued a collective of this group that has not completed."""
        return self.enqueued > self.completed


@dataclass(frozen=True, slots=True)
class StuckCollective:
    """The collective a rank has been waiting in: ``op`` as torch names it
    (``all_reduce``), ``sizes`` its input sizes as text (``[[4160]]``)."""

    group: str
    seq: int
    op: str
    sizes: str = ""

    def to_dict(self) -> JsonObject:
        return {"group": self.group, "seq": self.seq, "op": self.op, "sizes": self.sizes}

    @classmethod
    def from_dict(cls, d: Any) -> StuckCollective:
        if not isinstance(d, dict):
            raise ValueError("collectives.stuck: expected an object")
        for key in ("group", "op", "sizes"):
            v = d.get(key, "")
            if not isinstance(v, str) or len(v) > _MAX_TEXT:
                raise ValueError(f"collectives.stuck.{key}: expected a string (<= {_MAX_TEXT})")
        return cls(
            d["group"], _seq(d.get("seq"), "collectives.stuck.seq"), d["op"], d.get("sizes", "")
        )


def _seq(value: Any, where: str) -> int:
    if type(value) is not int or not -1 <= value < _MAX_SEQ:
        raise ValueError(f"{where}: expected an integer >= -1")
    return value


def _count(d: JsonObject, key: str) -> int:
    value = d.get(key, 0)
    if type(value) is not int or not 0 <= value < _MAX_SEQ:
        raise ValueError(f"collectives.{key}: expected an integer >= 0")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectivesBlock:
    """``collectives``: the rank's position per group and its waiting samples."""

    name: ClassVar[str] = "collectives"
    flat: ClassVar[bool] = False
    groups: tuple[GroupPosition, ...] = field(default_factory=tuple)
    samples: int = 0  # sampler looks since the process started
    waiting: int = 0  # of those, inside a collective
    stuck: StuckCollective | None = None

    def group(self, name: str) -> GroupPosition | None:
        for g in self.groups:
            if g.group == name:
                return g
        return None

    @property
    def inside(self) -> bool:
        """Inside a collective of any group."""
        return any(g.inside for g in self.groups)

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "groups": {g.group: [g.enqueued, g.completed] for g in self.groups},
            "samples": self.samples,
            "waiting": self.waiting,
        }
        if self.stuck is not None:
            out["stuck"] = self.stuck.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any) -> CollectivesBlock:
        if not isinstance(d, dict):
            raise ValueError(f"collectives: expected an object, got {type(d).__name__}")
        raw = d.get("groups", {})
        if not isinstance(raw, dict):
            raise ValueError("collectives.groups: expected an object")
        if len(raw) > MAX_GROUPS:
            raise ValueError(f"collectives.groups: more than {MAX_GROUPS} groups")
        groups = []
        for name, pair in raw.items():
            where = f"collectives.groups.{str(name)[:_MAX_NAME]}"
            if len(name) > _MAX_NAME:
                raise ValueError(f"{where}: a group name of more than {_MAX_NAME} characters")
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{where}: expected [enqueued, completed]")
            groups.append(GroupPosition(name, _seq(pair[0], where), _seq(pair[1], where)))
        samples, waiting = _count(d, "samples"), _count(d, "waiting")
        if waiting > samples:
            raise ValueError("collectives.waiting: more than samples")
        stuck = d.get("stuck")
        return cls(
            groups=tuple(groups),
            samples=samples,
            waiting=waiting,
            stuck=None if stuck is None else StuckCollective.from_dict(stuck),
        )
