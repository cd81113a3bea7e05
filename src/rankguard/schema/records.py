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

from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.rerun import RerunBlock

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
_NUM = (int, float)
_INF = math.inf


class Event(str, Enum):
    PROCESS_START = "process_start"
    HEARTBEAT = "heartbeat"
    PROCESS_END = "process_end"


class RecordError(ValueError):
    """A record that cannot be used; the message names the field."""


def _int(d: JsonObject, key: str, *, lo: int | None = 0, default: int | None = None) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if type(v) is not int:
        raise RecordError(f"{key}: expected an integer, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise RecordError(f"{key}: must be >= {lo}, got {v}")
    return v


def _num(d: JsonObject, key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise RecordError(f"{key}: expected a finite number >= 0, got {v!r:.40}")
    return float(v)


def _str(d: JsonObject, key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise RecordError(f"{key}: expected a string, got {type(v).__name__}")
    if len(v) > _MAX_TEXT:
        raise RecordError(f"{key}: longer than {_MAX_TEXT} characters")
    return v


def _bool(d: JsonObject, key: str) -> bool:
    v = d.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RecordError(f"{key}: expected true or false, got {v!r:.40}")
    return v


def _obj(d: JsonObject, key: str) -> JsonObject | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise RecordError(f"{key}: expected an object, got {type(v).__name__}")
    return v


def _checkpoint_id(d: JsonObject) -> str | int | None:
    v = d.get("checkpoint_id")
    if type(v) is int:
        return v
    return _str(d, "checkpoint_id")


def _gpu(d: JsonObject) -> JsonObject | None:
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


def _exit(d: JsonObject) -> JsonObject | None:
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


def _rerun(d: JsonObject) -> JsonObject | None:
    block = d.get("rerun")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise RecordError("rerun: expected an object")
    try:
        RerunBlock.from_dict(block)
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    return block


def _inprocess(d: JsonObject) -> JsonObject | None:
    info = _obj(d, "inprocess")
    if info is None:
        return None
    try:
        _int(info, "restarts")
        _num(info, "awaiting_standby_s")
        last = _obj(info, "last")
        if last is not None:
            _int(last, "culprit")
            _str(last, "cause")
            _str(last, "message")
    except RecordError as exc:
        raise RecordError(f"inprocess.{exc}") from None
    return info


@dataclass(slots=True)
class HeartbeatRecord:
    """One record of one rank process (schema in ``docs/heartbeat.md``). Treated as
    immutable (``dataclasses.replace`` makes changed copies); not frozen only because a
    frozen dataclass takes twice as long to build, and the monitor builds thousands a
    scan."""

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
    gpu: JsonObject | None = None
    progress_seq: int = 0
    iteration: int | None = None
    phase: str | None = None
    phase_elapsed_s: float | None = None
    checkpoint_active: bool = False
    checkpoint_id: str | int | None = None
    since_progress_s: float | None = None
    last_progress_monotonic_ns: int | None = None
    progress_source: str | None = None
    iteration_source: str | None = None  # script, checkpoint, steps (timeline.shown_iteration)
    main_frame: str | None = None
    exit: JsonObject | None = None  # process_end: clean, exit_code, error, vanished
    synthesized: bool = False  # a process_end written for a process that died without one
    relayed_age_s: float | None = None  # age when a relay sent it (the writer's clock)
    perf: JsonObject | None = None  # the perf monitor's latest window
    straggler: JsonObject | None = None  # own-compute samples
    ft_stats: JsonObject | None = None  # section durations (learned timeouts)
    rerun: JsonObject | None = None  # the rerun state machine's outcomes (schema/rerun.py)
    inprocess: JsonObject | None = None  # in-process restarts: count, last cause, culprit
    extra: JsonObject = field(default_factory=dict)  # unknown keys, kept as they came

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
        world size, or the most the rendezvous allows).

        The monitor validates every record it reads (thousands a scan at scale), so the
        checks are grouped by type with a fast path for well-formed values; the helpers
        that build the error message run only for a bad one."""
        if not isinstance(d, dict):
            raise RecordError(f"a record must be a JSON object, got {type(d).__name__}")
        get = d.get
        try:
            event = _EVENTS[d["event"]]
        except (KeyError, TypeError):
            raise RecordError(f"event: unknown event {get('event')!r:.40}") from None
        run_id, rank, pid = get("run_id"), get("rank"), get("pid")
        if type(run_id) is not str:
            _str(d, "run_id")
            raise RecordError("run_id: missing")
        if type(rank) is not int or rank < 0:
            _int(d, "rank")
            raise RecordError("rank and pid: both required")
        if type(pid) is not int or pid < 1:
            _int(d, "pid", lo=1)
            raise RecordError("rank and pid: both required")
        if rank >= max_ranks:
            raise RecordError(f"rank: {rank} is outside the job ({max_ranks} ranks)")
        seq, version, node, local = (
            get("seq"),
            get("schema_version", SCHEMA_VERSION),
            get("node_rank"),
            get("local_rank"),
        )
        wall, pseq, world = get("wall_time_ns"), get("progress_seq"), get("world_size")
        mono, it, last = get("monotonic_ns"), get("iteration"), get("last_progress_monotonic_ns")
        elapsed, since, age = get("phase_elapsed_s"), get("since_progress_s"), get("relayed_age_s")
        host, phase, frame = get("hostname"), get("phase"), get("main_frame")
        psource, isource = get("progress_source"), get("iteration_source")
        active, synthesized = get("checkpoint_active"), get("synthesized")
        perf, straggler, ft_stats, inprocess = (
            get("perf"),
            get("straggler"),
            get("ft_stats"),
            get("inprocess"),
        )
        # every field of its type in one expression; a record that fails it goes
        # through the checks field by field, which raise the first field's error
        if not (
            (seq is None or (type(seq) is int and seq >= 0))
            and (version is None or (type(version) is int and version >= 0))
            and (node is None or (type(node) is int and node >= 0))
            and (local is None or (type(local) is int and local >= 0))
            and (wall is None or (type(wall) is int and wall >= 0))
            and (pseq is None or (type(pseq) is int and pseq >= 0))
            and (mono is None or type(mono) is int)
            and (it is None or type(it) is int)
            and (last is None or type(last) is int)
            and (elapsed is None or (type(elapsed) in _NUM and 0 <= elapsed < _INF))
            and (since is None or (type(since) in _NUM and 0 <= since < _INF))
            and (age is None or (type(age) in _NUM and 0 <= age < _INF))
            and (host is None or (type(host) is str and len(host) <= _MAX_TEXT))
            and (phase is None or (type(phase) is str and len(phase) <= _MAX_TEXT))
            and (psource is None or (type(psource) is str and len(psource) <= _MAX_TEXT))
            and (isource is None or (type(isource) is str and len(isource) <= _MAX_TEXT))
            and (frame is None or (type(frame) is str and len(frame) <= _MAX_TEXT))
            and (active is None or type(active) is bool)
            and (synthesized is None or type(synthesized) is bool)
            and (perf is None or type(perf) is dict)
            and (straggler is None or type(straggler) is dict)
            and (ft_stats is None or type(ft_stats) is dict)
            and (inprocess is None or type(inprocess) is dict)
            and (world is None or (type(world) is int and 1 <= world <= MAX_RANKS))
        ):
            _check_fields(d)
        gpu = get("gpu")
        if gpu is not None:
            gpu = _gpu(d)
        checkpoint_id = get("checkpoint_id")
        if checkpoint_id is not None and type(checkpoint_id) is not int:
            checkpoint_id = _str(d, "checkpoint_id")
        exit_info = get("exit")
        if exit_info is not None:
            exit_info = _exit(d)
        rerun = get("rerun")
        if rerun is not None:
            rerun = _rerun(d)
        if inprocess is not None:
            inprocess = _inprocess(d)
        if _KNOWN.issuperset(d):
            extra: JsonObject = {}
        else:
            unknown = d.keys() - _KNOWN
            extra = {k: d[k] for k in unknown}
        return cls(
            event,
            run_id,
            rank,
            pid,
            seq or 0,
            version,
            host,
            node,
            local,
            world,
            wall or 0,
            mono,
            gpu,
            pseq or 0,
            it,
            phase,
            elapsed,
            active or False,
            checkpoint_id,
            since,
            last,
            psource,
            isource,
            frame,
            exit_info,
            synthesized or False,
            age,
            perf,
            straggler,
            ft_stats,
            rerun,
            inprocess,
            extra,
        )

    def to_dict(self) -> JsonObject:
        """The record as it is written (``None`` optional fields left out as a writer
        leaves them; unknown keys back in place)."""
        out: JsonObject = {}
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
_REBOOT_MIN_NS = 60 * 10**9  # no host reboots and restarts a rank faster
_KNOWN = frozenset(_FIELDS)
_EVENTS = {e.value: e for e in Event}
_NONNEG_INTS = ("seq", "schema_version", "node_rank", "local_rank", "wall_time_ns", "progress_seq")
_INTS = ("monotonic_ns", "iteration", "last_progress_monotonic_ns")
_NUMBERS = ("phase_elapsed_s", "since_progress_s", "relayed_age_s")
_STRINGS = ("hostname", "phase", "progress_source", "iteration_source", "main_frame")
_BOOLS = ("checkpoint_active", "synthesized")
_OBJECTS = ("perf", "straggler", "ft_stats", "inprocess")
_OMIT_WHEN_EMPTY = frozenset(
    {
        "synthesized",
        "relayed_age_s",
        "exit",
        "perf",
        "straggler",
        "ft_stats",
        "rerun",
        "inprocess",
        "monotonic_ns",
    }
)


def _check_fields(d: Any) -> None:
    """Raise the error of the first field of ``d`` (a record) that is not of its type,
    in the order :meth:`HeartbeatRecord.from_dict` checks them."""
    get = d.get
    for key in _NONNEG_INTS:
        v = get(key)
        if v is not None and (type(v) is not int or v < 0):
            _int(d, key)
    for key in _INTS:
        v = get(key)
        if v is not None and type(v) is not int:
            _int(d, key, lo=None)
    for key in _NUMBERS:
        v = get(key)
        if v is not None and (type(v) not in (int, float) or not 0 <= v < math.inf):
            _num(d, key)
    for key in _STRINGS:
        v = get(key)
        if v is not None and (type(v) is not str or len(v) > _MAX_TEXT):
            _str(d, key)
    for key in _BOOLS:
        v = get(key)
        if v is not None and type(v) is not bool:
            _bool(d, key)
    for key in _OBJECTS:
        v = get(key)
        if v is not None and type(v) is not dict:
            _obj(d, key)
    world = get("world_size")
    if world is not None and (type(world) is not int or world < 1):
        _int(d, "world_size", lo=1)
    if world is not None and world > MAX_RANKS:
        raise RecordError(f"world_size: {world} is more than any job has ({MAX_RANKS})")


def supersedes(
    new: HeartbeatRecord,
    old: HeartbeatRecord | None,
    *,
    old_start_ns: int | None = None,
    old_start_mono_ns: int | None = None,
) -> bool:
    """Does ``new`` replace ``old``, the latest accepted record of the same rank?

    - Another process of the rank (a restart): yes if it runs on another host (arrival
      order is all two hosts' clocks allow), else if it started no earlier than ``old``'s
      process: by the host's boot-relative monotonic clock when both records have it
      (``old_start_mono_ns`` with ``old_start_ns``, else ``old``'s own), so a wall
      clock stepped back (NTP) does not hide a restarted rank; earlier by that clock,
      only if the wall clock says the host rebooted since (a minute or more later);
      without it, by the wall clock (``old_start_ns``, else ``old``'s own time). A late
      line of a replaced process never brings it back.
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
        mono = old.monotonic_ns if old_start_ns is None else old_start_mono_ns
        if new.monotonic_ns is not None and mono is not None:
            if new.monotonic_ns > mono:
                return True
            # earlier by the boot clock: a late line of the replaced process, unless the
            # host rebooted since (its boot clock began again, its wall clock moved on)
            return new.wall_time_ns >= start + _REBOOT_MIN_NS
        return new.wall_time_ns >= start
    if old.event is Event.PROCESS_END:
        return old.synthesized and new.own_end
    return new.seq > old.seq
