"""The launcher's restart-or-stop step: after the worker group failed, read what the
attempt left (:mod:`rankguard.ft.evidence`), fingerprint it
(:mod:`rankguard.ft.fingerprint`), decide (:mod:`rankguard.ft.decide`) and record a
stop in ``restarts.jsonl`` (a restart is recorded in its own line, with its decision,
by the launcher's restart notification).

The agent calls :meth:`RestartPolicy.after_failure` from its monitoring step, before
torch elastic looks at the restart budget: a stop sets the budget to 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from rankguard.ft.decide import Decision, RestartDecider
from rankguard.ft.evidence import failure_fingerprint, read_attempt
from rankguard.ft.failure import WorkerFailure
from rankguard.schema.jsontypes import JsonInput, JsonObject

__all__ = ["STOP_KIND", "RestartPolicy", "stop_entry"]

logger = logging.getLogger(__name__)

STOP_KIND = "stop"
"""``restarts.jsonl``'s ``kind`` of a stop decision (no restart happened)."""


def stop_entry(run_id: str, decision: Decision, when: float) -> JsonObject:
    """The ``restarts.jsonl`` line of a stop decision."""
    fp = decision.fingerprint
    return {
        "schema_version": 1,
        "kind": STOP_KIND,
        "run_id": run_id,
        "restart": None,
        "wall_time": datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="milliseconds"),
        "cause": fp.finding_type or "worker_failed",
        "rank": fp.rank,
        "reason": decision.rule.value,
        "message": decision.line(),
        "exit_code": fp.exit_code,
        "stack_dump": None,
        **decision.to_dict(),
    }


class RestartPolicy:
    """One launch's decisions. ``write`` appends a ``restarts.jsonl`` line (node 0's
    launcher writes that file; elsewhere it is None and the stop is only said)."""

    def __init__(
        self,
        decider: RestartDecider,
        run_dir: str | Path,
        run_id: str,
        write: Callable[[JsonObject], None] | None = None,
    ) -> None:
        self.decider = decider
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.write = write
        self.last: Decision | None = None

    def after_failure(
        self,
        failure: WorkerFailure,
        cause: JsonInput | None,
        pids: Mapping[int, int],
    ) -> Decision:
        """Decide after the group of ``pids`` (rank -> pid) failed with root cause
        ``failure``; ``cause`` is the finding the launcher acted on, if any."""
        attempt = read_attempt(self.run_dir, pids)
        fp = failure_fingerprint(failure, cause, attempt)
        decision = self.last = self.decider.decide(fp, attempt.reached)
        if decision.stop:
            logger.debug("rankguard: %s", decision.line())  # said once, by the launcher
            if self.write is not None:
                try:
                    self.write(stop_entry(self.run_id, decision, time.time()))
                except Exception:
                    logger.exception("rankguard: the stop decision was not recorded")
        return decision
