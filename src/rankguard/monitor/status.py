"""Building ``status.json`` (a :class:`~rankguard.schema.status.StatusDoc`) from the
rules' rank states, and the rows of ``status_ranks.json``.

Up to ``heartbeat.status_rank_rows`` ranks the status lists every rank; a larger job gets
counts over every rank and the rows of the ``status_worst_ranks`` worst only
(:func:`worst_ranks`), every rank then in ``status_ranks.json`` (:func:`detail_rows`,
written off the scan by the monitor's thread).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import Any

from rankguard.monitor.agree import finished_before_stop
from rankguard.monitor.rules import HeartbeatRules, Liveness, Progress, RankState
from rankguard.monitor.tally import NOTABLE, Tally, notable
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.status import RankDetail, RankRow, StatusSummary

__all__ = [
    "DETAIL_COLUMNS",
    "DetailSnapshot",
    "counts",
    "detail_rows",
    "detail_snapshot",
    "job_state",
    "n_ranks",
    "rank_row",
    "worst_of",
    "worst_ranks",
]

#: The columns of ``status_ranks.json``'s rows (the keys of a status.json rank row).
DETAIL_COLUMNS = (
    "rank",
    "pid",
    "hostname",
    "node_rank",
    "local_rank",
    "process_liveness",
    "gpu_progress",
    "iteration",
    "iteration_source",
    "progress_seq",
    "phase",
    "checkpoint_active",
    "heartbeat_age_s",
    "progress_age_s",
    "active_findings",
    "blocked_by",
)

#: One rank as the scan saw it, for the detail thread (formatted off the scan).
DetailSnapshot = tuple[Any, ...]


def rank_row(s: RankState) -> RankRow:
    rec = s.record
    if rec is None:  # a rank not seen yet: the same keys as a seen one
        return RankRow(
            rank=s.rank,
            pid=s.pid,
            process_liveness=s.liveness.value,
            gpu_progress=s.progress.value,
            heartbeat_age_s=_round(s.heartbeat_age_s),
            progress_age_s=_round(s.progress_age_s),
            gpu_health=s.gpu_health,
        )
    return RankRow(
        rank=s.rank,
        pid=s.pid,
        hostname=rec.hostname,
        node_rank=rec.node_rank,
        local_rank=rec.local_rank,
        process_liveness=s.liveness.value,
        gpu_progress=s.progress.value,
        iteration=rec.iteration,
        iteration_source=rec.iteration_source,
        progress_seq=rec.progress_seq,
        phase=rec.phase,
        phases_seen=list(s.phases_seen),
        checkpoint_active=rec.checkpoint_active,
        heartbeat_age_s=_round(s.heartbeat_age_s),
        progress_age_s=_round(s.progress_age_s),
        progress_source=rec.progress_source,
        perf=_perf_row(rec.perf),
        gpu=rec.gpu,
        gpu_health=s.gpu_health,
        exit=rec.exit,
        active_findings=sorted(t.value for t in s.reported),
        blocked_by=list(s.blocked_by),
    )


def n_ranks(rules: HeartbeatRules) -> int:
    """Ranks the status speaks of: the job's world, or more when more were seen."""
    return max(rules.world_size(), rules.top_rank + 1)


def counts(
    rules: HeartbeatRules, rows_max: int, worst_max: int
) -> tuple[list[RankRow], StatusSummary, RankDetail]:
    """The listed rows, the summary counts and whether every rank is listed."""
    world = rules.world_size()
    total = n_ranks(rules)
    complete = total <= rows_max
    tally = rules.tally
    tally.update(rules.ranks)
    if complete:
        rows = [rank_row(rules.ranks.get(r) or RankState(rank=r)) for r in range(total)]
        liveness = Counter(r.process_liveness for r in rows)
        progress = Counter(r.gpu_progress for r in rows)
        active = sum(len(r.active_findings) for r in rows)
    else:  # a large job: counts over every rank (kept up to date), rows of the worst only
        liveness, progress = _first_seen_order(rules.ranks.values(), tally)
        unseen = total - len(rules.ranks)
        if unseen:
            liveness[Liveness.NOT_OBSERVED.value] += unseen
            progress[Progress.NOT_OBSERVED.value] += unseen
        active = tally.findings
        rows = [rank_row(s) for s in worst_of(rules, worst_max)]
    summary = StatusSummary(
        ranks_expected=world,
        ranks_observed=tally.observed,
        process_liveness=dict(liveness),  # type: ignore[arg-type]
        gpu_progress=dict(progress),  # type: ignore[arg-type]
        findings_total=rules.findings_total,
        findings_active=active,
    )
    return rows, summary, RankDetail(complete=complete, listed=len(rows))


def _first_seen_order(
    states: Iterable[RankState], tally: Tally
) -> tuple[Counter[str | None], Counter[str | None]]:
    """The kept counts, each in the order its values first appear among the ranks (as
    counted over every rank: status.json's keys keep their order). The walk ends once
    every value counted was met: at the first rank when all ranks agree."""
    live_left = {k for k, n in tally.liveness.items() if n}
    prog_left = {k for k, n in tally.progress.items() if n}
    live_order: list[Liveness] = []
    prog_order: list[Progress] = []
    for s in states:
        if not (live_left or prog_left):
            break
        if s.liveness in live_left:
            live_left.discard(s.liveness)
            live_order.append(s.liveness)
        if s.progress in prog_left:
            prog_left.discard(s.progress)
            prog_order.append(s.progress)
    liveness: Counter[str | None] = Counter(
        {k.value: tally.liveness[k] for k in (*live_order, *live_left)}
    )
    progress: Counter[str | None] = Counter(
        {k.value: tally.progress[k] for k in (*prog_order, *prog_left)}
    )
    return liveness, progress


def job_state(
    rules: HeartbeatRules,
    summary: StatusSummary,
    n_rows: int,
    *,
    ended: bool = False,
    outcome: str | None = None,
) -> str:
    """The job's state word (``status.json["state"]``). ``ended``: the launcher's run
    is over, so the state is a final one (:data:`~rankguard.schema.status.FINAL_STATES`):
    ``outcome``, the launcher's word, where the ranks' own ends do not say (``failed``
    when it said nothing and not every rank completed)."""
    completed = summary.gpu_progress.get(Progress.COMPLETED.value, 0)
    if rules.shutdown is not None and completed != n_rows:
        return "stopped"
    if rules.first_failure is not None or (ended and outcome == "failed"):
        return "failed"
    if ended and outcome == "stopped" and not _finished(rules):
        return "stopped"  # preempted, or a straggler's agreed stop: unfinished
    if n_rows and completed == n_rows:
        return "completed"
    if ended:
        return outcome or "failed"
    if summary.findings_active:
        return "degraded"
    if summary.process_liveness.get(Liveness.ALIVE.value, 0) == 0:
        return "starting"
    return "running"


def _finished(rules: HeartbeatRules) -> bool:
    """Every rank finished training and exited 0 on its own, none at the stop request:
    a stop step agreed after the preemption signal or a straggler came too late."""
    records = [s.record for s in rules.ranks.values() if s.record is not None]
    return finished_before_stop(records, len(rules.ranks))


def worst_ranks(states: Iterable[RankState], n: int) -> list[RankState]:
    """The ``n`` ranks that most need a look, worst first: with an active finding,
    then stale, stalled or ended in error, then blocked by another rank, then the
    longest without progress (of equal ages, the lower rank first)."""
    if n <= 0:
        return []
    states = list(states) if not isinstance(states, list | tuple) else states
    picked = heapq.nsmallest(n, [s for s in states if notable(s)], key=_badness)
    if len(picked) < n:
        chosen = {s.rank for s in picked}
        rest = heapq.nlargest(
            n - len(picked),
            (s for s in states if s.rank not in chosen and s.progress_age_s is not None),
            key=_longer_without_progress,
        )
        picked += rest
    return picked


def worst_of(rules: HeartbeatRules, n: int) -> list[RankState]:
    """:func:`worst_ranks` of every rank of ``rules``, from its counts kept up to date
    (:class:`~rankguard.monitor.tally.Tally`): the notable ranks, then the longest
    without progress by their progress anchors, without a pass over every rank."""
    if n <= 0:
        return []
    tally, ranks = rules.tally, rules.ranks
    tally.update(ranks)
    if rules.due_ranks.pending():  # a rank's ages wait for its evaluation: every rank
        return worst_ranks(ranks.values(), n)
    picked = heapq.nsmallest(n, [ranks[r] for r in tally.notable], key=_badness)
    if len(picked) < n:
        picked += tally.longest_without_progress(ranks, n - len(picked), {s.rank for s in picked})
    return picked


def _longer_without_progress(s: RankState) -> tuple[float, int]:
    return s.progress_age_s or 0.0, -s.rank  # (ties: the lower rank first)


def detail_snapshot(rules: HeartbeatRules) -> list[DetailSnapshot]:
    """What the detail thread needs of every rank, taken during the scan (at 100,000
    ranks, in the scan that may be naming a hang: each rank's two ages in one call, the
    states' names looked up, not read from the enums)."""
    live, prog = _LIVENESS_NAMES, _PROGRESS_NAMES
    return [
        (
            rank,
            s.pid,
            s.record,
            live[s.liveness],
            prog[s.progress],
            *s.both_ages(),
            sorted(t.value for t in s.reported) if s.active else [],
            list(s.blocked_by) if s.blocked_by else [],
        )
        for rank, s in rules.ranks.items()
    ]


_LIVENESS_NAMES = {m: m.value for m in Liveness}
_PROGRESS_NAMES = {m: m.value for m in Progress}


def detail_rows(snapshot: list[DetailSnapshot], total: int) -> list[list[Any]]:
    """``status_ranks.json``'s rows: one list a rank (index = rank), nulls for a rank
    not seen yet."""
    by_rank: list[list[Any] | None] = [None] * total
    for rank, pid, rec, live, prog, hb_age, prog_age, active, blocked in snapshot:
        if rank >= total:
            continue
        by_rank[rank] = [
            rank,
            pid,
            rec.hostname if rec else None,
            rec.node_rank if rec else None,
            rec.local_rank if rec else None,
            live,
            prog,
            rec.iteration if rec else None,
            rec.iteration_source if rec else None,
            rec.progress_seq if rec else None,
            rec.phase if rec else None,
            rec.checkpoint_active if rec else False,
            _round(hb_age),
            _round(prog_age),
            active,
            blocked,
        ]
    empty = [None] * (len(DETAIL_COLUMNS) - 1)
    return [row if row is not None else [rank, *empty] for rank, row in enumerate(by_rank)]


def _badness(s: RankState) -> tuple[int, float, int]:
    """Sort key, worst first (see :func:`worst_ranks`)."""
    if s.active:
        tier = 0
    elif s.liveness is Liveness.STALE or s.progress in NOTABLE:
        tier = 1
    else:
        tier = 2
    return tier, -(s.progress_age_s or s.heartbeat_age_s or 0.0), s.rank


def _perf_row(perf: Any) -> JsonObject | None:
    if not isinstance(perf, dict):
        return None
    return {k: v for k, v in perf.items() if k != "windows"} or None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
