"""Straggler detection: config (NVRx's straggler defaults), node-0 detector, rank-side probe.

Pure logic, no processes: the detector sees fake rank states (objects with a
``.record`` dict, as the monitor's ``RankState``), the probe runs on this thread (with a
fake ``thread_time_ns`` where exact figures matter), and the session tests write
heartbeats into a temp dir.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

import rankguard.straggler.probe as probe_mod
from rankguard.config import ConfigError, load_config
from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import HeartbeatRecord, RecordError
from rankguard.schema.statusblocks import StragglerScores
from rankguard.session import NullSession, Session
from rankguard.straggler.config import StragglerConfig
from rankguard.straggler.detector import StragglerDetector
from rankguard.straggler.probe import ComputeProbe
from tests.factories import rank_identity

RUN = "run-straggler"
T0 = 1000.0  # the detector's start (monitor clock, seconds)
INTERVAL = 10.0

# ---- helpers ---------------------------------------------------------------------------


@dataclass
class FakeState:
    """What the detector reads of the monitor's ``RankState``: the latest record, as
    the monitor accepts it (a record it rejects never reaches the detector)."""

    raw: dict[str, Any] | None

    @property
    def record(self) -> HeartbeatRecord | None:
        try:
            return HeartbeatRecord.from_dict(self.raw) if self.raw is not None else None
        except RecordError:
            return None


def _record(
    rank: int,
    compute_ms: float | None,
    *,
    pid: int | None = None,
    event: str = "heartbeat",
    straggler: Any = ...,
) -> dict[str, Any]:
    """A heartbeat record as the publisher writes it; two ranks per node, one GPU each."""
    rec: dict[str, Any] = {
        "run_id": RUN,
        "event": event,
        "rank": rank,
        "pid": 1000 + rank if pid is None else pid,
        "hostname": f"node{rank // 2}.example",
        "node_rank": rank // 2,
        "gpu": {"ordinal": rank % 2, "token": f"GPU-uuid-{rank}", "uuid": f"GPU-uuid-{rank}"},
        "progress_seq": 5,
    }
    if straggler is not ...:
        rec["straggler"] = straggler
    elif compute_ms is not None:
        rec["straggler"] = {"compute_ms": compute_ms, "samples": 3, "method": "step_cpu"}
    return rec


def _ranks(times: dict[int, float]) -> dict[int, FakeState]:
    return {r: FakeState(_record(r, ms)) for r, ms in times.items()}


def _detector(**overrides: Any) -> StragglerDetector:
    """A detector; one report decides (``consecutive_reports=1``) unless a test asks
    for the hysteresis: the scores are what most tests here look at."""
    overrides.setdefault("consecutive_reports", 1)
    cfg = StragglerConfig(enabled=True, report_time_interval=INTERVAL, **overrides)
    return StragglerDetector(cfg, RUN, started_at=T0)


class Reports:
    """Drive a detector one report at a time (each call: one report interval later)."""

    def __init__(self, det: StragglerDetector) -> None:
        self.det = det
        self.k = 0

    def __call__(self, times: dict[int, float]) -> list[dict[str, Any]]:
        self.k += 1
        before = self.det.reports
        findings = self.det.evaluate(T0 + self.k * INTERVAL, _ranks(times))
        assert self.det.reports == before + 1, "expected one report per interval"
        return findings


# ---- config ----------------------------------------------------------------------------

NVRX_STRAGGLER_DEFAULTS = {
    "enabled": False,
    "report_time_interval": 300.0,
    "calc_relative_gpu_perf": True,
    "calc_individual_gpu_perf": True,
    "num_gpu_perf_scores_to_print": 5,
    "gpu_relative_perf_threshold": 0.7,
    "gpu_individual_perf_threshold": 0.7,
    "stop_if_detected": False,
    "enable_logging": True,
    "profiling_interval": 1,
}


def test_config_defaults_are_nvrx_straggler_defaults() -> None:
    cfg = StragglerConfig()
    own = {"consecutive_reports": 2}  # rankguard's hysteresis, not an NVRx key
    assert {f.name: getattr(cfg, f.name) for f in fields(cfg)} == {**NVRX_STRAGGLER_DEFAULTS, **own}
    assert all(f.metadata.get("help") for f in fields(cfg))  # every key documented


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("report_time_interval", 0),
        ("report_time_interval", -1.0),
        ("num_gpu_perf_scores_to_print", -1),
        ("gpu_relative_perf_threshold", 0.0),
        ("gpu_relative_perf_threshold", 1.5),
        ("gpu_individual_perf_threshold", -0.1),
        ("gpu_individual_perf_threshold", 1.01),
        ("profiling_interval", 0),
        ("consecutive_reports", 0),
    ],
)
def test_config_validation_names_the_field(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{field_name}: must be"):
        StragglerConfig(**{field_name: value})


def test_config_edges_are_valid() -> None:
    cfg = StragglerConfig(
        gpu_relative_perf_threshold=1.0,
        gpu_individual_perf_threshold=1.0,
        num_gpu_perf_scores_to_print=0,
        report_time_interval=0.01,
    )
    assert cfg.gpu_relative_perf_threshold == 1.0 and cfg.num_gpu_perf_scores_to_print == 0


def test_config_overrides_and_dotted_errors() -> None:
    cfg = load_config(None, ["straggler.enabled=true", "straggler.report_time_interval=2"])
    assert cfg.straggler.enabled is True and cfg.straggler.report_time_interval == 2.0
    with pytest.raises(ConfigError, match=r"straggler\.gpu_relative_perf_threshold: must be"):
        load_config(None, ["straggler.gpu_relative_perf_threshold=1.5"])
    with pytest.raises(ConfigError, match=r"straggler\.bogus"):
        load_config(None, ["straggler.bogus=1"])


# ---- detector: timing and scores -------------------------------------------------------


def test_no_report_before_report_time_interval() -> None:
    det = _detector()
    ranks = _ranks({0: 10.0, 1: 50.0})  # rank 1 would be a straggler
    for now in (T0, T0 + 1, T0 + INTERVAL - 0.01):
        assert det.evaluate(now, ranks) == []
    assert det.reports == 0 and det.report is None
    findings = det.evaluate(T0 + INTERVAL, ranks)
    assert det.reports == 1 and [f.rank for f in findings] == [1]
    # the next report is one interval after this one, not before
    assert det.evaluate(T0 + INTERVAL + 5, ranks) == [] and det.reports == 1
    det.evaluate(T0 + 2 * INTERVAL, ranks)
    assert det.reports == 2


def test_no_report_without_compute_data_and_the_clock_waits() -> None:
    det = _detector()
    assert det.evaluate(T0 + 5 * INTERVAL, {0: FakeState(_record(0, None))}) == []
    assert det.reports == 0  # nothing measured yet: no empty report
    det.evaluate(T0 + 5 * INTERVAL + 1, _ranks({0: 10.0}))
    assert det.reports == 1  # the first data makes the (overdue) report at once


def test_relative_score_is_best_over_own() -> None:
    det = _detector()
    Reports(det)({0: 10.0, 1: 20.0, 2: 40.0, 3: 12.5})
    scores = det.report.scores
    assert {r: s.relative for r, s in scores.items()} == {
        "0": 1.0,
        "1": 0.5,
        "2": 0.25,
        "3": 0.8,
    }
    assert det.report.best_compute_ms == 10.0


def test_individual_score_is_own_best_over_now() -> None:
    det = _detector(calc_relative_gpu_perf=False)
    report = Reports(det)
    assert report({0: 10.0, 1: 10.0}) == []
    assert report({0: 9.0, 1: 10.0}) == []  # faster: its best so far is 9
    findings = report({0: 13.5, 1: 10.0})  # 1.5x its own best
    scores = det.report.scores
    assert scores["0"] == StragglerScores(relative=None, individual=pytest.approx(0.6667))
    assert scores["1"].individual == 1.0
    assert [f.rank for f in findings] == [0]
    assert findings[0].detail["relative_score"] is None
    assert findings[0].detail["individual_score"] == pytest.approx(0.6667)
    assert "individual score 0.6667 < 0.7" in findings[0].message
    assert "relative" not in findings[0].message


def test_relative_off_ignores_a_steadily_slow_rank() -> None:
    det = _detector(calc_relative_gpu_perf=False)
    report = Reports(det)
    for _ in range(3):
        assert report({0: 10.0, 1: 30.0}) == []  # 3x slower than rank 0, but always was
    assert det.report.stragglers == []


def test_individual_off_ignores_a_whole_job_slowing_down() -> None:
    det = _detector(calc_individual_gpu_perf=False)
    report = Reports(det)
    assert report({0: 10.0, 1: 10.0}) == []
    assert report({0: 30.0, 1: 30.0}) == []  # every rank 3x slower: not a straggler
    assert det.report.scores["0"] == StragglerScores(relative=1.0, individual=None)
    # and a relative straggler is still caught, on the relative score alone
    findings = report({0: 30.0, 1: 60.0})
    assert [f.rank for f in findings] == [1]
    assert (
        findings[0].detail["individual_score"] is None
        and findings[0].detail["relative_score"] == 0.5
    )


def test_both_scores_off_flag_nobody() -> None:
    det = _detector(calc_relative_gpu_perf=False, calc_individual_gpu_perf=False)
    report = Reports(det)
    assert report({0: 10.0, 1: 100.0}) == []
    assert report({0: 100.0, 1: 1000.0}) == []
    assert det.report.stragglers == []


def test_balanced_ranks_with_noise_flag_nobody() -> None:
    rng = random.Random(2)
    det = _detector()
    report = Reports(det)
    for _ in range(300):
        times = {r: 100.0 * rng.uniform(0.95, 1.05) for r in range(16)}
        assert report(times) == []
    assert det.report.stragglers == [] and not det.stop_requested


def test_a_rank_1_5x_slower_is_flagged_at_the_first_report() -> None:
    det = _detector()
    findings = Reports(det)({0: 10.0, 1: 10.2, 2: 15.0, 3: 9.9})
    assert len(findings) == 1
    f = findings[0]
    assert f.finding_type == "straggler_detected"
    assert f.reason == "rank_compute_slower_than_threshold"
    assert f.run_id == RUN and f.schema_version >= 1
    assert (f.rank, f.pid, f.node_rank, f.hostname) == (2, 1002, 1, "node1.example")
    assert f.gpu["token"] == "GPU-uuid-2"
    assert f.detail["relative_score"] == pytest.approx(9.9 / 15.0, abs=1e-4)
    assert f.detail["individual_score"] == 1.0
    assert f.detail["compute_ms"] == 15.0
    msg = f.message
    for part in ("rank 2", "node 1", "node1.example", "GPU GPU-uuid-2", "0.66", "< 0.7"):
        assert part in msg, (part, msg)
    assert det.report.stragglers == [2]


def test_finding_without_gpu_says_dash() -> None:
    det = _detector()
    ranks = _ranks({0: 10.0})
    ranks[1] = FakeState({**_record(1, 20.0), "gpu": None})
    (f,) = det.evaluate(T0 + INTERVAL, ranks)
    assert f.gpu is None and "GPU -" in f.message


def test_one_finding_per_episode() -> None:
    det = _detector()
    report = Reports(det)
    assert len(report({0: 10.0, 1: 10.0, 2: 15.0})) == 1
    assert report({0: 10.0, 1: 10.0, 2: 15.0}) == []  # still slow: same episode
    assert det.report.stragglers == [2]
    assert report({0: 10.0, 1: 10.0, 2: 10.0}) == []  # recovered
    assert det.report.stragglers == []
    again = report({0: 10.0, 1: 10.0, 2: 16.0})  # slow again: a new episode
    assert [f.rank for f in again] == [2]


def test_a_restarted_rank_is_a_new_episode() -> None:
    det = _detector()
    assert len(det.evaluate(T0 + INTERVAL, _ranks({0: 10.0, 1: 20.0}))) == 1
    ranks = {0: FakeState(_record(0, 10.0)), 1: FakeState(_record(1, 20.0, pid=4242))}
    (f,) = det.evaluate(T0 + 2 * INTERVAL, ranks)
    assert (f.rank, f.pid) == (1, 4242)


def test_process_end_drops_the_rank_and_no_report_compares_a_part_of_the_job() -> None:
    """A rank that ended is not scored (slow as its last record says); while it is gone
    no report is made over the others (a run's last seconds, or a crash's survivors): the
    last report over every rank stays; its restart (a new process) reports again."""
    det = _detector(consecutive_reports=2)
    report = Reports(det)
    report({0: 10.0, 1: 10.0, 2: 30.0})
    report({0: 10.0, 1: 10.0, 2: 30.0})  # rank 2 below twice in a row: flagged
    assert det.report is not None and det.report.stragglers == [2]
    ranks = _ranks({0: 10.0, 1: 10.0})
    ranks[2] = FakeState(_record(2, 50.0, event="process_end"))  # slow, but it ended
    assert det.evaluate(T0 + 3 * INTERVAL, ranks) == []
    assert 2 not in det.latest
    assert (det.reports, det.report.ranks, det.report.stragglers) == (2, 3, [2])
    ranks[2] = FakeState(_record(2, 10.0, pid=4242))  # restarted, at speed now
    assert det.evaluate(T0 + 4 * INTERVAL, ranks) == []
    assert (det.reports, det.report.ranks, det.report.stragglers) == (3, 3, [])


def test_a_rank_without_new_samples_keeps_its_last_time() -> None:
    det = _detector()
    det.evaluate(T0 + 1, _ranks({0: 10.0, 1: 20.0}))  # observed, no report yet
    ranks = {0: FakeState(_record(0, 10.0)), 1: FakeState(_record(1, None))}
    findings = det.evaluate(T0 + INTERVAL, ranks)  # rank 1's record has no samples
    assert [f.rank for f in findings] == [1]


def test_stop_requested_only_with_stop_if_detected() -> None:
    det = _detector()
    assert len(Reports(det)({0: 10.0, 1: 30.0})) == 1
    assert det.stop_requested is False
    stopper = _detector(stop_if_detected=True)
    report = Reports(stopper)
    assert report({0: 10.0, 1: 10.5}) == []
    assert stopper.stop_requested is False  # no straggler, no stop
    assert len(report({0: 10.0, 1: 30.0})) == 1
    assert stopper.stop_requested is True


# ---- detector: report and log ----------------------------------------------------------


def test_report_lists_worst_and_best_n() -> None:
    det = _detector(num_gpu_perf_scores_to_print=3)
    times = {0: 10.0, 1: 40.0, 2: 12.5, 3: 20.0, 4: 11.0, 5: 25.0, 6: 10.5}
    Reports(det)(times)
    assert det.report is not None
    report = det.report.to_dict()
    assert report["report"] == 1 and report["ranks"] == 7
    assert [s["rank"] for s in report["worst"]] == [1, 5, 3]  # lowest relative first
    assert [s["rank"] for s in report["best"]] == [0, 6, 4]  # highest relative first
    worst = [s["relative"] for s in report["worst"]]
    assert worst == sorted(worst)
    best = [s["relative"] for s in report["best"]]
    assert best == sorted(best, reverse=True)
    assert report["stragglers"] == [1, 3, 5]  # 0.25, 0.5, 0.4 < 0.7
    row = report["worst"][0]
    assert set(row) == {
        "rank",
        "node_rank",
        "hostname",
        "pid",
        "gpu",
        "compute_ms",
        "relative",
        "individual",
    }
    json.dumps(report)  # goes to status.json as is


def test_report_with_fewer_ranks_than_n_and_with_n_zero() -> None:
    det = _detector()  # n = 5
    Reports(det)({0: 10.0, 1: 20.0})
    assert [s.rank for s in det.report.worst] == [1, 0]
    assert [s.rank for s in det.report.best] == [0, 1]
    silent = _detector(num_gpu_perf_scores_to_print=0)
    findings = Reports(silent)({0: 10.0, 1: 20.0})
    assert silent.report.worst == [] and silent.report.best == []
    assert len(findings) == 1  # detection does not depend on printing


def test_report_is_logged_only_with_enable_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rankguard.straggler.detector")
    Reports(_detector())({0: 10.0, 1: 20.0})
    logged = [r.getMessage() for r in caplog.records if "rankguard stragglers" in r.getMessage()]
    assert len(logged) == 1
    assert "report 1: 2 ranks" in logged[0] and "stragglers [1]" in logged[0]
    assert "rank 1 rel 0.5 ind 1.0" in logged[0]
    caplog.clear()
    Reports(_detector(enable_logging=False))({0: 10.0, 1: 20.0})
    assert not [r for r in caplog.records if "rankguard stragglers" in r.getMessage()]


def test_report_order_uses_individual_score_when_relative_is_off() -> None:
    det = _detector(calc_relative_gpu_perf=False, num_gpu_perf_scores_to_print=2)
    report = Reports(det)
    report({0: 10.0, 1: 10.0, 2: 10.0})
    report({0: 10.0, 1: 10.0, 2: 20.0})  # rank 2 at 0.5 of its own best
    assert det.report.worst[0].rank == 2


def test_report_order_with_a_relative_score_rounded_to_zero() -> None:
    det = _detector()
    findings = Reports(det)({0: 1.0, 1: 1e5})
    assert [f.rank for f in findings] == [1]  # it is flagged ...
    assert det.report.worst[0].rank == 1  # ... but listed best


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "12.5 ms",
        [12.5],
        {},
        {"compute_ms": None},
        {"compute_ms": "fast"},
        {"compute_ms": [1]},
        {"compute_ms": 0},
        {"compute_ms": -3.0},
        {"compute_ms": float("nan")},
    ],
)
def test_malformed_straggler_fields_are_ignored(bad: Any) -> None:
    det = _detector()
    ranks = _ranks({0: 10.0, 1: 10.5})
    ranks[2] = FakeState(_record(2, None, straggler=bad))
    assert det.evaluate(T0 + INTERVAL, ranks) == []
    assert set(det.report.scores) == {"0", "1"}
    only_bad = _detector()
    assert only_bad.evaluate(T0 + INTERVAL, {2: FakeState(_record(2, None, straggler=bad))}) == []
    assert only_bad.reports == 0


def test_empty_or_missing_records_are_ignored() -> None:
    det = _detector()
    ranks: dict[int, Any] = {0: FakeState(None), 1: FakeState({}), **_ranks({2: 10.0})}
    assert det.evaluate(T0 + INTERVAL, ranks) == []
    assert det.report.ranks == 1


# ---- probe -----------------------------------------------------------------------------


class FakeCpu:
    """Stands in for ``time`` inside the probe: ``thread_time_ns`` returns ``self.ns``."""

    def __init__(self) -> None:
        self.ns = 0

    def thread_time_ns(self) -> int:
        return self.ns

    def spend(self, ms: float) -> None:
        self.ns += int(ms * 1e6)


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> FakeCpu:
    fake = FakeCpu()
    monkeypatch.setattr(
        probe_mod, "time", types.SimpleNamespace(thread_time_ns=fake.thread_time_ns)
    )
    return fake


def _spin_cpu(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_probe_calls_the_wrapped_step_end_every_time() -> None:
    calls: list[int | None] = []
    probe = ComputeProbe(calls.append, every=3)
    for i in range(7):
        probe.step_end(i)
    probe.step_end()
    assert calls == [0, 1, 2, 3, 4, 5, 6, None]


def test_probe_samples_every_profiling_interval(cpu: FakeCpu) -> None:
    probe = ComputeProbe(lambda i: None, every=3)
    for _ in range(9):
        cpu.spend(2.0)
        probe.step_end()
    fields = probe.heartbeat_fields()
    assert fields is not None
    assert fields["straggler"]["samples"] == 3
    assert fields["straggler"]["compute_ms"] == 2.0  # per step, not per 3 steps
    probe.step_end()
    probe.step_end()
    assert probe.heartbeat_fields() is None  # 2 more steps: no 3rd, no sample


@pytest.mark.parametrize("sections", [False, True])
def test_probe_sample_is_one_step_with_profiling_interval(cpu: FakeCpu, sections: bool) -> None:
    probe = ComputeProbe(lambda i: None, every=4)
    for _ in range(8):
        if sections:
            probe.section_enter()
        cpu.spend(5.0)
        if sections:
            probe.section_exit()
        probe.step_end()
    fields = probe.heartbeat_fields()
    assert fields is not None
    assert fields["straggler"]["compute_ms"] == pytest.approx(5.0)


def test_probe_step_mode_counts_cpu_between_step_ends(cpu: FakeCpu) -> None:
    probe = ComputeProbe(lambda i: None)
    for ms in (10.0, 30.0, 20.0):
        cpu.spend(ms)
        probe.step_end()
    assert probe.heartbeat_fields() == {
        "straggler": {"compute_ms": 20.0, "samples": 3, "method": "step_cpu"}
    }


def test_probe_section_mode_counts_only_sections(cpu: FakeCpu) -> None:
    probe = ComputeProbe(lambda i: None)
    for _ in range(3):
        cpu.spend(50.0)  # data loading, optimizer, ... outside the section
        probe.section_enter()
        cpu.spend(4.0)  # forward
        probe.section_exit()
        cpu.spend(7.0)  # between sections (e.g. a collective's CPU side)
        probe.section_enter()
        cpu.spend(6.0)  # backward
        probe.section_exit()
        probe.step_end()
    assert probe.heartbeat_fields() == {
        "straggler": {"compute_ms": 10.0, "samples": 3, "method": "compute_section_cpu"}
    }


def test_probe_real_clock_section_spin_counts_sleep_does_not() -> None:
    probe = ComputeProbe(lambda i: None)
    for _ in range(3):
        probe.section_enter()
        _spin_cpu(0.02)
        probe.section_exit()
        time.sleep(0.05)  # outside: not compute (and no CPU either)
        _spin_cpu(0.01)  # outside: CPU, but not in the section
        probe.step_end()
    fields = probe.heartbeat_fields()
    assert fields is not None
    ms = fields["straggler"]["compute_ms"]
    assert 19.0 <= ms < 28.0, ms  # the section's 20 ms, not the 10 ms spin or 50 ms sleep


def test_probe_real_clock_step_mode_ignores_sleep() -> None:
    probe = ComputeProbe(lambda i: None)
    probe.step_end()  # start of the first measured step
    probe.heartbeat_fields()
    for _ in range(3):
        _spin_cpu(0.01)
        time.sleep(0.05)  # a rank waiting (collective, sleep) uses no CPU
        probe.step_end()
    fields = probe.heartbeat_fields()
    assert fields is not None
    assert 9.0 <= fields["straggler"]["compute_ms"] < 25.0


def test_probe_heartbeat_fields_new_samples_only(cpu: FakeCpu) -> None:
    probe = ComputeProbe(lambda i: None)
    assert probe.heartbeat_fields() is None
    for ms in (1.0, 2.0, 9.0):
        cpu.spend(ms)
        probe.step_end()
    first = probe.heartbeat_fields()
    assert first is not None and first["straggler"]["compute_ms"] == 2.0
    assert probe.heartbeat_fields() is None
    assert probe.heartbeat_fields() is None
    for ms in (100.0, 300.0):
        cpu.spend(ms)
        probe.step_end()
    second = probe.heartbeat_fields()
    assert second is not None
    assert second["straggler"]["compute_ms"] == 200.0  # median of the new two only
    assert second["straggler"]["samples"] == 2


def test_probe_ring_keeps_the_latest_samples(cpu: FakeCpu) -> None:
    probe = ComputeProbe(lambda i: None)
    n = probe_mod._RING + 100
    for k in range(n):
        cpu.spend(1.0 if k < 100 else 3.0)  # the first 100 are overwritten
        probe.step_end()
    fields = probe.heartbeat_fields()
    assert fields is not None
    assert fields["straggler"]["samples"] == probe_mod._RING
    assert fields["straggler"]["compute_ms"] == 3.0


# ---- session ---------------------------------------------------------------------------


@pytest.fixture
def probed(tmp_path: Path) -> Iterator[tuple[Session, ComputeProbe, ProgressTracker]]:
    tracker = ProgressTracker(mode="cpu")
    probe = ComputeProbe(tracker.step_end)
    s = Session(
        rank_identity(run_id=RUN),
        tmp_path,
        HeartbeatConfig(publish_interval_s=0.05),
        tracker=tracker,
        publish=True,
        probe=probe,
    )
    try:
        yield s, probe, tracker
    finally:
        s.close()


def _wait_for(pred: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_session_step_end_goes_through_the_probe(
    probed: tuple[Session, ComputeProbe, ProgressTracker], tmp_path: Path
) -> None:
    s, probe, tracker = probed
    for i in range(1, 4):
        with s.compute():
            _spin_cpu(0.005)
        s.step_end(i)
    assert tracker.progress_seq == 3 and tracker.iteration == 3
    assert probe._write == 3  # one sample per step

    path = tmp_path / heartbeat_file_name(0, os.getpid())

    def straggler_fields() -> list[dict[str, Any]] | None:
        # Each record carries the samples since the previous one: the heartbeat thread
        # may publish between two steps, so the three samples may span records.
        found = [
            rec["straggler"]
            for rec in map(json.loads, path.read_text(encoding="utf-8").splitlines())
            if "straggler" in rec
        ]
        return found if sum(f["samples"] for f in found) >= 3 else None

    fields = _wait_for(straggler_fields)
    assert sum(f["samples"] for f in fields) == 3
    for f in fields:
        assert f["method"] == "compute_section_cpu"
        assert 4.0 <= f["compute_ms"] < 30.0


def test_session_step_block_and_optimizer_hook_go_through_the_probe(
    probed: tuple[Session, ComputeProbe, ProgressTracker],
) -> None:
    import torch

    s, probe, tracker = probed
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s.install_optimizer_hook()
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    # step mode: the probe counts the steps (the heartbeat thread reads the CPU clock)
    assert tracker.progress_seq == 2 and probe._n == 2
    with s.step(10):
        pass
    assert tracker.progress_seq == 3 and probe._n == 3


def test_the_probes_optimizer_hook_counts_a_rebuilt_optimizers_steps(
    probed: tuple[Session, ComputeProbe, ProgressTracker],
) -> None:
    """An in-process restart's new round builds a new optimizer once the old one is
    gone: its steps are still the progress (and a second live optimizer's are not)."""
    import gc

    import torch

    s, probe, tracker = probed
    s.install_optimizer_hook()
    model = torch.nn.Linear(2, 1)
    for _ in range(2):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        other = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            other.step()
        del opt, other
        gc.collect()
    assert tracker.progress_seq == 4 and probe._n == 4


def test_session_compute_is_a_reusable_context(
    probed: tuple[Session, ComputeProbe, ProgressTracker],
) -> None:
    s, _, _ = probed
    assert s.compute() is s.compute()
    with pytest.raises(RuntimeError), s.compute():
        raise RuntimeError("the section still closes")
    with s.compute():
        pass


def test_session_without_probe_compute_is_a_no_op(tmp_path: Path) -> None:
    tracker = ProgressTracker(mode="cpu")
    s = Session(
        rank_identity(run_id=RUN), tmp_path, HeartbeatConfig(), tracker=tracker, publish=False
    )
    with s.compute():
        pass
    s.step_end(1)
    assert tracker.progress_seq == 1
    assert s.should_stop() is False and s.stop_reason is None


def test_null_session_compute_and_should_stop_are_no_ops() -> None:
    s = NullSession()
    with s.compute():
        pass
    assert s.compute() is s.compute()
    assert s.should_stop() is False
    assert s.stop_reason is None


# ---- probe on GPU: CUDA timing events around the compute sections (fake events) --------


class FakeGpu:
    """A fake device clock and stream: ``record`` stamps an event when the test says the
    device got there; ``elapsed_time`` refuses an event that has not completed, as
    torch.cuda.Event does."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.made: list[FakeGpuEvent] = []
        self.records = 0

    def event(self) -> FakeGpuEvent:
        event = FakeGpuEvent(self)
        self.made.append(event)
        return event

    def run(self, ms: float) -> None:
        self.now_ms += ms

    def complete_all(self) -> None:
        for event in self.made:
            if event.pending:
                event.at_ms, event.pending = event.queued_at, False


class FakeGpuEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at_ms: float | None = None
        self.queued_at = 0.0
        self.pending = False

    def record(self, stream: Any = None) -> None:
        self.gpu.records += 1
        self.queued_at, self.pending, self.at_ms = self.gpu.now_ms, True, None

    def query(self) -> bool:
        return not self.pending and self.at_ms is not None

    def elapsed_time(self, other: FakeGpuEvent) -> float:
        if not (self.query() and other.query()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at_ms is not None and other.at_ms is not None
        return other.at_ms - self.at_ms


def _gpu_step(probe: ComputeProbe, gpu: FakeGpu, *sections_ms: float, gap_ms: float = 3.0) -> None:
    for ms in sections_ms:
        probe.section_enter()
        gpu.run(ms)
        probe.section_exit()
        gpu.run(gap_ms)  # the all-reduce: waiting, not the rank's own compute
    probe.step_end()


def test_probe_cuda_times_the_sections_on_the_device_and_sums_them(cpu: FakeCpu) -> None:
    gpu = FakeGpu()
    probe = ComputeProbe(lambda i: None, cuda=True, event_factory=gpu.event)
    for _ in range(3):
        cpu.spend(1.0)  # the CPU only queues kernels: not what is scored
        _gpu_step(probe, gpu, 4.0, 6.0)
    gpu.complete_all()
    assert probe.heartbeat_fields() == {
        "straggler": {"compute_ms": 10.0, "samples": 3, "method": "compute_section_cuda"}
    }
    assert len(gpu.made) == 12  # a pair per section, created once, then reused


def test_probe_cuda_waits_for_the_device_and_never_counts_a_running_step() -> None:
    gpu = FakeGpu()
    probe = ComputeProbe(lambda i: None, cuda=True, event_factory=gpu.event)
    _gpu_step(probe, gpu, 5.0)
    assert probe.heartbeat_fields() is None  # queued, not completed: nothing read
    gpu.complete_all()
    probe.section_enter()  # the next step's first section ran and completed ...
    gpu.run(7.0)
    probe.section_exit()
    gpu.complete_all()
    fields = probe.heartbeat_fields()  # ... but that step has not ended: not counted yet
    assert fields is not None and fields["straggler"]["samples"] == 1
    assert fields["straggler"]["compute_ms"] == 5.0
    probe.section_enter()
    gpu.run(2.0)
    probe.section_exit()
    probe.step_end()
    gpu.complete_all()
    fields = probe.heartbeat_fields()
    assert fields is not None and fields["straggler"]["compute_ms"] == 9.0  # 7 + 2, whole


def test_probe_cuda_partly_completed_step_is_read_whole_later() -> None:
    gpu = FakeGpu()
    probe = ComputeProbe(lambda i: None, cuda=True, event_factory=gpu.event)
    probe.section_enter()
    gpu.run(4.0)
    probe.section_exit()
    gpu.complete_all()  # the first section is done on the device
    probe.section_enter()
    gpu.run(6.0)
    probe.section_exit()  # the second is still queued
    probe.step_end()
    assert probe.heartbeat_fields() is None
    gpu.complete_all()
    fields = probe.heartbeat_fields()
    assert fields is not None and fields["straggler"] == {
        "compute_ms": 10.0,
        "samples": 1,
        "method": "compute_section_cuda",
    }


def test_probe_cuda_records_only_sampled_steps() -> None:
    gpu = FakeGpu()
    probe = ComputeProbe(lambda i: None, every=4, cuda=True, event_factory=gpu.event)
    for _ in range(8):
        _gpu_step(probe, gpu, 5.0)
    assert gpu.records == 4  # two sampled steps, two events each
    gpu.complete_all()
    fields = probe.heartbeat_fields()
    assert fields is not None and fields["straggler"]["samples"] == 2


def test_probe_cuda_reader_far_behind_skips_to_whole_recent_steps() -> None:
    gpu = FakeGpu()
    probe = ComputeProbe(lambda i: None, cuda=True, event_factory=gpu.event)
    steps = probe_mod._POOL // 3 + 10  # three sections a step: the pool wraps
    for i in range(steps):
        _gpu_step(probe, gpu, 1.0 + (i % 3), 1.0, 1.0)
    gpu.complete_all()
    fields = probe.heartbeat_fields()
    assert fields is not None
    # the read window starts inside a step: that step is skipped, whole steps only
    first = 3 * steps - probe_mod._READ_WINDOW
    assert first % 3 != 0
    assert fields["straggler"]["samples"] == (3 * steps - (first + (-first) % 3)) // 3
    assert fields["straggler"]["compute_ms"] == 4.0  # median of 3, 4, 5
    assert len(gpu.made) == 2 * probe_mod._POOL  # the pool never grows


def test_probe_decides_cuda_at_the_first_section(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    monkeypatch.setattr(probe_mod, "cuda_in_use", lambda: True)
    probe = ComputeProbe(lambda i: None, event_factory=gpu.event)
    _gpu_step(probe, gpu, 5.0)
    gpu.complete_all()
    fields = probe.heartbeat_fields()
    assert fields is not None and fields["straggler"]["method"] == "compute_section_cuda"


def test_probe_gpu_rank_without_sections_warns_once(
    monkeypatch: pytest.MonkeyPatch, cpu: FakeCpu, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(probe_mod, "cuda_in_use", lambda: True)
    probe = ComputeProbe(lambda i: None)
    for _ in range(3):
        cpu.spend(2.0)
        probe.step_end()
        with caplog.at_level("WARNING", logger=probe_mod.__name__):
            fields = probe.heartbeat_fields()
        assert fields is not None and fields["straggler"]["method"] == "step_cpu"
    warnings = [r for r in caplog.records if "rg.compute()" in r.getMessage()]
    assert len(warnings) == 1


# ---- hysteresis ------------------------------------------------------------------------


def test_a_score_must_stay_below_for_consecutive_reports() -> None:
    det = _detector(consecutive_reports=2)
    report = Reports(det)
    assert report({0: 10.0, 1: 10.0, 2: 15.0}) == []  # below once: not yet
    assert det.report.stragglers == [] and det.report.below_threshold == [2]
    (f,) = report({0: 10.0, 1: 10.0, 2: 15.0})
    assert f.rank == 2 and f.detail["consecutive_reports"] == 2
    assert "2 reports in a row" in f.message and det.report.stragglers == [2]


def test_a_score_wavering_at_the_threshold_flags_nobody() -> None:
    """Scores of a healthy rank around the threshold (0.60-0.74 seen on a loaded host):
    never below twice in a row, never a finding."""
    det = StragglerDetector(
        StragglerConfig(enabled=True, report_time_interval=INTERVAL), RUN, started_at=T0
    )  # the default: two reports in a row
    report = Reports(det)
    for k in range(40):
        slow = 10.0 / (0.62 if k % 2 else 0.74)  # below, above, below, above ...
        assert report({0: 10.0, 1: slow, 2: 10.0}) == []
    assert det.report.stragglers == []


def test_recovery_in_between_starts_the_count_again() -> None:
    det = _detector(consecutive_reports=3)
    report = Reports(det)
    assert report({0: 10.0, 1: 20.0}) == [] and report({0: 10.0, 1: 20.0}) == []
    assert report({0: 10.0, 1: 10.0}) == []  # recovered: the count starts again
    assert report({0: 10.0, 1: 20.0}) == [] and report({0: 10.0, 1: 20.0}) == []
    assert [f.rank for f in report({0: 10.0, 1: 20.0})] == [1]


# ---- the report as NVRx and Megatron Bridge print it -----------------------------------


def test_report_lines_as_nvrx_and_bridge_print_them(caplog: pytest.LogCaptureFixture) -> None:
    det = _detector(num_gpu_perf_scores_to_print=1)
    with caplog.at_level(logging.INFO, logger="rankguard.straggler.detector"):
        Reports(det)({0: 10.0, 1: 10.2, 2: 15.0, 3: 9.9})
    text = [r.getMessage() for r in caplog.records]
    # rankguard's own table first, then Bridge's lines, same markers and field order
    assert text[0].startswith("rankguard stragglers: report 1")
    assert text[1] == (
        "STRAGGLER DETECTION WARNING: Some GPUs have worse relative performance. "
        "Affected ranks: [2]"
    )
    assert text[2] == (
        "GPU relative performance:\n"
        " Worst performing 1/4 ranks:\n"
        "  Rank=2 Node=node1.example Score=0.66\n"
        " Best performing 1/4 ranks:\n"
        "  Rank=3 Node=node1.example Score=1.00\n"
    )
    assert text[3].startswith("GPU individual performance:\n Worst performing 1/4 ranks:\n")
    assert len(text) == 4


def test_few_ranks_are_all_printed_worst_first() -> None:
    from rankguard.straggler.nvrx_lines import format_gpu_scores, score_lines

    table = format_gpu_scores({0: 1.0, 1: 0.5}, {0: "a", 1: "b"}, 5, 5)
    assert table == "  Rank=1 Node=b Score=0.50\n  Rank=0 Node=a Score=1.00\n"
    assert score_lines(None, {0: 1.0}, {0: "a"}, 5) == [
        "GPU individual performance:\n  Rank=0 Node=a Score=1.00\n"
    ]
