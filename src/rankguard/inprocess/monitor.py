"""The launcher's view of in-process restarts (node 0's job monitor; no torch).

Ranks put an ``inprocess`` block (:class:`~rankguard.schema.blocks.InProcessBlock`) in
their heartbeat records: how many times they
re-entered and the last restart's cause and culprit, the same on every rank (the
wrapper's ranks agree on it through the store). :class:`InProcessRestarts` is an
:class:`~rankguard.monitor.api.Evaluator`: one ``inprocess_restart`` finding per
restart, whichever rank's record shows it first, and one ``restarts.jsonl`` line of
kind ``inprocess`` through ``on_restart``. Its status (``status.json["inprocess"]``) has
the count and the last restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rankguard.live.plan import LIVE_CAUSE, LIVE_GROW_CAUSE, LIVE_SHRINK_CAUSE
from rankguard.monitor.blockeval import BlockEvaluator
from rankguard.schema.blocks import InProcessBlock, InProcessRestart
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.restarts import RestartEntry

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["InProcessRestarts"]

_REASONS = {
    "exception": Reason.INPROCESS_EXCEPTION,
    "soft_timeout": Reason.INPROCESS_HANG,
    LIVE_CAUSE: Reason.LIVE_REPLACED,
    LIVE_SHRINK_CAUSE: Reason.LIVE_SHRUNK,
    LIVE_GROW_CAUSE: Reason.LIVE_GREW,
}
_LIVE_CAUSES = (LIVE_CAUSE, LIVE_SHRINK_CAUSE, LIVE_GROW_CAUSE)
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
        state = ranks.get(culprit) if culprit is not None else None
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
        if self.on_restart is not None and cause not in _LIVE_CAUSES:
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
