"""Node 0: scores from the ranks' heartbeats, findings and reports (no collective).

Every ``report_time_interval`` seconds, from each rank's compute time per step: the
ranks' own marked compute sections (``rg.compute()``) where the script has them, else
how long each rank waited in collectives (:mod:`rankguard.straggler.waits`: no code
needed, a rank slowed inside forward or backward shows), else each rank's own CPU time
per step:

- relative score = best rank's time / this rank's time (1.0 for the fastest rank); from
  collective waits, the median of the faster half of the ranks' times / this rank's
  (at most 1.0): one rank's sampled estimate can be too fast, and the best of several
  is;
- individual score = this rank's best reported time so far / its time now (1.0 when it
  is as fast as it ever was); from sampled collective waits, the median of its recent
  estimates / its time now (one interval's estimate can be far off, and the lowest of
  many noisy estimates is faster than the rank ever was).

A report whose interval held a rank's start (its first heartbeats, or a restarted rank's)
is not made where the waits would score the ranks: their peers waited for the last rank
to arrive, and each rank's own CPU per step is its start-up's, so neither says how fast
it computes (scored from the CPU, a healthy rank's first score was 0.006-0.5).

A score below its threshold in ``consecutive_reports`` reports in a row is a straggler
(hysteresis: a score wavering around the threshold from one report to the next is
noise, not a slow GPU): one ``straggler_detected`` finding per episode, naming rank,
node, host, GPU and both scores; the episode ends at the first report above it. Each
report (best and worst ``num_gpu_perf_scores_to_print`` ranks) goes to the log and
``status.json``.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from rankguard.schema.blocks import StragglerBlock, read_block
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.statusblocks import StragglerRow, StragglersBlock, StragglerScores
from rankguard.straggler.config import StragglerConfig
from rankguard.straggler.nvrx_lines import score_lines, straggler_warnings
from rankguard.straggler.waits import RankWaits, WaitShares

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["StragglerDetector"]

logger = logging.getLogger(__name__)

# the estimates from sampled waits a rank's individual reference is the median of
_RECENT_ESTIMATES = 16


class _Score(TypedDict):
    """One rank's scores in a report (a :class:`StragglerRow` of the ``stragglers``
    block)."""

    rank: int
    node_rank: int | None
    hostname: str | None
    pid: int
    gpu: dict[str, Any] | None  # the heartbeat record's
    compute_ms: float
    relative: float | None
    individual: float | None


def _worst_score(score: _Score) -> float:
    values = [v for v in (score["relative"], score["individual"]) if v is not None]
    return min(values) if values else 1.0


class StragglerDetector:
    """A monitor evaluator (:class:`~rankguard.monitor.monitor.Evaluator`): its report
    is ``status.json``'s ``stragglers``."""

    name = "stragglers"

    def __init__(self, cfg: StragglerConfig, run_id: str, *, started_at: float) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.next_report = started_at + cfg.report_time_interval
        self._interval: dict[int, list[float]] = {}  # rank -> medians this interval
        self._seen_seq: dict[int, tuple[Any, Any]] = {}
        self.reports = 0
        self.best: dict[int, float] = {}  # rank -> best (lowest) compute ms reported
        self._recent: dict[int, deque[float]] = {}  # rank -> recent estimates from waits
        self.latest: dict[int, tuple[float, HeartbeatRecord]] = {}  # rank -> (ms, record)
        self.active: set[tuple[int, int | None]] = set()  # (rank, pid) flagged now
        self.below: dict[tuple[int, int | None], int] = {}  # reports in a row below
        self.report: StragglersBlock | None = None
        self.stop_requested = False
        self.waits = WaitShares()
        self.source: str | None = None  # what the latest report scored

    def status(self) -> StragglersBlock | None:
        return self.report

    def observe(self, rank: int, record: HeartbeatRecord) -> None:
        block = read_block(record, StragglerBlock)
        ms = None if block is None else block.compute_ms
        if ms is not None and ms > 0 and math.isfinite(ms):
            self.latest[rank] = (ms, record)
            key = (record.pid, record.seq)
            if self._seen_seq.get(rank) != key:  # a new record: one more sample
                self._seen_seq[rank] = key
                self._interval.setdefault(rank, []).append(ms)

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        ended = False
        for rank, state in ranks.items():
            rec = state.record
            if rec is None:
                continue
            if rec.ended:
                self.latest.pop(rank, None)
                self.waits.forget(rank)
                ended = True
            else:
                self.observe(rank, rec)
                self.waits.observe(rank, rec, now)
        if now < self.next_report or not self.latest:
            return []
        if ended:
            # Ranks end together when the job does (and after a crash the others stop
            # too): a report over the ranks still there would compare a part of the job,
            # and say "no straggler" at the end of a run that had one. The last report
            # over every rank stays; a restarted rank (a new process) reports again.
            return []
        # On its schedule, not from this scan: made at the first scan after it is due, a
        # report set the next one an interval after that scan, and every report came as
        # much later (every 3.0 or 3.5 s at a 0.5 s scan: the onset -> finding latency
        # grew with it); a monitor that fell behind by more than an interval skips ahead.
        due = self.next_report + self.cfg.report_time_interval
        self.next_report = due if due > now else now + self.cfg.report_time_interval
        return self._report()

    def _reference(self, rank: int, ms: float) -> float:
        """The rank's own reference for its individual score, ``ms`` its time now: its
        best so far from its own measurements; from sampled waits, the median of its
        recent estimates (a peer held up by the host makes one interval's waiting share
        jump and that estimate far too fast: the lowest of them is no reference)."""
        if self.source == "collective_waits":
            recent = self._recent.setdefault(rank, deque(maxlen=_RECENT_ESTIMATES))
            recent.append(ms)
            return statistics.median(recent)
        self.best[rank] = min(self.best.get(rank, ms), ms)
        return self.best[rank]

    def _report(self) -> list[Finding]:
        cfg = self.cfg
        # each rank's median over the interval's heartbeats (else its latest value)
        for rank, samples in self._interval.items():
            if rank in self.latest and samples:
                self.latest[rank] = (statistics.median(samples), self.latest[rank][1])
        self._interval = {}
        estimates = self.waits.take()
        if not estimates and self.waits.held_start and not self._any_marked():
            # The interval held a rank's start: its peers waited for it to arrive, and its
            # own CPU per step is its start-up's. Scored from that (0.006-0.5 for a
            # healthy rank), the first report named ranks no later one would; the next
            # interval is the first the collectives' waits score.
            return []
        self.reports += 1
        waits = self._scored_by_waits(estimates)
        source = "collective_waits" if waits else "own_compute"
        if source != self.source:  # another measure: its own bests
            self.best = {}
            self._recent = {}
            self.source = source
        best_now = min(ms for ms, _ in self.latest.values())
        reference = best_now
        if source == "collective_waits":
            reference = _faster_half(ms for ms, _ in self.latest.values())
        scores: dict[int, _Score] = {}
        for rank, (ms, rec) in sorted(self.latest.items()):
            relative = min(reference / ms, 1.0) if cfg.calc_relative_gpu_perf else None
            own = self._reference(rank, ms)
            individual = own / ms if cfg.calc_individual_gpu_perf else None
            scores[rank] = {
                "rank": rank,
                "node_rank": rec.node_rank,
                "hostname": rec.hostname,
                "pid": rec.pid,
                "gpu": rec.gpu,
                "compute_ms": round(ms, 4),
                "relative": None if relative is None else round(relative, 4),
                "individual": None if individual is None else round(individual, 4),
            }
        findings = []
        flagged_now: set[tuple[int, int | None]] = set()
        below: dict[tuple[int, int | None], int] = {}
        for rank, score in scores.items():
            slow_rel = score["relative"] is not None and (
                score["relative"] < cfg.gpu_relative_perf_threshold
            )
            slow_ind = score["individual"] is not None and (
                score["individual"] < cfg.gpu_individual_perf_threshold
            )
            if not (slow_rel or slow_ind):
                continue
            key = (rank, score["pid"])
            below[key] = self.below.get(key, 0) + 1
            if below[key] < cfg.consecutive_reports:
                continue  # below once: seen again at the next report before it counts
            flagged_now.add(key)
            if key in self.active:
                continue
            findings.append(self._finding(score, slow_rel, slow_ind, waits.get(rank)))
        self.below = below
        self.active = flagged_now
        ordered = sorted(scores.values(), key=lambda s: (_worst_score(s), s["rank"]))
        n = cfg.num_gpu_perf_scores_to_print
        self.report = StragglersBlock(
            report=self.reports,
            source=source,
            ranks=len(scores),
            best_compute_ms=round(best_now, 4),
            stragglers=sorted(rank for rank, _ in flagged_now),
            below_threshold=sorted(rank for rank, _ in below),
            worst=[StragglerRow(**s) for s in ordered[:n]],
            best=[StragglerRow(**s) for s in ordered[::-1][:n]],
            scores={
                str(r): StragglerScores(s["relative"], s["individual"]) for r, s in scores.items()
            },
        )
        if cfg.enable_logging and n:
            logger.warning("rankguard stragglers: %s", self.table())
            self._nvrx_lines(scores, below)
        if findings and cfg.stop_if_detected:
            self.stop_requested = True
        return findings

    def _scored_by_waits(self, waits: dict[int, RankWaits]) -> dict[int, RankWaits]:
        """Score this report by the ranks' waiting in collectives (their compute per step
        replaces the own-compute samples) unless a rank marks its compute sections (the
        finer source) or a scored rank has no estimate; the estimates used, else {}."""
        if self._any_marked() or not waits or not set(self.latest) <= set(waits):
            return {}
        for rank, (_, rec) in self.latest.items():
            self.latest[rank] = (waits[rank].compute_ms, rec)
        return waits

    def _any_marked(self) -> bool:
        return any(_marked(rec) for _, rec in self.latest.values())

    def _nvrx_lines(
        self, scores: dict[int, _Score], below: dict[tuple[int, int | None], int]
    ) -> None:
        """The report as NVRx and Megatron Bridge print it (their verification greps it)."""
        cfg = self.cfg
        nodes = {r: str(s["hostname"] or s["node_rank"]) for r, s in scores.items()}
        rel = {r: s["relative"] for r, s in scores.items() if s["relative"] is not None}
        ind = {r: s["individual"] for r, s in scores.items() if s["individual"] is not None}
        low = {rank for rank, _ in below}
        for line in straggler_warnings(
            [r for r in low if rel.get(r, 1.0) < cfg.gpu_relative_perf_threshold],
            [r for r in low if ind.get(r, 1.0) < cfg.gpu_individual_perf_threshold],
        ):
            logger.warning("%s", line)
        for line in score_lines(rel or None, ind or None, nodes, cfg.num_gpu_perf_scores_to_print):
            logger.info("%s", line)

    def table(self) -> str:
        report = self.report or StragglersBlock()
        lines = [
            f"report {report.report}: {report.ranks} ranks, best compute "
            f"{report.best_compute_ms} ms, stragglers {report.stragglers}",
            "  worst: "
            + ", ".join(f"rank {s.rank} rel {s.relative} ind {s.individual}" for s in report.worst),
            "  best:  "
            + ", ".join(f"rank {s.rank} rel {s.relative} ind {s.individual}" for s in report.best),
        ]
        return "\n".join(lines)

    def _finding(
        self, score: _Score, slow_rel: bool, slow_ind: bool, waits: RankWaits | None
    ) -> Finding:
        cfg = self.cfg
        why = []
        if slow_rel:
            why.append(f"relative score {score['relative']} < {cfg.gpu_relative_perf_threshold}")
        if slow_ind:
            why.append(
                f"individual score {score['individual']} < {cfg.gpu_individual_perf_threshold}"
            )
        gpu = (score.get("gpu") or {}).get("token") if score.get("gpu") else None
        reports = cfg.consecutive_reports
        how = ""
        if waits is not None and score["relative"]:
            how = (
                f"; from the collectives: its peers wait for it, its compute per step is "
                f"{1 / score['relative']:.2f}x the faster half of the ranks', it waits "
                f"{waits.wait_share:.0%} of the time"
            )
        return Finding.build(
            FindingType.STRAGGLER,
            Reason.SLOW_COMPUTE,
            run_id=self.run_id,
            rank=score["rank"],
            message=f"rank {score['rank']} (node {score['node_rank']}, "
            f"{score['hostname']}, GPU {gpu or '-'}) is a straggler: {'; '.join(why)} "
            f"(compute {score['compute_ms']} ms per step"
            + (f"; {reports} reports in a row" if reports > 1 else "")
            + f"{how})",
            pid=score["pid"],
            hostname=score["hostname"],
            node_rank=score["node_rank"],
            gpu=score.get("gpu"),
            detail={
                "relative_score": score["relative"],
                "individual_score": score["individual"],
                "compute_ms": score["compute_ms"],
                "consecutive_reports": reports,
                "source": self.source,
                "wait_share": None if waits is None else round(waits.wait_share, 3),
                "slowdown": round(1 / score["relative"], 3) if score["relative"] else None,
            },
        )


def _faster_half(values: Iterable[float]) -> float:
    """The median of the faster half of the ranks' compute per step (the fastest alone
    for two ranks): the reference of the relative scores from collective waits. Those
    are sampled estimates; the fastest of them is the one sampling made too fast, and
    scored against it a healthy rank looks slow and a straggler slower than it is."""
    ordered = sorted(values)
    return statistics.median(ordered[: (len(ordered) + 1) // 2])


def _marked(rec: HeartbeatRecord) -> bool:
    """Does ``rec``'s rank mark its compute sections (the finer source)?"""
    block = read_block(rec, StragglerBlock)
    return block is not None and (block.method or "").startswith("compute_section")
