"""The heartbeat record: what a rank publishes, typed and validated on the way in.

A record crosses a file (the rank's heartbeat file), the store (a relay's key) and a
thread (the monitor's scan). Every reader gets a :class:`HeartbeatRecord` from
:meth:`HeartbeatRecord.from_dict`, which rejects a record with a wrong-typed or absurd
field with :class:`RecordError` (the caller counts and skips it: one bad line never stops a
scan). Fields the monitor does not read (the perf window, straggler samples, section
statistics) keep their JSON shape, checked only to be objects; unknown keys are kept in
``extra`` so a mirrored copy loses nothing.

:func:`supersedes` is the one rule for "which record of a rank replaces which", used by
the monitor's rules and by the relays alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

__all__ = [
    "MAX_RANKS",
    "SCHEMA_VERSION",
    "Event",
    "HeartbeatRecord",
    "RecordError",
    "supersedes",
]

SCHEMA_VERSION = 1

#: No job has more ranks than this; a record claiming more is rejected.
MAX_RANKS = 1 << 22
_MAX_TEXT = 4096  # longest accepted string field (hostnames, phases, messages)


class Event(str, Enum):
    PROCESS_START = "process_start"
    HEARTBEAT = "heartbeat"
    PROCESS_END = "process_end"


class RecordError(ValueError):
    """A record that cannot be used; the message names the field."""


def _int(d: dict[str, Any], key: str, *, lo: int | None = 0, default: Any = None) -> Any:
    v = d.get(key, default)
    if v is None:
        return None
    if type(v) is not int:
        raise RecordError(f"{key}: expected an integer, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise RecordError(f"{key}: must be >= {lo}, got {v}")
    return v


def _num(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise RecordError(f"{key}: expected a finite number >= 0, got {v!r:.40}")
    return float(v)


def _str(d: dict[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise RecordError(f"{key}: expected a string, got {type(v).__name__}")
    if len(v) > _MAX_TEXT:
        raise RecordError(f"{key}: longer than {_MAX_TEXT} characters")
    return v


def _bool(d: dict[str, Any], key: str) -> bool:
    v = d.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RecordError(f"{key}: expected true or false, got {v!r:.40}")
    return v


def _obj(d: dict[str, Any], key: str) -> dict[str, Any] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise RecordError(f"{key}: expected an object, got {type(v).__name__}")
    return v


def _checkpoint_id(d: dict[str, Any]) -> str | int | None:
    v = d.get("checkpoint_id")
    if type(v) is int:
        return v
    return _str(d, "checkpoint_id")


def _gpu(d: dict[str, Any]) -> dict[str, Any] | None:
    gpu = _obj(d, "gpu")
    if gpu is None:
        return None
    try:
        _int(gpu, "ordinal")
        _str(gpu, "token")
        _str(gpu, "uuid")
    except RecordError as exc:
        raise RecordError(f"gpu.{exc}") from None
    return gpu


def _exit(d: dict[str, Any]) -> dict[str, Any] | None:
    info = _obj(d, "exit")
    if info is None:
        return None
    try:
        if info.get("clean") is not None:
            _bool(info, "clean")
        _int(info, "exit_code", lo=None)
        _str(info, "error")
        _bool(info, "vanished")
    except RecordError as exc:
        raise RecordError(f"exit.{exc}") from None
    return info


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """One record of one rank process (schema in ``docs/heartbeat.md``)."""

    event: Event
    run_id: str
    rank: int
    pid: int
    seq: int = 0
    schema_version: int = SCHEMA_VERSION
    hostname: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    wall_time_ns: int = 0
    monotonic_ns: int | None = None
    gpu: dict[str, Any] | None = None
    progress_seq: int = 0
    iteration: int | None = None
    phase: str | None = None
    phase_elapsed_s: float | None = None
    checkpoint_active: bool = False
    checkpoint_id: str | int | None = None
    since_progress_s: float | None = None
    last_progress_monotonic_ns: int | None = None
    progress_source: str | None = None
    main_frame: str | None = None
    exit: dict[str, Any] | None = None  # process_end: clean, exit_code, error, vanished
    synthesized: bool = False  # a process_end written for a process that died without one
    relayed_age_s: float | None = None  # age when a relay sent it (the writer's clock)
    perf: dict[str, Any] | None = None  # the perf monitor's latest window
    straggler: dict[str, Any] | None = None  # own-compute samples
    ft_stats: dict[str, Any] | None = None  # section durations (learned timeouts)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, kept as they came

    @property
    def ended(self) -> bool:
        return self.event is Event.PROCESS_END

    @property
    def own_end(self) -> bool:
        """The process's own ``process_end`` (not one synthesized for it)."""
        return self.event is Event.PROCESS_END and not self.synthesized

    @classmethod
    def from_dict(cls, d: Any, *, max_ranks: int = MAX_RANKS) -> HeartbeatRecord:
        """Validate a record read from a file or the store; :class:`RecordError` names
        the first bad field. ``max_ranks``: ranks at or above it are rejected (the job's
        world size when the monitor knows it)."""
        if not isinstance(d, dict):
            raise RecordError(f"a record must be a JSON object, got {type(d).__name__}")
        try:
            event = Event(d.get("event"))
        except ValueError:
            raise RecordError(f"event: unknown event {d.get('event')!r:.40}") from None
        run_id = _str(d, "run_id")
        if run_id is None:
            raise RecordError("run_id: missing")
        rank = _int(d, "rank")
        pid = _int(d, "pid", lo=1)
        if rank is None or pid is None:
            raise RecordError("rank and pid: both required")
        if rank >= max_ranks:
            raise RecordError(f"rank: {rank} is outside the job ({max_ranks} ranks)")
        known = _KNOWN
        return cls(
            event=event,
            run_id=run_id,
            rank=rank,
            pid=pid,
            seq=_int(d, "seq", default=0),
            schema_version=_int(d, "schema_version", default=SCHEMA_VERSION),
            hostname=_str(d, "hostname"),
            node_rank=_int(d, "node_rank"),
            local_rank=_int(d, "local_rank"),
            world_size=_int(d, "world_size", lo=1),
            wall_time_ns=_int(d, "wall_time_ns", default=0),
            monotonic_ns=_int(d, "monotonic_ns", lo=None),
            gpu=_gpu(d),
            progress_seq=_int(d, "progress_seq", default=0),
            iteration=_int(d, "iteration", lo=None),
            phase=_str(d, "phase"),
            phase_elapsed_s=_num(d, "phase_elapsed_s"),
            checkpoint_active=_bool(d, "checkpoint_active"),
            checkpoint_id=_checkpoint_id(d),
            since_progress_s=_num(d, "since_progress_s"),
            last_progress_monotonic_ns=_int(d, "last_progress_monotonic_ns", lo=None),
            progress_source=_str(d, "progress_source"),
            main_frame=_str(d, "main_frame"),
            exit=_exit(d),
            synthesized=_bool(d, "synthesized"),
            relayed_age_s=_num(d, "relayed_age_s"),
            perf=_obj(d, "perf"),
            straggler=_obj(d, "straggler"),
            ft_stats=_obj(d, "ft_stats"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The record as it is written (``None`` optional fields left out as a writer
        leaves them; unknown keys back in place)."""
        out: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if name in _OMIT_WHEN_EMPTY and not value:
                continue
            out[name] = value.value if isinstance(value, Event) else value
        out.update(self.extra)
        return out

    def with_exit(self, **annotations: Any) -> HeartbeatRecord:
        """The same record with notes added to its ``exit`` (why it ended)."""
        return replace(self, exit={**(self.exit or {}), **annotations})

    def vanished(self, wall_time_ns: int) -> HeartbeatRecord:
        """The ``process_end`` written on behalf of this process, which died without one."""
        return replace(
            self,
            event=Event.PROCESS_END,
            seq=self.seq + 1,
            synthesized=True,
            wall_time_ns=wall_time_ns,
            relayed_age_s=None,
            exit={
                "clean": False,
                "exit_code": None,
                "error": "process vanished without process_end (killed by a signal or hard crash)",
                "vanished": True,
            },
        )


_FIELDS = tuple(f.name for f in fields(HeartbeatRecord) if f.name != "extra")
_KNOWN = frozenset(_FIELDS)
_OMIT_WHEN_EMPTY = frozenset(
    {"synthesized", "relayed_age_s", "exit", "perf", "straggler", "ft_stats", "monotonic_ns"}
)


def supersedes(
    new: HeartbeatRecord, old: HeartbeatRecord | None, *, old_start_ns: int | None = None
) -> bool:
    """Does ``new`` replace ``old``, the latest accepted record of the same rank?

    - Another process of the rank (a restart): yes if it runs on another host (arrival
      order is all two hosts' clocks allow), else if it started no earlier than ``old``'s
      process (``old_start_ns``, else ``old``'s own time): a late line of a replaced
      process never brings it back.
    - The same process: an ended process stays ended; only its own ``process_end`` may
      replace one synthesized for it (the pid check was faster than the record). Else a
      higher ``seq`` wins (a rotated file's repeated start record and duplicates lose).
    """
    if old is None:
        return True
    if new.pid != old.pid or new.hostname != old.hostname:
        if new.hostname != old.hostname:
            return True
        start = old_start_ns if old_start_ns is not None else old.wall_time_ns
        return new.wall_time_ns >= start
    if old.event is Event.PROCESS_END:
        return old.synthesized and new.own_end
    return new.seq > old.seq
