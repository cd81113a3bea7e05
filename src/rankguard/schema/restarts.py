"""The restarts of a run as typed records: what a restart is for (:class:`RestartCause`),
each line of ``restarts.jsonl`` (:class:`RestartEntry`) and ``status.json``'s
``restarts`` and ``live`` blocks (:class:`RestartsBlock`, :class:`LiveBlock`).

The launcher's agent hands its node services a :class:`RestartCause` (a finding acted
on, the group's first failure: exit code, signal, error file, or nodes waiting to join,
with the restart decision's fields); the services write a :class:`RestartEntry` per
restart (kinds ``process``, ``inprocess``, ``live_recovery``; ``stop`` for a stop
decision) to ``restarts.jsonl`` and the ``restarts`` block. Reading is tolerant like
every reader of run files (:mod:`rankguard.schema.coerce`): a value of the wrong type
reads as missing, never raises; an entry's keys are written back in the order they
came, the ones a kind adds kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from rankguard.schema.coerce import as_dict, as_int, as_list, as_number, as_str
from rankguard.schema.jsontypes import JsonObject, JsonValue
from rankguard.schema.statusblocks import status_block

__all__ = [
    "DECISION_KEYS",
    "LiveBlock",
    "LiveReplacement",
    "LostRank",
    "RestartCause",
    "RestartEntry",
    "RestartsBlock",
]

DECISION_KEYS = (
    "decision",
    "rule",
    "failure_kind",
    "attempt",
    "no_progress_attempts",
    "fingerprint",
)
"""The fields a restart decision adds to its ``restarts.jsonl`` line."""


@dataclass(frozen=True, slots=True)
class RestartCause:
    """What the worker group restarts (or failed) for: a finding acted on, the group's
    first failure (its rank, pid, exit code, signal, error) or nodes waiting to join;
    ``decision``: the restart decision's fields, when one was taken."""

    finding_type: str | None = None
    rank: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    message: str | None = None
    error: str | None = None
    stack_dump: str | None = None
    decision: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Any) -> RestartCause | None:
        """A finding's dict, a failure's or a decision's (keys of the wrong type read
        as missing); None for anything that is not a dict."""
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            finding_type=as_str(d.get("finding_type")),
            rank=as_int(d.get("rank")),
            pid=as_int(d.get("pid")),
            exit_code=as_int(d.get("exit_code")),
            signal=as_str(d.get("signal")),
            reason=as_str(d.get("reason")),
            message=as_str(d.get("message")),
            error=as_str(d.get("error")),
            stack_dump=as_str(d.get("stack_dump")),
            decision={k: d[k] for k in DECISION_KEYS if k in d},
        )


_ENTRY_KEYS = (
    "schema_version",
    "kind",
    "run_id",
    "restart",
    "wall_time",
    "cause",
    "rank",
    "reason",
    "message",
    "exit_code",
    "stack_dump",
)


@dataclass(frozen=True, slots=True)
class RestartEntry:
    """One restart (a ``restarts.jsonl`` line, an entry of the ``restarts`` block):
    its kind, number, time, cause, rank and message; ``extra``: the keys its kind adds
    (a decision's, a live recovery's cost, an in-process restart's id); ``keys``: every
    key written, in order (default: the common ones, then ``extra``'s)."""

    kind: str = "process"
    run_id: str | None = None
    restart: int | None = None
    wall_time: str | None = None
    cause: str | None = None
    rank: int | None = None
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    stack_dump: str | None = None
    schema_version: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.keys:
            object.__setattr__(self, "keys", (*_ENTRY_KEYS, *self.extra))

    @classmethod
    def from_dict(cls, raw: Any) -> RestartEntry | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            kind=as_str(d.get("kind")) or "process",
            run_id=as_str(d.get("run_id")),
            restart=as_int(d.get("restart")),
            wall_time=as_str(d.get("wall_time")),
            cause=as_str(d.get("cause")),
            rank=as_int(d.get("rank")),
            reason=as_str(d.get("reason")),
            message=as_str(d.get("message")),
            exit_code=as_int(d.get("exit_code")),
            stack_dump=as_str(d.get("stack_dump")),
            schema_version=as_int(d.get("schema_version")) or 1,
            extra={k: v for k, v in d.items() if k not in _ENTRY_KEYS},
            keys=tuple(str(k) for k in d),
        )

    def to_dict(self) -> JsonObject:
        return {k: self.extra[k] if k in self.extra else getattr(self, k) for k in self.keys}

    def stamped(self, wall_time: str) -> RestartEntry:
        """This entry at ``wall_time`` (its key last when it had none)."""
        keys = self.keys if "wall_time" in self.keys else (*self.keys, "wall_time")
        return replace(self, wall_time=wall_time, keys=keys)

    def number(self, key: str) -> float | None:
        """A number its kind adds (``recovery_s``, ``steps_redone``), else None."""
        return as_number(self.extra.get(key))


@status_block
@dataclass(frozen=True, slots=True)
class RestartsBlock:
    """``restarts``: every restart of the run so far, in order."""

    name: ClassVar[str] = "restarts"

    entries: tuple[RestartEntry, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any) -> RestartsBlock | None:
        if not isinstance(raw, list):
            return None
        entries = (RestartEntry.from_dict(r) for r in raw)
        return cls(tuple(e for e in entries if e is not None))

    def to_dict(self) -> list[JsonValue]:
        return [e.to_dict() for e in self.entries]

    def count(self, kind: str) -> int:
        return sum(e.kind == kind for e in self.entries)


@dataclass(frozen=True, slots=True)
class LostRank:
    """A rank whose process ended and a standby takes its place (live recovery): the
    rank, its pid, the standby's pid, this node's number, the finding's reason
    (``Reason``'s value) and how the process ended (``SIGKILL``, ``exit 1``)."""

    rank: int
    pid: int
    standby_pid: int
    node: int
    reason: str
    exit: str
    hostname: str = ""  # the lost process's host ("" : this launcher's)


@dataclass(frozen=True, slots=True)
class LiveReplacement:
    """A rank a standby replaced: the lost rank and pid, the standby's pid, the cause
    (a finding type), when the fault was seen (``time.time()``) and, once the newcomer
    completed its first step, the recovery's cost (fault -> that step, steps redone) and
    where its state came from (``source``: ``replica on rank 0``, ``local checkpoint step
    5: replica on rank 3``, ``checkpoint step 3 (persistent)``; null until then, and for
    a rank dropped with no standby left: nothing was moved)."""

    lost_rank: int | None = None
    lost_pid: int | None = None
    standby_pid: int | None = None
    cause: str | None = None
    fault_t: float | None = None
    recovery_s: float | None = None
    steps_redone: int | None = None
    source: str | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> LiveReplacement | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            lost_rank=as_int(d.get("lost_rank")),
            lost_pid=as_int(d.get("lost_pid")),
            standby_pid=as_int(d.get("standby_pid")),
            cause=as_str(d.get("cause")),
            fault_t=as_number(d.get("fault_t")),
            recovery_s=as_number(d.get("recovery_s")),
            steps_redone=as_int(d.get("steps_redone")),
            source=as_str(d.get("source")),
        )

    def to_dict(self) -> JsonObject:
        return {
            "lost_rank": self.lost_rank,
            "lost_pid": self.lost_pid,
            "standby_pid": self.standby_pid,
            "cause": self.cause,
            "fault_t": self.fault_t,
            "recovery_s": self.recovery_s,
            "steps_redone": self.steps_redone,
            "source": self.source,
        }


@status_block
@dataclass(frozen=True, slots=True)
class LiveBlock:
    """``live``: this node's standbys (waiting now, left without being needed) and the
    ranks they replaced."""

    name: ClassVar[str] = "live"

    standbys_per_node: int | None = None
    waiting: int = 0
    left_unused: int = 0
    used: int = 0
    started: int = 0  # standbys started to refill used ones
    replaced: tuple[LiveReplacement, ...] = ()
    # ranks dropped with no standby left (inprocess_restart.shrink_when_no_standby):
    # standby_pid null; world_size: the training ranks now
    shrunk: tuple[LiveReplacement, ...] = ()
    world_size: int | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> LiveBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        replaced = (LiveReplacement.from_dict(r) for r in as_list(d.get("replaced")))
        shrunk = (LiveReplacement.from_dict(r) for r in as_list(d.get("shrunk")))
        return cls(
            standbys_per_node=as_int(d.get("standbys_per_node")),
            waiting=as_int(d.get("waiting")) or 0,
            left_unused=as_int(d.get("left_unused")) or 0,
            used=as_int(d.get("used")) or 0,
            started=as_int(d.get("started")) or 0,
            replaced=tuple(r for r in replaced if r is not None),
            shrunk=tuple(r for r in shrunk if r is not None),
            world_size=as_int(d.get("world_size")),
        )

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "standbys_per_node": self.standbys_per_node,
            "waiting": self.waiting,
            "left_unused": self.left_unused,
            "used": self.used,
            "started": self.started,
            "replaced": [r.to_dict() for r in self.replaced],
        }
        if self.shrunk:  # only once the job went on with fewer ranks
            out["shrunk"] = [r.to_dict() for r in self.shrunk]
            out["world_size"] = self.world_size
        return out
