"""The in-process restart's decisions, as pure functions (no torch, no threads).

- :class:`RestartBudget`: how many re-entries are left (per window and in total);
- :class:`FaultReport` and :func:`choose_culprit`: every rank reports what it saw, and
  every rank picks the same culprit from the same reports;
- :func:`lost_ranks`: the ranks that leave with a rank that cannot re-enter
  (``granularity``);
- :func:`apply_environment` and :func:`timeout_problems`: what the wrapper sets and
  checks at start.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "CAUSES",
    "NCCL_ENV",
    "FaultReport",
    "RestartBudget",
    "apply_environment",
    "choose_culprit",
    "culprit_cause",
    "lost_ranks",
    "timeout_problems",
]

#: Why a rank left its round, most telling first (the culprit is chosen in this order).
CAUSES = ("exception", "soft_timeout", "collective_error", "interrupted")

#: Megatron Bridge's environment for in-process restart, set when the user has not.
NCCL_ENV = {
    "TORCH_CPP_LOG_LEVEL": "error",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0",
    "NCCL_NVLS_ENABLE": "0",
}


class RestartBudget:
    """At most ``per_window`` re-entries within any ``window`` seconds, and at most
    ``total`` (None: no cap) in the process's life."""

    def __init__(self, per_window: int, window: float, total: int | None = None) -> None:
        self.per_window = per_window
        self.window = window
        self.total = total
        self.used = 0
        self._times: deque[float] = deque()

    def spend(self, now: float) -> str | None:
        """Count one re-entry at ``now``; None if allowed, else why not (nothing spent)."""
        times = self._times
        while times and now - times[0] > self.window:
            times.popleft()
        if self.total is not None and self.used >= self.total:
            return f"max_iterations={self.total} in-process restarts used"
        if len(times) >= self.per_window:
            return (
                f"max_restarts_per_window={self.per_window} in-process restarts within "
                f"{self.window:g}s"
            )
        times.append(now)
        self.used += 1
        return None


MAX_REPORT_BYTES = 16 << 10
"""A fault report in the store longer than this is not one (a real one is < 3 KiB)."""
_BIG = 1 << 53


@dataclass(frozen=True, slots=True)
class FaultReport:
    """What one rank saw end its round (written to the round's store by each rank)."""

    rank: int
    cause: str  # one of CAUSES
    message: str
    hostname: str | None = None
    in_collective: bool = False  # the main thread was inside torch.distributed
    stuck_s: float = 0.0  # how long the main thread had run no Python when it ended

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FaultReport:
        """A rank's report read from the round's store (anyone who can reach the store
        can write it): ``ValueError`` for anything but a bounded report."""
        if len(text) > MAX_REPORT_BYTES:
            raise ValueError(f"fault report: {len(text)} bytes (at most {MAX_REPORT_BYTES})")
        try:
            d = json.loads(text)
        except RecursionError:
            raise ValueError("fault report: nested too deeply") from None
        if not isinstance(d, dict) or type(d.get("rank")) is not int:
            raise ValueError("fault report: expected an object with an integer rank")
        stuck = d.get("stuck_s")
        stuck_s = 0.0
        if type(stuck) is float or (type(stuck) is int and abs(stuck) < _BIG):
            stuck_s = float(stuck)
        cause = d.get("cause")
        if cause not in CAUSES:
            raise ValueError(f"fault report: unknown cause {cause!r:.40}")
        return cls(
            rank=d["rank"],
            cause=cause,
            message=str(d.get("message") or "")[:2000],
            hostname=d["hostname"][:253] if isinstance(d.get("hostname"), str) else None,
            in_collective=bool(d.get("in_collective")),
            stuck_s=stuck_s if math.isfinite(stuck_s) else 0.0,
        )


def _weight(report: FaultReport, stuck_after: float) -> tuple[int, float, int]:
    cause = report.cause
    if cause == "exception":
        kind = 0
    elif (
        cause in ("soft_timeout", "interrupted")
        and not report.in_collective
        and (report.stuck_s >= stuck_after)
    ):
        kind = 1  # stuck outside a collective: it holds the others up
    elif cause == "soft_timeout":
        kind = 2  # stuck inside a collective: waiting for someone
    elif cause == "collective_error":
        kind = 3
    else:
        kind = 4
    return kind, -report.stuck_s, report.rank


def choose_culprit(
    reports: Iterable[FaultReport], stuck_after: float = float("inf")
) -> FaultReport | None:
    """The rank that caused the round's end: an exception first, then a rank stuck
    outside a collective (for ``stuck_after`` seconds or more: its own soft timeout, or
    interrupted by a peer's while stuck), then one stuck inside a collective, then a
    failed collective, then the interrupted; the longest stuck, then the lowest rank
    among equals. Every rank gets the same answer from the same reports."""
    return min(reports, key=lambda r: _weight(r, stuck_after), default=None)


def culprit_cause(report: FaultReport, stuck_after: float) -> str:
    """The culprit's cause as reported: a rank interrupted by a peer's soft timeout while
    itself stuck outside a collective is the hang (``soft_timeout``)."""
    if _weight(report, stuck_after)[0] == 1:
        return "soft_timeout"
    return report.cause


def lost_ranks(missing: Iterable[int], granularity: str, hosts: Mapping[int, str]) -> list[int]:
    """The ranks out of the next round when ``missing`` cannot re-enter: those ranks
    (``rank``) or every rank of their hosts (``node``: a node-level fault, a NIC or a
    driver, usually takes all its ranks)."""
    gone = set(missing)
    if granularity == "node":
        bad_hosts = {hosts[r] for r in gone if r in hosts}
        gone |= {r for r, h in hosts.items() if h in bad_hosts}
    return sorted(gone)


#: Read once, as torch is imported: set in a rank that imported torch, it does nothing.
AT_IMPORT = frozenset({"TORCH_CPP_LOG_LEVEL"})


def apply_environment(
    environ: MutableMapping[str, str], *, torch_imported: bool = False
) -> tuple[list[str], list[str]]:
    """Set Megatron Bridge's variables the user has not set: (lines saying what was
    done, problems). ``rankguard run`` does it in the ranks' environment before they
    start; the wrapper again in the rank, where a variable read at torch's import
    (``TORCH_CPP_LOG_LEVEL``: c10d's warning at each timed-out store wait) is a problem
    once torch is imported."""
    out: list[str] = []
    problems: list[str] = []
    for name, value in NCCL_ENV.items():
        if name in environ:
            if environ[name] != value:
                out.append(f"{name}={environ[name]} kept (set by the user; recommended {value})")
            else:
                out.append(f"{name}={value}")
        else:
            environ[name] = value
            if torch_imported and name in AT_IMPORT:
                problems.append(
                    f"{name}={value} set too late to take effect: torch is already imported "
                    "(it reads the variable at import); set it in the launch environment "
                    "(rankguard run does), or c10d logs a warning at each timed-out store wait"
                )
            else:
                out.append(f"{name}={value} set")
    return out, problems


def timeout_problems(
    *, backend: str, pg_timeout: float, hard_timeout: float, environ: Mapping[str, Any]
) -> tuple[list[str], list[str]]:
    """(fine, problems) about the timeouts that can end a rank before the in-process
    restart recovers it. On NCCL the watchdog kills the process when a collective
    outlasts the process-group timeout, and when its heartbeat monitor sees no progress
    for ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``: both must exceed ``hard_timeout``. On gloo a
    timed-out collective raises in the rank, which is what the wrapper recovers from."""
    fine: list[str] = []
    problems: list[str] = []
    if backend == "nccl":
        line = f"process-group timeout {pg_timeout:g}s vs hard_timeout {hard_timeout:g}s"
        (fine if pg_timeout > hard_timeout else problems).append(
            line + (": OK" if pg_timeout > hard_timeout else ": NCCL kills the rank first")
        )
        raw = environ.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "480")
        try:
            watchdog = float(raw)
        except ValueError:
            problems.append(f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={raw!r} is not a number")
        else:
            line = f"NCCL watchdog heartbeat {watchdog:g}s vs hard_timeout {hard_timeout:g}s"
            (fine if watchdog > hard_timeout else problems).append(
                line
                + (": OK" if watchdog > hard_timeout else ": the watchdog kills the rank first")
            )
        if environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") in ("1", "3"):
            problems.append(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING="
                f"{environ['TORCH_NCCL_ASYNC_ERROR_HANDLING']} tears the process down on a "
                "collective error: set it to 2 (cleanup only) or 0"
            )
    else:
        fine.append(
            f"gloo: a collective stuck {pg_timeout:g}s raises in the rank and is recovered "
            f"in-process (hard_timeout {hard_timeout:g}s ends the process)"
        )
    return fine, problems
