"""Stragglers from the ranks' waiting in collectives: no code mark, a rank slowed inside
backward is named with its slowdown; balanced ranks, too few samples or marked compute
sections leave the scoring to the ranks' own measurements."""

from __future__ import annotations

from typing import Any

from rankguard.schema.findings import FindingType
from rankguard.schema.records import HeartbeatRecord
from rankguard.straggler.config import StragglerConfig
from rankguard.straggler.detector import StragglerDetector
from rankguard.straggler.waits import WaitShares
from tests.factories import heartbeat_record

INTERVAL = 10.0
STEP_S = 0.1  # the job's step period
LOOKS = 200  # sampler looks per interval (50 ms apart)


class _State:
    def __init__(self, raw: dict[str, Any]) -> None:
        self.record = HeartbeatRecord.from_dict(raw)


class Job:
    """Ranks whose CPU time per step is equal (the sleep a slow backward adds uses no
    CPU) and whose waiting shares are given per report."""

    def __init__(self, world: int, method: str = "step_cpu") -> None:
        self.world = world
        self.method = method
        self.k = 0
        self.looks = dict.fromkeys(range(world), 0)
        self.waits = dict.fromkeys(range(world), 0)
        self.slower = 1.0  # the step period's factor from the next report on
        self.steps = 0
        self.compute_ms = dict.fromkeys(range(world), 40.0)  # each rank's own CPU per step

    def states(self, shares: dict[int, float] | None, looks: int = LOOKS) -> dict[int, _State]:
        out = {}
        for r in range(self.world):
            if shares is not None:
                self.looks[r] += looks
                self.waits[r] += round(shares[r] * looks)
            raw = heartbeat_record(
                r,
                self.k + 1,
                world_size=self.world,
                progress_seq=1 + self.steps,
                straggler={"compute_ms": self.compute_ms[r], "samples": 5, "method": self.method},
                collectives={
                    "groups": {"0": [self.k * 1000, self.k * 1000]},
                    "samples": self.looks[r],
                    "waiting": self.waits[r],
                },
            )
            out[r] = _State(raw)
        return out

    def report(
        self, det: StragglerDetector, shares: dict[int, float], looks: int = LOOKS
    ) -> list[Any]:
        if self.k == 0:  # the first sight starts the interval
            det.evaluate(1000.0, self.states(None))
        self.k += 1
        self.steps += int(INTERVAL / (STEP_S * self.slower))
        return det.evaluate(1000.0 + self.k * INTERVAL, self.states(shares, looks))


def _detector() -> StragglerDetector:
    cfg = StragglerConfig(enabled=True, report_time_interval=INTERVAL, consecutive_reports=2)
    return StragglerDetector(cfg, "run", started_at=1000.0)


def test_the_rank_its_peers_wait_for_is_named_with_its_slowdown() -> None:
    # rank 2's backward is slower: the others wait 35% of the time, it 2%
    det, job = _detector(), Job(4)
    shares = {0: 0.35, 1: 0.36, 2: 0.02, 3: 0.34}
    found = job.report(det, shares) + job.report(det, shares) + job.report(det, shares)
    assert [(f.rank, f.finding_type) for f in found] == [(2, FindingType.STRAGGLER)]
    detail = found[0].detail
    assert detail["source"] == "collective_waits" and detail["wait_share"] == 0.02
    assert 1.45 < detail["slowdown"] < 1.55, detail  # 0.98 / 0.65
    assert "its peers wait for it" in found[0].message
    assert det.report is not None and det.report.stragglers == [2]


def test_balanced_waiting_names_nobody() -> None:
    det, job = _detector(), Job(4)
    for k in range(5):
        shares = {r: 0.05 + 0.02 * ((r + k) % 3) for r in range(4)}
        assert job.report(det, shares) == []
    assert det.source == "collective_waits"


def test_too_few_samples_leave_the_ranks_own_measurements() -> None:
    det, job = _detector(), Job(2)
    for _ in range(3):
        assert job.report(det, {0: 0.4, 1: 0.0}, looks=5) == []
    assert det.source == "own_compute"


def test_marked_compute_sections_stay_the_finer_source() -> None:
    det, job = _detector(), Job(2, method="compute_section_cpu")
    for _ in range(3):
        assert job.report(det, {0: 0.4, 1: 0.0}) == []
    assert det.source == "own_compute"


def test_a_restarted_rank_starts_its_interval_again() -> None:
    shares = WaitShares()
    raw = heartbeat_record(0, 1, collectives={"groups": {"0": [1, 1]}, "samples": 900})
    shares.observe(0, HeartbeatRecord.from_dict(raw), 1.0)
    raw = heartbeat_record(0, 1, pid=7, collectives={"groups": {"0": [1, 1]}, "samples": 30})
    shares.observe(0, HeartbeatRecord.from_dict(raw), 2.0)
    assert shares._start[0].samples == 30  # not 900: a new process counts from zero


def test_one_far_off_estimate_is_no_reference_for_a_ranks_individual_score() -> None:
    # a peer held up by the host once: rank 0 waited 76% of that interval, so its
    # estimate is a quarter of its compute; the lowest estimate as its own reference
    # made every later (true) one look 4x slower: a straggler that never was
    det, job = _detector(), Job(2)
    found = job.report(det, {0: 0.76, 1: 0.0})
    for _ in range(5):
        found += job.report(det, {0: 0.05, 1: 0.04})
    assert found == []
    assert det.source == "collective_waits"
    assert det.report is not None and det.report.stragglers == []


def test_a_rank_that_became_slower_than_its_recent_self_is_found_from_waits() -> None:
    # the whole job's step period doubles (every rank slower alike: no rank waits
    # more than before), so each rank's individual score halves against its recent self
    det, job = _detector(), Job(2)
    found = []
    for _ in range(4):
        found += job.report(det, {0: 0.05, 1: 0.04})
    assert found == []
    job.slower = 2.0
    for _ in range(2):
        found += job.report(det, {0: 0.05, 1: 0.04})
    assert sorted(f.rank for f in found) == [0, 1]
    assert all(f.detail["individual_score"] < 0.7 for f in found), [f.detail for f in found]


def test_one_rank_estimated_too_fast_makes_no_healthy_rank_a_straggler() -> None:
    # rank 2 is 1.2x slower (it waits 2%, the others about 17%); rank 0's sampled share
    # came out high (30%: its estimate too fast). Scored against that fastest estimate
    # the healthy ranks 1 and 3 fell below 0.85 too, and rank 2 looked 1.4x slower
    cfg = StragglerConfig(
        enabled=True,
        report_time_interval=INTERVAL,
        consecutive_reports=2,
        gpu_relative_perf_threshold=0.85,
    )
    det, job = StragglerDetector(cfg, "run", started_at=1000.0), Job(4)
    shares = {0: 0.30, 1: 0.17, 2: 0.02, 3: 0.16}
    found = job.report(det, shares) + job.report(det, shares) + job.report(det, shares)
    assert [(f.rank, f.finding_type) for f in found] == [(2, FindingType.STRAGGLER)]
    assert 1.2 < found[0].detail["slowdown"] < 1.3, found[0].detail  # 0.98 / mean(0.70, 0.83)
    assert det.report is not None
    assert det.report.scores["0"].relative == 1.0  # faster than the reference: at most 1.0


def test_the_interval_the_ranks_started_in_names_nobody() -> None:
    # rank 1 reached its first collective last (its start was slower): its peers waited
    # 60% of that first interval for it; then the ranks are even. Scored, that interval
    # named rank 1 a 2.5x straggler at the first report
    cfg = StragglerConfig(enabled=True, report_time_interval=INTERVAL, consecutive_reports=1)
    det, job = StragglerDetector(cfg, "run", started_at=1000.0), Job(4)
    found = job.report(det, {0: 0.6, 1: 0.0, 2: 0.6, 3: 0.6})
    for _ in range(3):
        found += job.report(det, {0: 0.05, 1: 0.04, 2: 0.05, 3: 0.06})
    assert found == []
    assert det.source == "collective_waits"


def test_the_interval_the_ranks_started_in_is_not_scored_from_their_own_cpu_either() -> None:
    # The first interval holds the ranks' start: no estimate from the waits, and each
    # rank's own CPU per step is its start-up's (rank 1's 10x its peers'). Scored from
    # that, the first report named rank 1 (relative 0.1); it is not scored, and the
    # first report is the first interval the waits score.
    cfg = StragglerConfig(enabled=True, report_time_interval=INTERVAL, consecutive_reports=1)
    det, job = StragglerDetector(cfg, "run", started_at=1000.0), Job(4)
    job.compute_ms[1] = 400.0
    found = job.report(det, {0: 0.6, 1: 0.0, 2: 0.6, 3: 0.6})
    assert (found, det.reports, det.report) == ([], 0, None)
    job.compute_ms[1] = 40.0
    for _ in range(2):
        found += job.report(det, {0: 0.05, 1: 0.04, 2: 0.05, 3: 0.06})
    assert found == []
    assert det.source == "collective_waits" and det.reports == 2


def test_reports_keep_their_schedule_whatever_each_scans_lag() -> None:
    # Scans every 0.5 s, each a few ms late by a varying amount (the monitor's thread):
    # made at the first scan after each due time, the reports set the next one from that
    # scan, often missed it by those ms and came 3.5 s apart instead of 3 s (18 in 60 s,
    # not 20).
    cfg = StragglerConfig(enabled=True, report_time_interval=3.0, consecutive_reports=2)
    det, job = StragglerDetector(cfg, "run", started_at=1000.0), Job(2)
    det.evaluate(1000.0, job.states(None))
    made = []
    for k in range(1, 121):
        now = 1000.0 + 0.5 * k + 0.001 * (7 * k % 5)
        before = det.next_report
        det.evaluate(now, job.states({0: 0.05, 1: 0.04}, looks=10))
        if det.next_report != before:
            made.append(round(before))
    assert made == [1000 + 3 * n for n in range(1, 21)]
