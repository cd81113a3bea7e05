"""The shape node 0's block-driven evaluators share (no torch).

The rerun, in-process restart and preemption evaluators each read one heartbeat block
(:mod:`rankguard.schema.blocks`) from every rank's latest record and turn what is new in
it into findings. :class:`BlockEvaluator` is that loop once: it reads the block typed
(:func:`~rankguard.schema.blocks.read_block`), counts a block that does not validate
(``bad_blocks``, the last reason in ``last_bad``: records are validated on ingest, so
only a bug or a foreign writer gets there) and skips it, hands each good one to
:meth:`BlockEvaluator.on_block`, then asks :meth:`BlockEvaluator.after_blocks` for the
findings that need every rank's view. A subclass sets ``name`` (its ``status.json``
key) and ``block`` (the block type) and overrides what it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rankguard.schema.blocks import HeartbeatBlock, read_block
from rankguard.schema.findings import Finding

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["BlockEvaluator"]

B = TypeVar("B", bound=HeartbeatBlock)


class BlockEvaluator(Generic[B]):
    """An :class:`~rankguard.monitor.api.Evaluator` over one heartbeat block."""

    name: str = ""
    block: type[B]

    def __init__(self) -> None:
        self.bad_blocks = 0
        self.last_bad: str | None = None

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        out: list[Finding] = []
        for rank, state in ranks.items():
            rec = state.record
            if rec is None:
                continue
            try:
                block = read_block(rec, self.block)
            except ValueError as exc:
                self.bad_blocks += 1
                self.last_bad = f"rank {rank}: {exc}"
                continue
            if block is not None:
                out += self.on_block(rank, state, block, ranks)
        out += self.after_blocks(now, ranks)
        return out

    def on_block(
        self, rank: int, state: RankState, block: B, ranks: Mapping[int, RankState]
    ) -> list[Finding]:
        """Findings from one rank's block (``state.record`` is set)."""
        return []

    def after_blocks(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        """Findings once every rank's block was seen this scan."""
        return []

    def status(self) -> Any:
        return None
