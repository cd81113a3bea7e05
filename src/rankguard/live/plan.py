"""The launcher's decision when worker processes end: replace them live, or restart.

Pure logic (no store, no processes): :func:`decide` takes what the agent saw (the
workers that ended, the standbys waiting, whether the script declared its state) and
returns who replaces whom, or the one reason why live recovery cannot apply (the group
restart of torch elastic then, as without standbys). :class:`Assignment` is the record
the launcher hands a standby through the store, checked on the way in.
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, field

__all__ = ["LIVE_CAUSE", "Assignment", "Ended", "LiveDecision", "Resumed", "decide", "ended_how"]

MAX_RECORD_BYTES = 4096
"""A record longer than this is not one of ours."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A worker process of this node that ended."""

    local_rank: int  # torch elastic's slot of the process
    rank: int | None  # the training rank it held (None: a standby that never took one)
    pid: int
    exit_code: int
    error_file: bool  # it wrote torch elastic's error file (a Python error escaped)


@dataclass(frozen=True, slots=True)
class Assignment:
    """Standby ``standby_pid`` takes training rank ``rank`` (``local_rank`` on its node)
    of ``lost_pid``, lost at ``fault_t`` (unix seconds) for ``cause``."""

    rank: int
    local_rank: int
    lost_pid: int
    standby_pid: int
    cause: str
    fault_t: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Assignment:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("live assignment: too long")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("live assignment: not an object")
        try:
            out = cls(
                rank=int(data["rank"]),
                local_rank=int(data["local_rank"]),
                lost_pid=int(data["lost_pid"]),
                standby_pid=int(data["standby_pid"]),
                cause=str(data["cause"])[:200],
                fault_t=float(data["fault_t"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"live assignment: {exc}") from None
        if out.rank < 0 or out.local_rank < 0:
            raise ValueError("live assignment: negative rank")
        return out


@dataclass(frozen=True, slots=True)
class Resumed:
    """The newcomer's first completed step after it took its rank."""

    t: float  # unix seconds
    step: int  # the step every rank continued after
    steps_redone: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Resumed:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("live resumed record: too long")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("live resumed record: not an object")
        try:
            out = cls(
                t=float(data["t"]), step=int(data["step"]), steps_redone=int(data["steps_redone"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"live resumed record: {exc}") from None
        if out.steps_redone < 0:
            raise ValueError("live resumed record: negative steps_redone")
        return out


@dataclass(frozen=True, slots=True)
class LiveDecision:
    """``pairs``: (lost, standby) to replace; ``restart``: why the group restarts
    instead (None: live recovery applies to every loss)."""

    pairs: list[tuple[Ended, int]] = field(default_factory=list)  # (lost, standby local rank)
    restart: str | None = None


def ended_how(exit_code: int) -> str:
    """``SIGKILL``, ``exit code 124``: how a process ended."""
    if exit_code < 0:
        try:
            return signal.Signals(-exit_code).name
        except ValueError:
            return f"signal {-exit_code}"
    return f"exit code {exit_code}"


def decide(
    lost: list[Ended],
    standbys: list[int],
    *,
    declared: bool,
    stopping: str | None = None,
) -> LiveDecision:
    """Who replaces whom among ``lost`` (training ranks whose process ended with a
    non-zero status), with the waiting ``standbys`` (their local ranks, in the order
    they are to be used). ``declared``: the script declared its state
    (:func:`~rankguard.live.state.live_state`). ``stopping``: the launcher is stopping
    the job (a signal, preemption, an abort): no recovery, and why."""
    if not lost:
        return LiveDecision()
    names = ", ".join(f"rank {e.rank} ({ended_how(e.exit_code)})" for e in lost)
    if stopping:
        return LiveDecision(restart=f"{names} lost while {stopping}")
    raised = [e for e in lost if e.error_file]
    if raised:
        return LiveDecision(
            restart=f"rank {raised[0].rank} ended with a Python error (its error file): "
            "the script failed, not only its process"
        )
    if not declared:
        return LiveDecision(
            restart=f"{names} lost, but the script declares no live state "
            "(rankguard.inprocess.live_state): a standby could not get it"
        )
    if len(standbys) < len(lost):
        left = "no standby left" if not standbys else f"only {len(standbys)} standby(s) left"
        return LiveDecision(restart=f"{names} lost and {left} on this node")
    return LiveDecision(pairs=list(zip(lost, standbys[: len(lost)], strict=True)))


LIVE_CAUSE = "rank_lost"
"""The in-process round's cause when a standby replaced a lost rank (the launcher writes
that recovery's ``restarts.jsonl`` line, of kind ``live_recovery``)."""
