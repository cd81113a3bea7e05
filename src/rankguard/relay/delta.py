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
from typing import Any

from rankguard.schema.records import HeartbeatRecord, RecordError

__all__ = [
    "TICK_FIELDS",
    "VOLATILE_FIELDS",
    "RecordPatcher",
    "patch_rows",
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
_NONNEG_INT = (True, True, False, True, False, False, False, False, False, False)
_INT_OR_NONE = (False, False, True, False, True, False, True, False, False, False)
_NUM_OR_NONE = (False, False, False, False, False, True, False, True, False, True)
_MAX_TEXT = 4096
_ROW_LEN = len(TICK_FIELDS)
_NO_RECORD = "tick row of a rank without a record"


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
_new = object.__new__


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
    a tick row (about 2 µs on a busy core: the row checked and the base's slots copied,
    no constructor call)."""

    __slots__ = ("base",)

    def __init__(self, base: HeartbeatRecord) -> None:
        self.base = base

    def apply(self, row: Any) -> HeartbeatRecord | None:
        """The base record with ``row``'s fields, None when ``row`` is of another
        process of the rank (its base has not arrived yet); :class:`RecordError` when
        ``row`` is malformed."""
        if type(row) is not list or len(row) != _ROW_LEN:
            raise RecordError(f"tick row: expected a list of {len(TICK_FIELDS)} values")
        rank, pid, seq, wall, mono, pseq, it, since, last, elapsed, frame, age = row
        # every field tested in one expression (a scan checks one row per rank that
        # pushed); a row that fails it is looked at field by field for the error
        if not (
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
            _row_error(row)
        b = self.base
        if rank != b.rank or pid != b.pid:
            return None
        # A copy of the base with the row's fields, every field set here in the
        # constructor's order (no ``__init__`` call: a third cheaper; the dataclass has
        # no ``__post_init__``). A field added to the record must be added here: the
        # tests compare every field of a patched record with the base's and the row's.
        r: HeartbeatRecord = _new(HeartbeatRecord)
        r.event = b.event
        r.run_id = b.run_id
        r.rank = b.rank
        r.pid = b.pid
        r.seq = seq
        r.schema_version = b.schema_version
        r.hostname = b.hostname
        r.node_rank = b.node_rank
        r.local_rank = b.local_rank
        r.world_size = b.world_size
        r.wall_time_ns = wall
        r.monotonic_ns = mono
        r.gpu = b.gpu
        r.progress_seq = pseq
        r.iteration = it
        r.phase = b.phase
        r.phase_elapsed_s = elapsed
        r.checkpoint_active = b.checkpoint_active
        r.checkpoint_id = b.checkpoint_id
        r.since_progress_s = since
        r.last_progress_monotonic_ns = last
        r.progress_source = b.progress_source
        r.iteration_source = b.iteration_source
        r.main_frame = frame
        r.exit = b.exit
        r.synthesized = b.synthesized
        r.relayed_age_s = age
        r.perf = b.perf
        r.straggler = b.straggler
        r.ft_stats = b.ft_stats
        r.rerun = b.rerun
        r.inprocess = b.inprocess
        r.extra = b.extra
        return r


def patch_rows(patchers: dict[int, RecordPatcher], rows: list[Any]) -> list[HeartbeatRecord | str]:
    """The record of each of a tick's ``rows`` (by the patcher of its rank), or why
    it cannot be used: a malformed row, or one of a rank or process without a base
    record."""
    built: list[HeartbeatRecord | str] = []
    for row in rows:
        try:
            patcher = patchers.get(row[0]) if type(row) is list and row else None
            rec = patcher.apply(row) if patcher is not None else None
        except (RecordError, TypeError) as exc:  # TypeError: an unhashable rank
            built.append(str(exc))
            continue
        built.append(_NO_RECORD if rec is None else rec)
    return built
