"""The launcher's view of in-process restarts (node 0's job monitor; no torch).

Ranks put an ``inprocess`` block (:class:`~rankguard.schema.blocks.InProcessBlock`) in
their heartbeat records: how many times they
re-entered and the last restart's cause and culprit, the same on every rank (the
wrapper's ranks agree on it through the store). :class:`InProcessRestarts` is an
:class:`~rankguard.monitor.api.Evaluator`: one ``inprocess_restart`` finding per
restart, whichever rank's record shows it first, and one ``restarts.jsonl`` line of
kind ``inprocess`` through ``on_restart``. It reads every record as the scan reads it
(``on_record``), not only each rank's latest: a rank that re-entered and was killed at
once (its standby's first record read in the same scan, or read first) has written the
restart in one record only. Its status (``status.json["inprocess"]``) has the count and
the last restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rankguard.live.plan import LIVE_CAUSE, SHRINK_CAUSE
from rankguard.monitor.blockeval import BlockEvaluator
from rankguard.monitor.rules import RankState
from rankguard.schema.blocks import InProcessBlock, InProcessRestart, read_block
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.restarts import RestartEntry

__all__ = ["InProcessRestarts"]

_REASONS = {
    "exception": Reason.INPROCESS_EXCEPTION,
    "soft_timeout": Reason.INPROCESS_HANG,
    LIVE_CAUSE: Reason.LIVE_REPLACED,
}
#: the keys of its ``restarts.jsonl`` line, in order (the launcher adds ``wall_time``)
_ENTRY_KEYS: tuple[str, ...] = ("schema_version", "kind", "run_id", "restart", "cause")
_ENTRY_KEYS += ("rank", "reason", "message", "id")
_SEEN_MAX = 4096  # restart ids remembered (a long job restarts far fewer times)


class InProcessRestarts(BlockEvaluator[InProcessBlock]):
    """Evaluator: a finding and a ``restarts.jsonl`` line per in-process restart."""

    name = "inprocess"
    block = InProcessBlock

    def __init__(
        self, run_id: str, on_restart: Callable[[RestartEntry], None] | None = None
    ) -> None:
        super().__init__()
        self.run_id = run_id
        self.on_restart = on_restart
        self.total = 0
        self.last: dict[str, Any] | None = None
        self._seen: dict[str, None] = {}  # insertion-ordered set of restart ids
        # restarts read since the last scan, by id: the record each was first seen in
        # and its block
        self._read: dict[str, tuple[HeartbeatRecord, InProcessBlock]] = {}

    def on_record(self, record: HeartbeatRecord) -> None:
        """Every record as read: a restart not seen yet is kept for the scan's end."""
        info = record.inprocess
        raw = info.get("last") if info else None
        rid = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(rid, str) or rid in self._seen or rid in self._read:
            return  # none, or known: most records repeat the last restart
        try:
            block = read_block(record, InProcessBlock)
        except ValueError as exc:
            self.bad_blocks += 1
            self.last_bad = f"rank {record.rank}: {exc}"
            return
        if block is not None and block.last is not None and len(self._read) < _SEEN_MAX:
            self._read[block.last.id] = (record, block)

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        out: list[Finding] = []
        read, self._read = self._read, {}
        # in the order they happened (the scan may read a newcomer's file first)
        for record, block in sorted(read.values(), key=lambda rb: rb[1].restarts):
            state = ranks.get(record.rank)
            if state is None or state.pid != record.pid or state.record is None:
                # the process is gone or replaced: the record that said it
                state = RankState(rank=record.rank, pid=record.pid, record=record)
            out += self.on_block(record.rank, state, block, ranks)
        return out + super().evaluate(now, ranks)

    def on_block(
        self,
        rank: int,
        state: RankState,
        block: InProcessBlock,
        ranks: Mapping[int, RankState],
    ) -> list[Finding]:
        last = block.last
        if last is None or last.id in self._seen:
            return []
        self._seen[last.id] = None
        if len(self._seen) > _SEEN_MAX:
            self._seen.pop(next(iter(self._seen)))
        return [self._finding(ranks, state, block, last)]

    def _finding(
        self,
        ranks: Mapping[int, RankState],
        seen_on: RankState,
        info: InProcessBlock,
        restart: InProcessRestart,
    ) -> Finding:
        culprit = restart.culprit
        # the culprit's own record when another rank showed it (a culprit of the rank
        # that showed it: that record, its process maybe replaced since)
        state = ranks.get(culprit) if culprit is not None and culprit != seen_on.rank else None
        state = state if state is not None and state.record is not None else seen_on
        rec = state.record
        assert rec is not None
        last = restart.to_dict()
        cause = restart.cause or "unknown"
        count = info.restarts
        message = (
            f"in-process restart {count}: {cause} on rank {culprit} "
            f"({restart.culprit_host or rec.hostname}): {restart.message or '-'}; "
            "every rank re-entered the training function in the same processes"
        )
        self.total += 1
        self.last = {"restarts": count, **last}
        entry = RestartEntry(
            kind="inprocess",
            run_id=self.run_id,
            restart=count,
            cause=cause,
            rank=culprit,
            reason=_REASONS.get(cause, Reason.INPROCESS_OTHER).value,
            message=restart.message,
            extra={"id": restart.id},
            keys=_ENTRY_KEYS,
        )
        # a live recovery's line (kind ``live_recovery``) is the launcher's: one line each
        if self.on_restart is not None and cause not in (LIVE_CAUSE, SHRINK_CAUSE):
            self.on_restart(entry)
        return Finding.build(
            FindingType.INPROCESS_RESTART,
            _REASONS.get(cause, Reason.INPROCESS_OTHER),
            run_id=self.run_id,
            rank=culprit if culprit is not None else state.rank,
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
