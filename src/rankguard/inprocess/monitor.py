"""The launcher's view of in-process restarts (node 0's job monitor; no torch).

Ranks put an ``inprocess`` object in their heartbeat records: how many times they
re-entered and the last restart's cause and culprit, the same on every rank (the
wrapper's ranks agree on it through the store). :class:`InProcessRestarts` is an
:class:`~rankguard.heartbeat.api.Evaluator`: one ``inprocess_restart`` finding per
restart, whichever rank's record shows it first, and one ``restarts.jsonl`` line of
kind ``inprocess`` through ``on_restart``. Its status (``status.json["inprocess"]``) has
the count and the last restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rankguard.schema.findings import Finding, FindingType, Reason

if TYPE_CHECKING:
    from rankguard.heartbeat.rules import RankState

__all__ = ["InProcessRestarts"]

_REASONS = {
    "exception": Reason.INPROCESS_EXCEPTION,
    "soft_timeout": Reason.INPROCESS_HANG,
}
_SEEN_MAX = 4096  # restart ids remembered (a long job restarts far fewer times)


class InProcessRestarts:
    """Evaluator: a finding and a ``restarts.jsonl`` line per in-process restart."""

    name = "inprocess"

    def __init__(
        self, run_id: str, on_restart: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.run_id = run_id
        self.on_restart = on_restart
        self.total = 0
        self.last: dict[str, Any] | None = None
        self._seen: dict[str, None] = {}  # insertion-ordered set of restart ids

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        out: list[Finding] = []
        for state in ranks.values():
            rec = state.record
            info = rec.inprocess if rec is not None else None
            last = info.get("last") if isinstance(info, dict) else None
            if info is None or not isinstance(last, dict):
                continue
            rid = last.get("id")
            if not isinstance(rid, str) or rid in self._seen:
                continue
            self._seen[rid] = None
            if len(self._seen) > _SEEN_MAX:
                self._seen.pop(next(iter(self._seen)))
            out.append(self._finding(ranks, state, info, last))
        return out

    def _finding(
        self,
        ranks: Mapping[int, RankState],
        seen_on: RankState,
        info: dict[str, Any],
        last: dict[str, Any],
    ) -> Finding:
        culprit = last.get("culprit")
        state = ranks.get(culprit) if isinstance(culprit, int) else None
        state = state if state is not None and state.record is not None else seen_on
        rec = state.record
        assert rec is not None
        cause = str(last.get("cause") or "unknown")
        count = info.get("restarts") if isinstance(info.get("restarts"), int) else None
        message = (
            f"in-process restart {count}: {cause} on rank {culprit} "
            f"({last.get('culprit_host') or rec.hostname}): {last.get('message') or '-'}; "
            "every rank re-entered the training function in the same processes"
        )
        self.total += 1
        self.last = {"restarts": count, **last}
        entry = {
            "schema_version": 1,
            "kind": "inprocess",
            "run_id": self.run_id,
            "restart": count,
            "cause": cause,
            "rank": culprit,
            "reason": _REASONS.get(cause, Reason.INPROCESS_OTHER).value,
            "message": last.get("message"),
            "id": last.get("id"),
        }
        if self.on_restart is not None:
            self.on_restart(entry)
        return Finding.build(
            FindingType.INPROCESS_RESTART,
            _REASONS.get(cause, Reason.INPROCESS_OTHER),
            run_id=self.run_id,
            rank=culprit if isinstance(culprit, int) else state.rank,
            message=message[:4000],
            record=rec,
            process_liveness=state.liveness,
            gpu_progress=state.progress,
            detail={"inprocess": {"restarts": count, **last}},
        )

    def status(self) -> dict[str, Any] | None:
        if not self.total:
            return None
        return {"restarts": self.total, "last": self.last}
