"""The ``rerun`` block of a heartbeat record: what a rank's rerun state machine tells the
monitor (its outcomes, which become findings, and its determinism statistics).

The block is cumulative: ``events`` holds the rank's latest :data:`MAX_EVENTS` outcomes,
each with a per-process ``seq``, so a monitor that missed a record (or reads only the
process's last one) still sees every outcome exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from rankguard.schema.jsontypes import JsonObject

__all__ = ["MAX_EVENTS", "RerunBlock", "RerunEvent", "RerunOutcome"]

MAX_EVENTS = 16


class RerunOutcome(str, Enum):
    TRANSIENT = "transient_fault"  # a different result in place: continue
    PERSISTENT = "persistent_fault"  # the same result in place: checkpoint, exit 16
    VALIDATION_FAILED = "validation_failed"  # a different result on other hardware: exit 17
    REPRODUCIBLE = "reproducible_fault"  # the same result on other hardware: data or model


@dataclass(frozen=True, slots=True, kw_only=True)
class RerunEvent:
    seq: int
    outcome: RerunOutcome
    iteration: int
    check: str  # the failed check's message
    message: str
    initial: float | None = None  # the first result (max over its elements)
    rerun: float | None = None  # the re-run's result
    faulty_hostname: str | None = None  # the first run's host (validation_failed)
    faulty_gpu: str | None = None  # the first run's GPU (ordinal or UUID)
    same_hardware: bool | None = None  # the re-run from checkpoint ran where the first did
    action: str | None = None  # continue, exit_16, exit_17, stop, skip

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "seq": self.seq,
            "outcome": self.outcome.value,
            "iteration": self.iteration,
            "check": self.check,
            "message": self.message,
        }
        for key in ("initial", "rerun"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v if math.isfinite(v) else str(v)  # JSON has no NaN
        for key in ("faulty_hostname", "faulty_gpu", "same_hardware", "action"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v
        return out

    @classmethod
    def from_dict(cls, d: Any) -> RerunEvent:
        if not isinstance(d, dict):
            raise ValueError("rerun.events: each event must be an object")
        seq, iteration = d.get("seq"), d.get("iteration")
        if type(seq) is not int or type(iteration) is not int:
            raise ValueError("rerun.events: seq and iteration must be integers")
        try:
            outcome = RerunOutcome(d.get("outcome"))
        except ValueError:
            raise ValueError(f"rerun.events: unknown outcome {d.get('outcome')!r:.40}") from None
        for key in ("check", "message"):
            if not isinstance(d.get(key), str) or len(d[key]) > 1000:
                raise ValueError(f"rerun.events: {key} must be a string (<= 1000 chars)")
        return cls(
            seq=seq,
            outcome=outcome,
            iteration=iteration,
            check=d["check"],
            message=d["message"],
            initial=_float(d.get("initial")),
            rerun=_float(d.get("rerun")),
            faulty_hostname=_text(d, "faulty_hostname"),
            faulty_gpu=_text(d, "faulty_gpu"),
            same_hardware=d.get("same_hardware")
            if isinstance(d.get("same_hardware"), bool)
            else None,
            action=_text(d, "action"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RerunBlock:
    """``rerun``: the rank's latest outcomes and determinism statistics."""

    name: ClassVar[str] = "rerun"
    flat: ClassVar[bool] = False
    mode: str
    reruns: int = 0  # iterations re-run so far by this process
    events: tuple[RerunEvent, ...] = ()
    stats: dict[str, float] = field(default_factory=dict)  # check -> largest relative diff

    def to_dict(self) -> JsonObject:
        return {
            "mode": self.mode,
            "reruns": self.reruns,
            "events": [e.to_dict() for e in self.events],
            "stats": dict(self.stats),
        }

    @classmethod
    def from_dict(cls, d: Any) -> RerunBlock:
        """ValueError names what is wrong."""
        if not isinstance(d, dict):
            raise ValueError("rerun: expected an object")
        mode, reruns = d.get("mode"), d.get("reruns", 0)
        if not isinstance(mode, str):
            raise ValueError("rerun.mode: expected a string")
        if type(reruns) is not int or reruns < 0:
            raise ValueError("rerun.reruns: expected an integer >= 0")
        events = d.get("events") or []
        if not isinstance(events, list) or len(events) > MAX_EVENTS:
            raise ValueError(f"rerun.events: a list of at most {MAX_EVENTS} events")
        stats = d.get("stats") or {}
        if not isinstance(stats, dict):
            raise ValueError("rerun.stats: expected an object")
        clean_stats = {}
        for key, value in stats.items():
            v = _float(value)
            if v is None:
                raise ValueError(f"rerun.stats.{key:.40}: expected a number")
            clean_stats[str(key)] = v
        return cls(
            mode=mode,
            reruns=reruns,
            events=tuple(RerunEvent.from_dict(e) for e in events),
            stats=clean_stats,
        )


def _float(v: Any) -> float | None:
    if v is None:
        return None
    if type(v) in (int, float):
        return float(v)
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    raise ValueError(f"rerun: expected a number, got {v!r:.40}")


def _text(d: JsonObject, key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > 1000:
        raise ValueError(f"rerun.events: {key} must be a string (<= 1000 chars)")
    return v
