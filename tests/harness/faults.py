"""A deterministic fault injector for ranks as threads: ``fail_at(rank, step, kind)``.

A rank's loop calls :meth:`FaultInjector.at_step` at the start of each step (the
harness's :meth:`~tests.harness.job.RankContext.train` does); the faults armed for that
rank and step act there, on the rank's own thread:

- ``raise``: :class:`InjectedFault` is raised (the rank fails, its session closes
  unclean with the error);
- ``stall``: the rank stops before the step's compute and collective, in
  :func:`stalled_rank` (its innermost Python frame), until ``seconds`` passed or the
  job ends;
- ``slow``: from this step on every step's compute takes ``factor`` times as long
  (:meth:`FaultInjector.slowdown`);
- ``stop_publishing``: the rank's heartbeat thread blocks in a block source (a stuck
  heartbeat thread: no more records) until the job ends; training goes on;
- ``nan``: the step's loss is NaN (:meth:`FaultInjector.loss`);
- ``kill``: as SIGKILL looks from outside: no more records and no ``process_end``; the
  rank's thread ends (:class:`Killed`) without closing its session.

Every wait is bounded (``seconds``, and the job's ``release`` event set at teardown),
except a killed rank's heartbeat thread, which stays blocked as a dead process's would.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankguard.session import Session

__all__ = ["KINDS", "Fault", "FaultInjector", "InjectedFault", "Killed", "stalled_rank"]

KINDS = ("raise", "stall", "slow", "stop_publishing", "nan", "kill")


class InjectedFault(RuntimeError):
    """What a ``raise`` fault raises in the rank's thread."""


class Killed(BaseException):
    """A ``kill`` fault: the rank's thread ends as if the process had been killed."""


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str
    seconds: float = 30.0  # stall: how long at most
    factor: float = 3.0  # slow: compute time multiplier


def stalled_rank(release: threading.Event, seconds: float) -> None:
    """A stalled rank, as the heartbeat's ``main_frame`` shows it (``... in
    stalled_rank``): C sleeps, so this is the innermost Python frame."""
    deadline = time.monotonic() + seconds
    while not release.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)


@dataclass
class FaultInjector:
    """The faults of one job; ``release`` ends every stall and stuck heartbeat."""

    release: threading.Event = field(default_factory=threading.Event)
    faults: list[Fault] = field(default_factory=list)
    fired: list[Fault] = field(default_factory=list)
    _slow: dict[int, float] = field(default_factory=dict)
    _nan: set[tuple[int, int]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_at(self, rank: int, step: int, kind: str, **kw: Any) -> Fault:
        """Arm ``kind`` for ``rank`` at the start of ``step`` (1-based, as progress
        counts). ``seconds`` (stall), ``factor`` (slow)."""
        if kind not in KINDS:
            raise ValueError(f"fault kind {kind!r}: one of {', '.join(KINDS)}")
        fault = Fault(rank, step, kind, **kw)
        self.faults.append(fault)
        return fault

    def at_step(self, rank: int, step: int, session: Session | None) -> None:
        """Act on the faults armed for ``rank`` at ``step`` (on the rank's thread)."""
        for fault in self.faults:
            if fault.rank != rank or fault.step != step:
                continue
            with self._lock:
                self.fired.append(fault)
            if fault.kind == "raise":
                raise InjectedFault(f"injected fault on rank {rank} at step {step}")
            if fault.kind == "stall":
                stalled_rank(self.release, fault.seconds)
            elif fault.kind == "slow":
                self._slow[rank] = fault.factor
            elif fault.kind == "nan":
                self._nan.add((rank, step))
            elif fault.kind in ("stop_publishing", "kill") and session is not None:
                self._stick_heartbeat(session, forever=fault.kind == "kill")
                if fault.kind == "kill":
                    raise Killed(f"rank {rank} killed at step {step}")

    def slowdown(self, rank: int) -> float:
        """The factor this rank's compute is slowed by (1.0: not slowed)."""
        return self._slow.get(rank, 1.0)

    def loss(self, rank: int, step: int, value: float) -> float:
        """``value``, or NaN where a ``nan`` fault is armed for this rank and step."""
        return float("nan") if (rank, step) in self._nan else value

    def _stick_heartbeat(self, session: Session, *, forever: bool) -> None:
        """The heartbeat thread blocks in a block source from its next record on (a
        stuck thread: what a rank whose publishing stopped looks like from outside), until
        the job ends; ``forever`` (a killed rank): never again, as a dead process's thread
        (an idle daemon thread, blocked on an event nothing sets)."""
        release = threading.Event() if forever else self.release
        rank_thread = threading.current_thread()

        def stuck() -> None:
            if threading.current_thread() is not rank_thread:  # the session's close: not
                release.wait()
            return None

        session.add_heartbeat_block(stuck)
