"""Node 0: the ranks' rerun outcomes (the ``rerun`` block of their heartbeats) become
findings, and their determinism statistics a ``status.json`` section. No torch.

Each outcome is reported once: the block repeats a process's latest outcomes with a
per-process ``seq``, so the evaluator remembers ``(rank, pid, seq)``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankguard.monitor.blockeval import BlockEvaluator
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.rerun import RerunBlock, RerunEvent, RerunOutcome

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.schema.records import HeartbeatRecord

__all__ = ["RerunEvaluator"]

logger = logging.getLogger(__name__)

_TYPES = {
    RerunOutcome.TRANSIENT: (FindingType.RERUN_TRANSIENT_FAULT, Reason.RERUN_DIFFERED_IN_PLACE),
    RerunOutcome.PERSISTENT: (FindingType.RERUN_PERSISTENT_FAULT, Reason.RERUN_SAME_IN_PLACE),
    RerunOutcome.VALIDATION_FAILED: (
        FindingType.RERUN_VALIDATION_FAILED,
        Reason.RERUN_DIFFERED_ELSEWHERE,
    ),
    RerunOutcome.REPRODUCIBLE: (
        FindingType.RERUN_REPRODUCIBLE_FAULT,
        Reason.RERUN_SAME_ELSEWHERE,
    ),
}


class RerunEvaluator(BlockEvaluator[RerunBlock]):
    """A monitor evaluator: its status is ``status.json``'s ``rerun``."""

    name = "rerun"
    block = RerunBlock

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self._seen: dict[tuple[int, int], int] = {}  # (rank, pid) -> highest seq reported
        self._blocks: dict[int, RerunBlock] = {}  # rank -> latest block

    def on_block(
        self, rank: int, state: RankState, block: RerunBlock, ranks: Mapping[int, RankState]
    ) -> list[Finding]:
        rec = state.record
        assert rec is not None
        self._blocks[rank] = block
        key = (rank, rec.pid)
        seen = self._seen.get(key, 0)
        out = [self._finding(rank, rec, e) for e in block.events if e.seq > seen]
        if block.events:
            self._seen[key] = max(seen, max(e.seq for e in block.events))
        return out

    def status(self) -> JsonObject | None:
        if not self._blocks:
            return None
        stats: dict[str, float] = {}
        for block in self._blocks.values():
            for check, diff in block.stats.items():
                stats[check] = max(stats.get(check, 0.0), diff)
        first = next(iter(self._blocks.values()))
        return {
            "mode": first.mode,
            "reruns": max(b.reruns for b in self._blocks.values()),
            "max_relative_diff": {check: diff for check, diff in stats.items()},
            "worst_rank": {check: self._worst(check) for check in stats},
        }

    def _worst(self, check: str) -> int:
        def diff(rank: int) -> float:
            return self._blocks[rank].stats.get(check, -1.0)

        return max(self._blocks, key=diff)

    def _finding(self, rank: int, rec: HeartbeatRecord, event: RerunEvent) -> Finding:
        ftype, reason = _TYPES[event.outcome]
        detail: JsonObject = {
            "rerun_outcome": event.outcome.value,
            "check": event.check,
            "initial_result": _json_number(event.initial),
            "rerun_result": _json_number(event.rerun),
            "rank_action": event.action,
        }
        if event.faulty_hostname is not None:
            detail["faulty_hostname"] = event.faulty_hostname
            detail["faulty_gpu"] = event.faulty_gpu
        if event.same_hardware is not None:
            detail["same_hardware"] = event.same_hardware
        return Finding.build(
            ftype,
            reason,
            run_id=self.run_id,
            rank=rank,
            message=event.message,
            record=rec,
            iteration=event.iteration,
            exit=rec.exit,
            detail=detail,
        )


def _json_number(v: float | None) -> float | str | None:
    if v is None:
        return None
    return v if v == v and abs(v) != float("inf") else str(v)
