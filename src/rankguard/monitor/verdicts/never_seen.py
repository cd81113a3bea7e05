"""Ranks that never published a heartbeat: after ``initial_process_timeout_s`` from the
first rank seen (the rendezvous may take long on many nodes), or from the monitor's start
while no rank has published (with ``--preload``: from the ranks' fork, and not while the
launcher waits for its fork server's imports, which it says itself), the message says
which; one finding each when few, else one finding for all of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.findings import unseen_finding

if TYPE_CHECKING:
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["NEVER_SEEN_EACH", "NEVER_SEEN_SAMPLE", "NeverSeen"]

#: Up to this many ranks never seen get a finding each; more get one finding together.
NEVER_SEEN_EACH = 8
NEVER_SEEN_SAMPLE = 32  # ranks named in that finding's detail


class NeverSeen:
    """Due once the initial timeout has run from the anchor, then at every scan (the
    world may grow as records say its size)."""

    __slots__ = ("upto",)

    def __init__(self) -> None:
        self.upto = 0  # ranks below it were seen or reported never seen

    def retire(self, world: int) -> None:
        """The group re-formed with ``world`` ranks: a rank past it may be new again."""
        self.upto = min(self.upto, world)

    def next_due(self, view: JobView, now: float) -> float:
        return view.anchor() + view.cadence.initial_process_timeout_s

    def evaluate(self, view: JobView, now: float) -> list[Finding]:
        waited = now - view.anchor()
        if waited <= view.cadence.initial_process_timeout_s:
            return []
        world = view.world_size()
        if world <= self.upto:
            return []
        first, self.upto = self.upto, world
        count, sample = 0, list[int]()
        ranks = view.ranks
        for rank in range(first, world):
            if rank not in ranks:
                count += 1
                if len(sample) < NEVER_SEEN_SAMPLE:
                    sample.append(rank)
        if count <= NEVER_SEEN_EACH:
            return [_one(view, rank, waited) for rank in sample]
        return [_many(view, count, sample, waited)]


def _since(view: JobView) -> str:
    """What the wait counts from, as the findings say it."""
    if view.any_seen():
        return "the job's first rank was seen"
    if view.ranks_forked():
        return "the ranks were forked (--preload's fork server had imported)"
    return "the monitor started (no rank of the job has published yet)"


def _many(view: JobView, count: int, sample: list[int], waited: float) -> Finding:
    timeout = view.cadence.initial_process_timeout_s
    shown = ", ".join(map(str, sample[:8]))
    more = f" and {count - 8} more" if count > 8 else ""
    finding = unseen_finding(
        view.run_id,
        sample[0],
        timeout,
        waited,
        message=f"{count} ranks have published no heartbeat {waited:.1f}s after "
        f"{_since(view)} (ranks {shown}{more}; "
        f"initial_process_timeout_s={timeout:g})",
    )
    finding.detail.update(never_seen_count=count, never_seen_ranks=[*sample])
    return finding


def _one(view: JobView, rank: int, waited: float) -> Finding:
    timeout = view.cadence.initial_process_timeout_s
    return unseen_finding(
        view.run_id,
        rank,
        timeout,
        waited,
        message=f"rank {rank} has published no heartbeat {waited:.1f}s after "
        f"{_since(view)} (initial_process_timeout_s={timeout:g})",
    )
