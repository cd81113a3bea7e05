"""The relay's change-only encoding of a node's records (no torch, no store).

A rank's consecutive heartbeat records differ, as a rule, only in a few fields that move
with time: its counters, clocks, progress and where its main thread is. A relay sends
those *volatile* fields of every local rank in a small *tick* each push, and a rank's
full record (the *base*) only when anything else changed: its pid, event, phase,
checkpoint state, exit, GPU, perf window, straggler samples, unknown keys. Node 0 gets
back exactly the record the relay holds by laying the tick's fields over the base
record of the same generation: the encoding loses nothing.

A tick row is a list, in the order of :data:`TICK_FIELDS`:
``[rank, pid, seq, wall_time_ns, monotonic_ns, progress_seq, iteration,
since_progress_s, last_progress_monotonic_ns, phase_elapsed_s, main_frame,
relayed_age_s]``.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

from rankguard.schema.records import HeartbeatRecord, RecordError

__all__ = [
    "TICK_FIELDS",
    "VOLATILE_FIELDS",
    "RecordPatcher",
    "stable_part",
    "tick_row",
]

#: Fields a tick carries for every rank at every push (the rest is in the base record).
VOLATILE_FIELDS = (
    "seq",
    "wall_time_ns",
    "monotonic_ns",
    "progress_seq",
    "iteration",
    "since_progress_s",
    "last_progress_monotonic_ns",
    "phase_elapsed_s",
    "main_frame",
    "relayed_age_s",
)
TICK_FIELDS = ("rank", "pid", *VOLATILE_FIELDS)

_ALL = tuple(HeartbeatRecord.__dataclass_fields__)  # constructor order, ``extra`` last
_STABLE = tuple(f for f in _ALL if f not in VOLATILE_FIELDS)
# A record's values from its base's values followed by a tick row: each field's index
# in that list (the row's for a volatile field), gathered in one C call.
_GATHER = itemgetter(
    *(
        len(_ALL) + 2 + VOLATILE_FIELDS.index(f) if f in VOLATILE_FIELDS else i
        for i, f in enumerate(_ALL)
    )
)
_NONNEG_INT = (True, True, False, True, False, False, False, False, False, False)
_INT_OR_NONE = (False, False, True, False, True, False, True, False, False, False)
_NUM_OR_NONE = (False, False, False, False, False, True, False, True, False, True)
_MAX_TEXT = 4096


def stable_part(rec: HeartbeatRecord) -> tuple[Any, ...]:
    """Everything of ``rec`` a tick does not carry: when it changes, the base is resent."""
    return tuple(getattr(rec, name) for name in _STABLE)


def tick_row(rec: HeartbeatRecord, relayed_age_s: float | None) -> list[Any]:
    """The tick row of ``rec`` (``relayed_age_s``: its age when sent, or None)."""
    return [
        rec.rank,
        rec.pid,
        rec.seq,
        rec.wall_time_ns,
        rec.monotonic_ns,
        rec.progress_seq,
        rec.iteration,
        rec.since_progress_s,
        rec.last_progress_monotonic_ns,
        rec.phase_elapsed_s,
        rec.main_frame,
        relayed_age_s,
    ]


_NUM = (int, float)
_INF = math.inf


def _check_row(row: Any) -> None:
    """A tick row's volatile fields are of their types (:class:`RecordError` if not):
    every field tested in one expression (a scan checks one row per rank that pushed);
    a row that fails it is looked at field by field for the error."""
    if type(row) is not list or len(row) != len(TICK_FIELDS):
        raise RecordError(f"tick row: expected a list of {len(TICK_FIELDS)} values")
    _, _, seq, wall, mono, pseq, it, since, last, elapsed, frame, age = row
    if (
        type(seq) is int
        and seq >= 0
        and type(wall) is int
        and wall >= 0
        and (mono is None or type(mono) is int)
        and type(pseq) is int
        and pseq >= 0
        and (it is None or type(it) is int)
        and (since is None or (type(since) in _NUM and 0 <= since < _INF))
        and (last is None or type(last) is int)
        and (elapsed is None or (type(elapsed) in _NUM and 0 <= elapsed < _INF))
        and (frame is None or (type(frame) is str and len(frame) <= _MAX_TEXT))
        and (age is None or (type(age) in _NUM and 0 <= age < _INF))
    ):
        return
    _row_error(row)


def _row_error(row: list[Any]) -> None:
    """Raise the error of the first field of ``row`` that is not of its type."""
    values = row[2:]
    for i, v in enumerate(values):
        name = VOLATILE_FIELDS[i]
        if v is None:
            if _NONNEG_INT[i]:
                raise RecordError(f"tick row {name}: required")
            continue
        if _NONNEG_INT[i] or _INT_OR_NONE[i]:
            if type(v) is not int or (_NONNEG_INT[i] and v < 0):
                raise RecordError(f"tick row {name}: expected an integer, got {v!r:.40}")
        elif _NUM_OR_NONE[i]:
            if type(v) not in (int, float) or not 0 <= v < math.inf:
                raise RecordError(f"tick row {name}: expected a finite number >= 0")
        elif type(v) is not str or len(v) > _MAX_TEXT:  # main_frame
            raise RecordError(f"tick row {name}: expected a short string")
    raise RecordError("tick row: a value out of its range")  # not reached


class RecordPatcher:
    """Node 0's copy of one relayed rank's base record; builds the current record from
    a tick row (about 2 µs: one constructor call, no ``dataclasses.replace``)."""

    __slots__ = ("_values", "base")

    def __init__(self, base: HeartbeatRecord) -> None:
        self.base = base
        self._values = [getattr(base, name) for name in _ALL]

    def apply(self, row: Any) -> HeartbeatRecord | None:
        """The base record with ``row``'s fields, None when ``row`` is of another
        process of the rank (its base has not arrived yet); :class:`RecordError` when
        ``row`` is malformed."""
        _check_row(row)
        base = self.base
        if row[0] != base.rank or row[1] != base.pid:
            return None
        return HeartbeatRecord(*_GATHER(self._values + row))
