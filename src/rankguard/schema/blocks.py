"""Declared heartbeat blocks: the typed objects a rank's components add to its records.

A heartbeat record has the publisher's own fields (identity, progress, phase) and one
*block* per component that has something to tell node 0: ``rerun``, ``inprocess``,
``preempt``, ``perf``, ``straggler``, ``ft_stats``, ``collectives``, the ``exit`` of
``process_end``, and the tracker's checkpoint count. Each block is a small type with a
unique ``name``, ``to_dict()`` (what the record carries under that name) and
``from_dict()`` (validation on the way in: ``ValueError`` naming the field).
:data:`BLOCKS` is the one list of them; :func:`read_block` is how a reader gets one from
a record, typed, so no reader parses a block by hand or digs in
``HeartbeatRecord.extra``.

A *flat* block (``flat = True``) is a group of top-level record fields rather than a
nested object (the checkpoint count, written with the tracker's progress fields).

The rank side adds a block with ``session.add_heartbeat_block(source)``: ``source`` is
called on the heartbeat thread before each record and returns the block (or None: no
block in that record). Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar, runtime_checkable

from rankguard.schema.coerce import as_dict, as_int, as_list, as_number, as_str
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.jsontypes import JsonInput, JsonObject
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.rerun import RerunBlock

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "BLOCKS",
    "EXIT_CLEAN_DEFAULT",
    "REGISTRY",
    "BlockSource",
    "CheckpointBlock",
    "CollectivesBlock",
    "ExitBlock",
    "FtStatsBlock",
    "HeartbeatBlock",
    "InProcessBlock",
    "InProcessRestart",
    "NvrxBlock",
    "PerfBlock",
    "PreemptBlock",
    "RerunBlock",
    "StragglerBlock",
    "block_registry",
    "exit_clean",
    "fields_source",
    "read_block",
]


@runtime_checkable
class HeartbeatBlock(Protocol):
    """What every block is: a unique ``name`` and a typed round trip."""

    name: ClassVar[str]
    flat: ClassVar[bool]

    def to_dict(self) -> JsonObject: ...

    @classmethod
    def from_dict(cls, d: Any) -> Self: ...


B = TypeVar("B", bound=HeartbeatBlock)

#: What ``session.add_heartbeat_block`` takes: called before each record.
BlockSource = Callable[[], "HeartbeatBlock | None"]


def _obj(d: object, where: str) -> JsonObject:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
    return d


def _opt_int(d: JsonInput, key: str, where: str, *, lo: int | None = 0) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if type(v) is not int or (lo is not None and v < lo):
        bound = f" >= {lo}" if lo is not None else ""
        raise ValueError(f"{where}.{key}: expected an integer{bound}")
    return v


def _opt_num(d: JsonInput, key: str, where: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}.{key}: expected a finite number >= 0")
    return float(v)


def _opt_str(d: JsonInput, key: str, where: str, *, limit: int = 4096) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError(f"{where}.{key}: expected a string (<= {limit} chars)")
    return v


def _bool(d: JsonInput, key: str, where: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if type(v) is not bool:
        raise ValueError(f"{where}.{key}: expected true or false")
    return v


# ---- in-process restart ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class InProcessRestart:
    """The last in-process restart, the same on every rank (agreed through the store)."""

    id: str  # unique per restart in the job: the evaluator reports each id once
    round: int | None = None
    cause: str | None = None
    culprit: int | None = None
    culprit_host: str | None = None
    message: str | None = None
    wall_time_ns: int | None = None

    def to_dict(self) -> JsonObject:
        """The fields that are known (an unknown culprit is left out, not null)."""
        out: JsonObject = {"id": self.id}
        for key in ("round", "cause", "culprit", "culprit_host", "message", "wall_time_ns"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v
        return out

    @classmethod
    def from_dict(cls, d: Any) -> InProcessRestart:
        w = "inprocess.last"
        d = _obj(d, w)
        rid = d.get("id")
        if not isinstance(rid, str) or not rid or len(rid) > 1000:
            raise ValueError(f"{w}.id: expected a non-empty string")
        return cls(
            id=rid,
            round=_opt_int(d, "round", w),
            cause=_opt_str(d, "cause", w),
            culprit=_opt_int(d, "culprit", w),
            culprit_host=_opt_str(d, "culprit_host", w),
            message=_opt_str(d, "message", w),
            wall_time_ns=_opt_int(d, "wall_time_ns", w),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InProcessBlock:
    """``inprocess``: how many times this rank re-entered, whether it is recovering now,
    how long its re-entry barrier may wait for a lost peer's standby that is on its way
    (``awaiting_standby_s``: the barrier's timeout; None when it waits for none), and the
    last restart."""

    name: ClassVar[str] = "inprocess"
    flat: ClassVar[bool] = False
    restarts: int = 0
    recovering: bool = False
    awaiting_standby_s: float | None = None
    last: InProcessRestart | None = None

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"restarts": self.restarts, "recovering": self.recovering}
        if self.awaiting_standby_s is not None:
            out["awaiting_standby_s"] = self.awaiting_standby_s
        if self.last is not None:
            out["last"] = self.last.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any) -> InProcessBlock:
        d = _obj(d, "inprocess")
        last = d.get("last")
        return cls(
            restarts=_opt_int(d, "restarts", "inprocess") or 0,
            recovering=_bool(d, "recovering", "inprocess", False),
            awaiting_standby_s=_opt_num(d, "awaiting_standby_s", "inprocess"),
            last=InProcessRestart.from_dict(last) if last is not None else None,
        )


# ---- preemption ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptBlock:
    """``preempt``: whether the exit signal came to this rank, its shortest recent step
    (how far ahead node 0 puts the stop step), its saves' durations (the grace budget)
    and its last completed save a next run can load: the script's step
    (``saved_step``) and the training steps the rank had issued when that save's state
    was taken (``saved_seq``, an agreed stop step's numbering), and whether the script
    asks ``should_stop()`` (``asks_stop``: it leaves at the agreed step, not on its own
    at the signal)."""

    name: ClassVar[str] = "preempt"
    flat: ClassVar[bool] = False
    signal_received: bool = False
    asks_stop: bool = False
    step_min_s: float | None = None
    save_last_s: float | None = None
    save_max_s: float | None = None
    saved_step: int | None = None
    saved_seq: int | None = None

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"signal_received": self.signal_received}
        if self.asks_stop:
            out["asks_stop"] = True
        for key in ("step_min_s", "save_last_s", "save_max_s", "saved_step", "saved_seq"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v
        return out

    @classmethod
    def from_dict(cls, d: Any) -> PreemptBlock:
        d = _obj(d, "preempt")
        saved_step = _opt_int(d, "saved_step", "preempt")
        saved_seq = _opt_int(d, "saved_seq", "preempt")
        if (saved_step is None) != (saved_seq is None):
            raise ValueError("preempt.saved_step, preempt.saved_seq: expected both or neither")
        return cls(
            signal_received=_bool(d, "signal_received", "preempt", False),
            asks_stop=_bool(d, "asks_stop", "preempt", False),
            step_min_s=_opt_num(d, "step_min_s", "preempt"),
            save_last_s=_opt_num(d, "save_last_s", "preempt"),
            save_max_s=_opt_num(d, "save_max_s", "preempt"),
            saved_step=saved_step,
            saved_seq=saved_seq,
        )


# ---- checkpoints (flat: the tracker's progress fields) ---------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBlock:
    """The tracker's ``checkpoint_count``: how many of the rank's progress steps were
    saves (a save's end counts as progress; stop steps count training steps only)."""

    name: ClassVar[str] = "checkpoint"
    flat: ClassVar[bool] = True
    keys: ClassVar[tuple[str, ...]] = ("checkpoint_count",)  # its top-level fields
    checkpoint_count: int = 0

    def to_dict(self) -> JsonObject:
        return {"checkpoint_count": self.checkpoint_count}

    @classmethod
    def from_dict(cls, d: Any) -> CheckpointBlock:
        d = _obj(d, "checkpoint")
        return cls(checkpoint_count=_opt_int(d, "checkpoint_count", "checkpoint") or 0)

    def saves_in(self, progress_seq: int) -> int:
        """The saves among ``progress_seq`` progress steps (0 if the count is absurd)."""
        return self.checkpoint_count if self.checkpoint_count <= progress_seq else 0


# ---- process end -----------------------------------------------------------------------

#: A ``process_end`` whose ``exit`` does not say ``clean`` was a clean end: the rank's own
#: end record says ``clean: false`` whenever it knows better (an exception, a non-zero
#: exit, the hard timeout, an orphan), and a vanished process's synthesized end always
#: does. The heartbeat rules and the preemption evaluator both read it through
#: :func:`exit_clean`.
EXIT_CLEAN_DEFAULT = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitBlock:
    """``exit`` of a ``process_end``: clean or not, the exit code, the error, whether
    the process vanished (the end was written on its behalf), the training steps of
    this process when it left at a stop request (``stopped_at``: ``should_stop()`` said
    stop, or the script left after the preemption signal; absent when it ended on its
    own), and the monitor's notes on why it ended (``after_shutdown``,
    ``after_restart``, ``after_action``: a restart noted that never came,
    ``peers_ended_first``, ``on_full_disk``)."""

    name: ClassVar[str] = "exit"
    flat: ClassVar[bool] = False
    clean: bool = EXIT_CLEAN_DEFAULT
    exit_code: int | None = None
    error: str | None = None
    vanished: bool = False
    stopped_at: int | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "clean": self.clean,
            "exit_code": self.exit_code,
            "error": self.error,
        }
        if self.vanished:
            out["vanished"] = True
        if self.stopped_at is not None:
            out["stopped_at"] = self.stopped_at
        out.update(self.notes)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> ExitBlock:
        d = _obj(d, "exit")
        notes = {str(k): str(v) for k, v in d.items() if k not in _EXIT_KEYS and isinstance(v, str)}
        return cls(
            clean=_bool(d, "clean", "exit", EXIT_CLEAN_DEFAULT),
            exit_code=_opt_int(d, "exit_code", "exit", lo=None),
            error=_opt_str(d, "error", "exit", limit=1 << 16),
            vanished=_bool(d, "vanished", "exit", False),
            stopped_at=_opt_int(d, "stopped_at", "exit"),
            notes=notes,
        )


_EXIT_KEYS = frozenset({"clean", "exit_code", "error", "vanished", "stopped_at"})


def exit_clean(rec: HeartbeatRecord) -> bool:
    """Did ``rec``'s process end cleanly (the one default: :data:`EXIT_CLEAN_DEFAULT`)?"""
    info = rec.exit
    if not info:
        return EXIT_CLEAN_DEFAULT
    clean = info.get("clean")
    return EXIT_CLEAN_DEFAULT if clean is None else bool(clean)


# ---- blocks of the perf monitor, the straggler probe and the NVRx client ---------------


class PerfWindow(NamedTuple):
    """One perf window of a rank: its step, the script's iteration (None when unknown)
    and its step time in ms (the GPU's when measured). A tuple: node 0 reads 16 of them
    per rank per scan."""

    step: int
    iteration: int | None
    step_time_ms: float


def _perf_windows(raw: Any) -> tuple[PerfWindow, ...]:
    """``[[step, iteration, step_time_ms], ...]``; an item of another shape or type is
    left out (JSON's ints and floats, not bools)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) < 3:
            continue
        step, iteration, ms = item[0], item[1], item[2]
        if type(step) is not int or (iteration is not None and type(iteration) is not int):
            continue
        if type(ms) is float or type(ms) is int:
            out.append(PerfWindow(step, iteration, float(ms)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """``perf``: the perf monitor's latest window (step, iteration, step time, TFLOPS
    per GPU, MFU, memory) and its recent windows (the cross-rank step times). The record
    accepts any object here: a value of the wrong type reads as missing, never raises."""

    name: ClassVar[str] = "perf"
    flat: ClassVar[bool] = False

    step: int | None = None
    iteration: int | None = None
    step_time_ms: float | None = None
    TFLOPS_per_GPU: float | None = None
    MFU: float | None = None
    memory_GB: float | None = None
    windows: tuple[PerfWindow, ...] = ()
    extra: JsonObject = field(default_factory=dict)  # keys of a newer writer

    def to_dict(self) -> JsonObject:
        return {
            "step": self.step,
            "iteration": self.iteration,
            "step_time_ms": self.step_time_ms,
            "TFLOPS_per_GPU": self.TFLOPS_per_GPU,
            "MFU": self.MFU,
            "memory_GB": self.memory_GB,
            "windows": [list(w) for w in self.windows],
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        d = _obj(d, cls.name)
        return cls(
            step=as_int(d.get("step")),
            iteration=as_int(d.get("iteration")),
            step_time_ms=as_number(d.get("step_time_ms")),
            TFLOPS_per_GPU=as_number(d.get("TFLOPS_per_GPU")),
            MFU=as_number(d.get("MFU")),
            memory_GB=as_number(d.get("memory_GB")),
            windows=_perf_windows(d.get("windows")),
            extra={k: v for k, v in d.items() if k not in _PERF_KEYS},
        )


_PERF_KEYS = frozenset(
    {"step", "iteration", "step_time_ms", "TFLOPS_per_GPU", "MFU", "memory_GB", "windows"}
)


@dataclass(frozen=True, slots=True)
class StragglerBlock:
    """``straggler``: the median of the own-compute samples since the last record (ms),
    how many, and how they were timed (``compute_section_cuda``, ``compute_section_cpu``,
    ``step_cpu``). The record accepts any object here: a value of the wrong type reads
    as missing, never raises."""

    name: ClassVar[str] = "straggler"
    flat: ClassVar[bool] = False

    compute_ms: float | None = None
    samples: int | None = None
    method: str | None = None
    extra: JsonObject = field(default_factory=dict)  # keys of a newer writer

    def to_dict(self) -> JsonObject:
        return {
            "compute_ms": self.compute_ms,
            "samples": self.samples,
            "method": self.method,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        d = _obj(d, cls.name)
        return cls(
            compute_ms=as_number(d.get("compute_ms")),
            samples=as_int(d.get("samples")),
            method=as_str(d.get("method")),
            extra={k: v for k, v in d.items() if k not in _STRAGGLER_KEYS},
        )


_STRAGGLER_KEYS = frozenset({"compute_ms", "samples", "method"})


@dataclass(frozen=True, slots=True)
class FtStatsBlock:
    """``ft_stats``: the section durations learned timeouts are made of (the setup, the
    longest step and checkpoint, the longest gap between heartbeats, in seconds) and
    how many steps and checkpoints they were taken over. The record accepts any object
    here: a value of the wrong type reads as missing, never raises."""

    name: ClassVar[str] = "ft_stats"
    flat: ClassVar[bool] = False

    setup_s: float | None = None
    step_max_s: float | None = None
    steps: int | None = None
    ckpt_max_s: float | None = None
    ckpts: int | None = None
    hb_gap_max_s: float | None = None
    extra: JsonObject = field(default_factory=dict)  # keys of a newer writer

    def to_dict(self) -> JsonObject:
        return {
            "setup_s": self.setup_s,
            "step_max_s": self.step_max_s,
            "steps": self.steps,
            "ckpt_max_s": self.ckpt_max_s,
            "ckpts": self.ckpts,
            "hb_gap_max_s": self.hb_gap_max_s,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        d = _obj(d, cls.name)
        return cls(
            setup_s=as_number(d.get("setup_s")),
            step_max_s=as_number(d.get("step_max_s")),
            steps=as_int(d.get("steps")),
            ckpt_max_s=as_number(d.get("ckpt_max_s")),
            ckpts=as_int(d.get("ckpts")),
            hb_gap_max_s=as_number(d.get("hb_gap_max_s")),
            extra={k: v for k, v in d.items() if k not in _FT_STATS_KEYS},
        )


_FT_STATS_KEYS = frozenset(
    {"setup_s", "step_max_s", "steps", "ckpt_max_s", "ckpts", "hb_gap_max_s"}
)


@dataclass(frozen=True, slots=True)
class NvrxBlock:
    """``nvrx``: the NVRx RankMonitorClient this rank serves (connections, heartbeats,
    section events, open sections, the timeouts the client calculated, the iterations
    it reported, the requests refused and the errors). The optional keys are written
    only when known. The record accepts any object here: a value of the wrong type
    reads as missing, never raises."""

    name: ClassVar[str] = "nvrx"
    flat: ClassVar[bool] = False

    connections: int | None = None
    heartbeats: int | None = None
    section_events: int | None = None
    open_sections: tuple[str, ...] = ()
    calculated_timeouts: JsonObject | None = None
    init_iteration: int | None = None
    num_warmup_iters: int | None = None
    iteration: int | None = None
    refused: int | None = None  # written with errors, when either is not 0
    errors: int | None = None
    extra: JsonObject = field(default_factory=dict)  # keys of a newer writer

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "connections": self.connections,
            "heartbeats": self.heartbeats,
            "section_events": self.section_events,
            "open_sections": list(self.open_sections),
        }
        if self.calculated_timeouts is not None:
            out["calculated_timeouts"] = self.calculated_timeouts
        for key in ("init_iteration", "num_warmup_iters", "iteration"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.refused is not None or self.errors is not None:
            out["refused"], out["errors"] = self.refused, self.errors
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        d = _obj(d, cls.name)
        return cls(
            connections=as_int(d.get("connections")),
            heartbeats=as_int(d.get("heartbeats")),
            section_events=as_int(d.get("section_events")),
            open_sections=tuple(s for s in as_list(d.get("open_sections")) if isinstance(s, str)),
            calculated_timeouts=as_dict(d.get("calculated_timeouts")),
            init_iteration=as_int(d.get("init_iteration")),
            num_warmup_iters=as_int(d.get("num_warmup_iters")),
            iteration=as_int(d.get("iteration")),
            refused=as_int(d.get("refused")),
            errors=as_int(d.get("errors")),
            extra={k: v for k, v in d.items() if k not in _NVRX_KEYS},
        )


_NVRX_KEYS = frozenset(
    {
        "connections",
        "heartbeats",
        "section_events",
        "open_sections",
        "calculated_timeouts",
        "init_iteration",
        "num_warmup_iters",
        "iteration",
        "refused",
        "errors",
    }
)


# ---- the registry ----------------------------------------------------------------------

#: Every heartbeat block, in one place. A name appears once (:func:`block_registry`).
BLOCKS: tuple[type[HeartbeatBlock], ...] = (
    RerunBlock,
    InProcessBlock,
    PreemptBlock,
    CheckpointBlock,
    ExitBlock,
    PerfBlock,
    StragglerBlock,
    FtStatsBlock,
    NvrxBlock,
    CollectivesBlock,
)


def block_registry(
    blocks: tuple[type[HeartbeatBlock], ...] = BLOCKS,
) -> dict[str, type[HeartbeatBlock]]:
    """Name -> block type; ValueError when two blocks share a name (or one has none)."""
    out: dict[str, type[HeartbeatBlock]] = {}
    for cls in blocks:
        name = getattr(cls, "name", "")
        if not name:
            raise ValueError(f"{cls.__name__}: a heartbeat block needs a name")
        if name in out:
            raise ValueError(
                f"heartbeat block name {name!r} is used twice: "
                f"{out[name].__name__} and {cls.__name__}"
            )
        out[name] = cls
    return out


REGISTRY = block_registry()


def read_block(rec: HeartbeatRecord, cls: type[B]) -> B | None:
    """The block ``cls`` of ``rec``, typed; None when the record has none. ValueError
    (naming the field) for a block that does not validate."""
    if cls.flat:
        present = {}
        for key in getattr(cls, "keys", ()):
            v = getattr(rec, key, None) if key in _RECORD_FIELDS else rec.extra.get(key)
            if v is not None:
                present[key] = v
        return cls.from_dict(present) if present else None
    value = getattr(rec, cls.name, None) if cls.name in _RECORD_FIELDS else None
    if value is None:
        value = rec.extra.get(cls.name)
    return None if value is None else cls.from_dict(value)


def fields_source(cls: type[B], fields: Callable[[], JsonObject | None]) -> Callable[[], B | None]:
    """A block source from a component that returns ``{name: {...}}`` record fields
    (the perf monitor, the straggler probe, the section statistics)."""

    def source() -> B | None:
        out = fields()
        value = out.get(cls.name) if out else None
        return None if value is None else cls.from_dict(value)

    return source


#: The blocks ``HeartbeatRecord`` holds as its own fields (the rest sit in ``extra``).
_RECORD_FIELDS = frozenset(HeartbeatRecord.__dataclass_fields__) - {"extra"}
