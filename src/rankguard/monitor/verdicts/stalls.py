"""Name the culprit of a stall, not its victims.

In a synchronous job one stuck rank stops every other rank at its next collective, so
all of them stop progressing. A stalled rank gets its own ``gpu_progress_timeout`` only
when no other rank is already the known cause (stale, failed, or flagged as stalled) and
it is among the furthest behind; the others are marked stalled with ``blocked_by``
naming the culprits. When all stalled ranks are equally far (a hang before the
collective, a collective hang), all of them are reported, unless the evidence tells them
apart: ranks behind in the sequence of collectives, else ranks outside any collective,
are the culprits of those waiting in one. A victim whose culprits recovered gets one
more progress timeout to resume before it is reported in its own right. The first
culprit named carries the hang's class (:mod:`rankguard.monitor.hangclass`), and so does
the heartbeat timeout of a rank that stopped publishing inside a collective or behind
one its peers wait in (:func:`silent_hang`).
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import TYPE_CHECKING

from rankguard.monitor.hangclass import HangClass, classify, classify_silent
from rankguard.monitor.verdicts.evidence import (
    OVERSTAYED,
    behind_in_collectives,
    busy,
    collective_call,
    collectives,
    in_collective,
    phase_timeout,
    seq,
)
from rankguard.monitor.verdicts.findings import fire
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.findings import FindingType, Liveness, Progress, Reason

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["StallCulprits", "attach_hang", "silent_hang"]

_RANK = attrgetter("rank")
_DEAD = frozenset(
    {FindingType.PROCESS_TIMEOUT, FindingType.PROCESS_EXITED, FindingType.NODE_DISK_FULL}
)


class StallCulprits:
    """Due at every scan while a rank is stalled (a victim's grace runs on); not
    evaluated at all while none is."""

    __slots__ = ()

    def next_due(self, view: JobView, now: float) -> float:
        return -math.inf if view.stalled else math.inf

    def evaluate(self, view: JobView, now: float) -> list[Finding]:
        # one pass over the ranks: the stalled, those down (a rank whose heartbeats
        # are late is the likely cause too: its own heartbeat timeout names it if it
        # does not come back), those flagged as stalled, and the live
        stalled: list[RankState] = []
        down: list[int] = []
        flagged: list[tuple[int, int]] = []
        live: list[RankState] = []
        alive = Liveness.ALIVE
        for s in view.ranks.values():
            if s.stall is not None:
                stalled.append(s)
            active = s.active
            if active:
                if active & _DEAD or s.late:
                    down.append(s.rank)
                if FindingType.PROGRESS_TIMEOUT in active:
                    flagged.append((s.rank, seq(s)))
            elif s.late:
                down.append(s.rank)
            if s.liveness is alive:
                live.append(s)
        view.stalled.intersection_update(s.rank for s in stalled)  # drop reset ranks
        if not stalled:
            return []
        for s in stalled:  # culprits named, victims blocked: their states change here
            if s.progress is not Progress.STALLED:  # (stalled: notable whoever blocks it)
                view.recount(s.rank)
        # Furthest behind among live ranks: a stalled rank ahead of a live rank is
        # waiting for it, even before that rank crosses its own timeout (its records
        # may come later, through the relay of another node).
        lowest = min(seq(s) for s in live or stalled)
        # Equally far behind, but some ranks wait inside a collective and others do
        # not: those waiting wait for the others (a hang before the collective).
        behind = [t for t in live if seq(t) == lowest]
        # Who is behind in the sequence of collectives says it first (a rank that
        # entered collective N+1 waits on one that has not entered it); else the
        # ranks outside any collective (the recorder's status, the Python frame).
        lagging = behind_in_collectives(behind)
        outside = (
            lagging
            if lagging is not None
            else sorted(t.rank for t in behind if not in_collective(t))
        )
        behind_ranks = sorted(t.rank for t in behind)  # once, not once per stalled rank
        split = bool(outside) and len(outside) < len(behind)
        # Peers in a phase of their own (saving, evaluating) and within its timeout:
        # ranks waiting at the next collective meanwhile are blocked by them, not hung.
        # Once such a peer overstays (its own finding), they stay blocked by it. A peer
        # whose main thread waits inside a collective (a distributed save's all_gather)
        # is not busy with work of its own: it waits for the others, and a rank stuck
        # outside that collective is judged by its own timeout, not the peer's phase's.
        busy_ranks = [t for t in live if busy(t)]
        working = {t.rank for t in busy_ranks if not in_collective(t)}
        limits = {t.rank: phase_timeout(view.cadence, t) for t in busy_ranks}
        out: list[Finding] = []
        hang: list[HangClass | None] = []  # classified once, at the first hang named
        # busy ranks first: one that overstayed is named before those waiting on it
        busy_live = {t.rank for t in busy_ranks}
        stalled.sort(key=_RANK)
        if busy_live or any(st.liveness is not alive for st in stalled):
            stalled.sort(  # (stable: by rank within) busy() once per rank
                key=lambda st: not (st.rank in busy_live if st.liveness is alive else busy(st))
            )
        timed_out = FindingType.PROGRESS_TIMEOUT
        for s in stalled:
            if timed_out in s.active:
                continue
            # Culprits: ranks down, or flagged as stalled further behind than this one
            # (most scans of a hang have neither, nor busy ranks: no list built).
            others = [r for r in down if r != s.rank] if down else []
            if flagged:
                others += [r for r, at in flagged if r != s.rank and at < seq(s)]
            timeout, age = s.stall  # type: ignore[misc]
            waits_on = (
                [
                    t.rank
                    for t in busy_ranks
                    if t.rank != s.rank
                    and ((t.rank in working and age <= limits[t.rank]) or t.active & OVERSTAYED)
                ]
                if busy_ranks
                else None
            )
            if not others and waits_on and not busy(s):
                s.blocked_by = waits_on
                s.culprits_gone_at = None
                continue
            if not others and split and s.rank not in outside:
                others = outside
            if others or seq(s) > lowest:
                s.blocked_by = others or behind_ranks  # s is ahead: not among them
                s.culprits_gone_at = None
                continue
            if s.blocked_by:
                if s.culprits_gone_at is None:
                    s.culprits_gone_at = now
                if now - s.culprits_gone_at <= timeout:
                    continue
            fire(
                view.run_id,
                s,
                FindingType.PROGRESS_TIMEOUT,
                Reason.NOT_ADVANCING,
                timeout,
                age,
                out,
            )
            if not hang:
                hang.append(classify(*_places(live)))
            if hang[0] is not None:
                attach_hang(out[-1], hang[0])
        return out


def _places(
    ranks: list[RankState],
) -> tuple[dict[int, CollectivesBlock | None], dict[int, str], list[int]]:
    """Each rank's collectives block, the collective call its main frame is in, and the
    ranks waiting for peers by their frame only (point-to-point)."""
    blocks: dict[int, CollectivesBlock | None] = {}
    calls: dict[int, str] = {}
    p2p: list[int] = []
    for t in ranks:  # one pass (every rank of the job, at the scan that names a hang)
        blocks[t.rank] = block = collectives(t)
        if (op := collective_call(t)) is not None:
            calls[t.rank] = op
        if not (block is not None and block.inside) and in_collective(t):  # p2p_wait
            p2p.append(t.rank)
    return blocks, calls, p2p


def attach_hang(finding: Finding, hang: HangClass) -> None:
    """The hang's class on its finding: ``hang``, and one sentence of its message."""
    finding.detail["hang"] = hang.to_dict()
    finding.message = f"{finding.message}; {hang.line}"


def silent_hang(view: JobView) -> HangClass | None:
    """The hang's class when ranks stopped publishing (stale, or heartbeats late): every
    rank of the job compared, those by their last record; None unless every rank's
    place is known and says a hang that holds while they stay there."""
    ranks = [
        t
        for t in view.ranks.values()
        if t.record is not None and t.liveness in (Liveness.ALIVE, Liveness.STALE)
    ]
    world = view.world_size()
    if world < 2 or len(ranks) != world:
        return None
    silent = [t.rank for t in ranks if t.liveness is Liveness.STALE or t.late]
    blocks, calls, p2p = _places(ranks)
    return classify_silent(blocks, silent, calls, p2p)
