"""Live recovery's series: status.json's ``live`` block (node 0's launcher) as
Prometheus families.

One source: every value is read from :class:`~rankguard.schema.restarts.LiveBlock`
(the standbys waiting, used and started, and each rank a standby replaced with its
cause and, once the newcomer completed a step, its cost), so the exporter and
``rankguard status`` never disagree. The block lists every recovery of the run, so the
counters are totals since the launcher started and never go down. A job without
standbys has no ``live`` block and none of these series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rankguard.schema.restarts import LiveBlock

__all__ = ["LIVE_METRICS", "live_series"]

_RUN = ("run_id",)

#: (name, kind, help, labels): the catalogue's rows for live recovery.
LIVE_METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "rankguard_live_recoveries_total",
        "counter",
        "Ranks a standby took over (live recovery, no group restart) since the launcher "
        "started, by the finding that caused it (rank_process_exited, or the finding "
        "fault tolerance ended the rank for).",
        (*_RUN, "finding_type"),
    ),
    (
        "rankguard_live_last_recovery_seconds",
        "gauge",
        "The lost process's end (seen by the launcher; a hung rank's once fault tolerance "
        "killed it) -> the newcomer's first completed step, of the latest live recovery "
        "whose step was seen (absent before one).",
        _RUN,
    ),
    (
        "rankguard_live_recovery_seconds_total",
        "counter",
        "Fault -> next step summed over the live recoveries whose step was seen "
        "(divide by rankguard_live_recoveries_resumed_total for the mean).",
        _RUN,
    ),
    (
        "rankguard_live_recoveries_resumed_total",
        "counter",
        "Live recoveries whose newcomer completed a step (the ones with a cost).",
        _RUN,
    ),
    (
        "rankguard_live_steps_redone_total",
        "counter",
        "Completed steps the ranks computed again after live recoveries.",
        _RUN,
    ),
    (
        "rankguard_live_standbys_configured",
        "gauge",
        "Standby ranks each node starts with the group (--standby-ranks).",
        _RUN,
    ),
    (
        "rankguard_live_standbys_waiting",
        "gauge",
        "Standbys waiting now to take a lost rank (0 while the job runs: the next loss "
        "restarts the group).",
        _RUN,
    ),
    (
        "rankguard_live_standbys_used_total",
        "counter",
        "Standbys that took a lost rank's place since the launcher started.",
        _RUN,
    ),
    (
        "rankguard_live_standbys_started_total",
        "counter",
        "Standbys started to refill used ones since the launcher started.",
        _RUN,
    ),
)

_Put = Callable[[str, Iterable[str], "float | None"], None]


def live_series(put: _Put, block: LiveBlock | None) -> None:
    """The live recovery families of one status (nothing without a ``live`` block)."""
    if block is None:
        return
    put("rankguard_live_standbys_configured", [], _float(block.standbys_per_node))
    put("rankguard_live_standbys_waiting", [], float(block.waiting))
    put("rankguard_live_standbys_used_total", [], float(block.used))
    put("rankguard_live_standbys_started_total", [], float(block.started))
    by_cause: dict[str, int] = {}
    costs: list[float] = []
    redone = 0
    for r in block.replaced:
        cause = r.cause or "unknown"
        by_cause[cause] = by_cause.get(cause, 0) + 1
        if r.recovery_s is not None:
            costs.append(r.recovery_s)
        redone += r.steps_redone or 0
    for cause, count in sorted(by_cause.items()):
        put("rankguard_live_recoveries_total", [cause], float(count))
    put("rankguard_live_recoveries_resumed_total", [], float(len(costs)))
    put("rankguard_live_recovery_seconds_total", [], float(sum(costs)))
    put("rankguard_live_last_recovery_seconds", [], costs[-1] if costs else None)
    put("rankguard_live_steps_redone_total", [], float(redone))


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)
