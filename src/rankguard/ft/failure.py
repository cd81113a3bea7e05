"""``WorkerFailure``: the first failure of a failed worker group, as the agent saw it
(the root cause on this node): the rank, its local rank and pid, the exit code, the
signal that killed it and the end of its error (from the error file torch elastic's
``@record`` wrote).

The launcher's agent keeps it while the group restarts
(``RankguardAgent.last_failure``); the restart policy fingerprints it
(:func:`rankguard.ft.evidence.failure_fingerprint`), the exclusion counts it, the
launcher's verdict names it. ``to_dict`` is the record as the exclusion reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankguard.schema.findings import FindingType
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import RestartCause

__all__ = ["WorkerFailure"]


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """One failed worker: ``signal`` its name when a signal killed it (exit code < 0),
    ``error`` the last 2000 characters of its error, ``error_file`` where torch elastic
    wrote it."""

    rank: int
    local_rank: int
    pid: int
    exit_code: int
    signal: str | None = None
    error: str | None = None
    error_file: str | None = None

    finding_type = FindingType.WORKER_FAILED.value
    """What the failure is, in the findings' words (``worker_failed``)."""

    def to_dict(self) -> JsonObject:
        return {
            "finding_type": self.finding_type,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "error": self.error,
            "error_file": self.error_file,
        }

    def cause(self) -> RestartCause:
        """What the group restarts for when no finding was acted on."""
        return RestartCause(
            finding_type=self.finding_type,
            rank=self.rank,
            pid=self.pid,
            exit_code=self.exit_code,
            signal=self.signal,
            error=self.error,
        )
