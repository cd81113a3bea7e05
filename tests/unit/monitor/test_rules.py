"""Heartbeat rules: liveness, progress, episodes, restarts, culprits and GPU health.

Pure logic with an explicit monitor clock (``now``), so every scenario is exact.
Timeouts used here: process 10 s, initial process 10 s, progress 20 s, initial progress
60 s, checkpoint 100 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rankguard.monitor.lostnode import LostNode
from rankguard.monitor.rules import Liveness, Progress
from rankguard.schema.records import HeartbeatRecord
from tests.factories import BASE_NS, Feed, types_of
from tests.factories import heartbeat_record as rec
from tests.factories import heartbeat_rules as _rules


def vanished_record(last: dict[str, Any]) -> HeartbeatRecord:
    """The process_end the pid check writes for a process that died without one."""
    return HeartbeatRecord.from_dict(last).vanished(BASE_NS)


PROCESS_TIMEOUT = "rank_process_heartbeat_timeout"
PROGRESS_TIMEOUT = "gpu_progress_timeout"
PROCESS_EXITED = "rank_process_exited"


# ---- normal operation ----------------------------------------------------------------


def test_progressing_ranks_have_no_findings() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    all_findings = []
    for t in range(0, 120):
        for rank in (0, 1):
            feed.beat(rank, t, progress_seq=t + 1, since=0.2)
        all_findings += rules.evaluate(t + 0.5)
    assert all_findings == []
    for rank in (0, 1):
        state = rules.ranks[rank]
        assert state.liveness is Liveness.ALIVE
        assert state.progress is Progress.PROGRESSING
        assert state.active == set()
    assert rules.findings_total == 0


def test_phase_change_without_progress_still_stalls() -> None:
    rules = _rules(world=1)
    feed = Feed(rules)
    findings = []
    for t in range(0, 25):
        phase = "train" if t < 5 else ("eval" if t < 12 else "custom")
        feed.beat(0, t, progress_seq=5, since=float(t), phase=phase)
        findings += [(t, f) for f in rules.evaluate(t + 0.1)]
    assert len(findings) == 1
    t_fired, f = findings[0]
    assert t_fired == 20  # progress age 20.1 > 20 first at t=20
    assert f.finding_type == PROGRESS_TIMEOUT
    assert f.process_liveness == "alive"
    assert f.gpu_progress == "stalled"
    assert f.reason == "rank_alive_but_gpu_progress_not_advancing"
    assert f.timeout_s == 20.0
    assert f.observed_s == pytest.approx(20.1)
    assert f.phase == "custom"
    assert f.rank == 0 and f.pid == 1000
    assert rules.ranks[0].liveness is Liveness.ALIVE
    assert rules.ranks[0].progress is Progress.STALLED


@pytest.mark.parametrize("past", [0.0001, 0.0004, 0.0006, 0.04])
def test_observed_time_just_past_the_limit_is_reported_past_it(past: float) -> None:
    """A stall found 0.1 ms past the limit must not read ``observed_s == timeout_s``."""
    rules = _rules(world=1)
    feed = Feed(rules)
    feed.beat(0, 0, progress_seq=5, since=0.0)
    feed.beat(0, 19, progress_seq=5, since=19.0)
    found = rules.evaluate(20.0 + past)
    assert types_of(found) == [(0, PROGRESS_TIMEOUT)]
    f = found[0]
    assert f.timeout_s == 20.0
    assert f.observed_s is not None and f.observed_s > f.timeout_s
    assert f.observed_s == pytest.approx(20.0 + past, abs=0.001)
    shown = f.message.split("no step completed for ")[1].split("s > ")[0]
    assert float(shown) > 20.0, f.message


def test_initial_progress_timeout_applies_before_first_step() -> None:
    rules = _rules(world=1)
    feed = Feed(rules)
    for t in range(0, 60):
        feed.beat(0, t, progress_seq=0, since=float(t), phase="setup")
        assert rules.evaluate(t + 0.5) == [], t  # 20 s progress timeout does not apply
        assert rules.ranks[0].progress is Progress.STARTING
        assert rules.ranks[0].liveness is Liveness.ALIVE
    feed.beat(0, 60, progress_seq=0, since=60.0, phase="setup")
    findings = rules.evaluate(60.5)
    assert types_of(findings) == [(0, PROGRESS_TIMEOUT)]
    assert findings[0].timeout_s == 60.0


def test_checkpoint_uses_checkpoint_timeout_for_progress() -> None:
    rules = _rules(world=1)
    feed = Feed(rules)
    for t in range(0, 100):
        feed.beat(0, t, progress_seq=7, since=float(t), checkpoint_active=True)
        assert rules.evaluate(t + 0.5) == [], t
        assert rules.ranks[0].progress is Progress.PROGRESSING
    feed.beat(0, 100, progress_seq=7, since=100.0, checkpoint_active=True)
    findings = rules.evaluate(100.5)
    assert types_of(findings) == [(0, PROGRESS_TIMEOUT)]
    assert findings[0].timeout_s == 100.0
    assert findings[0].checkpoint_active is True


def test_checkpoint_uses_checkpoint_timeout_for_process() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, progress_seq=7, since=0.0, checkpoint_active=True), 0.0)
    # Past process_timeout_s (10) and progress_timeout_s (20), within checkpoint 100.
    for now in (11.0, 21.0, 50.0, 99.0):
        assert rules.evaluate(now) == []
        assert rules.ranks[0].liveness is Liveness.ALIVE
    findings = rules.evaluate(101.0)
    assert types_of(findings) == [(0, PROCESS_TIMEOUT)]
    assert findings[0].timeout_s == 100.0
    assert findings[0].reason == "rank_process_or_heartbeat_thread_unresponsive"


# ---- liveness -----------------------------------------------------------------------


def test_stale_process_gives_one_process_finding_and_no_progress_finding() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, progress_seq=3, since=5.0), 0.0)
    assert rules.evaluate(9.0) == []
    findings = rules.evaluate(10.5)
    assert types_of(findings) == [(0, PROCESS_TIMEOUT)]
    f = findings[0]
    assert f.reason == "rank_process_or_heartbeat_thread_unresponsive"
    assert f.process_liveness == "stale"
    assert f.gpu_progress == "unknown"
    assert f.timeout_s == 10.0
    assert f.observed_s == pytest.approx(10.5)
    # progress age (5 + 30) is far past the progress timeout: still one cause, one finding
    assert rules.evaluate(30.0) == []
    assert rules.ranks[0].liveness is Liveness.STALE
    assert rules.ranks[0].progress is Progress.UNKNOWN
    assert rules.ranks[0].active == {PROCESS_TIMEOUT}


def test_finding_fires_once_per_episode() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, progress_seq=3), 0.0)
    findings = []
    for i in range(1, 200):
        findings += rules.evaluate(i * 0.5)
    assert types_of(findings) == [(0, PROCESS_TIMEOUT)]
    assert rules.findings_total == 1


def test_finding_fires_again_after_recovery_and_relapse() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, progress_seq=3), 0.0)
    assert types_of(rules.evaluate(11.0)) == [(0, PROCESS_TIMEOUT)]
    # recovery: the process publishes again
    rules.ingest(rec(0, 1, progress_seq=4, t=12.0), 12.0)
    assert rules.evaluate(12.5) == []
    assert rules.ranks[0].liveness is Liveness.ALIVE
    assert rules.ranks[0].active == set()
    # relapse
    assert types_of(rules.evaluate(23.0)) == [(0, PROCESS_TIMEOUT)]
    assert rules.findings_total == 2


def test_progress_finding_fires_again_after_recovery() -> None:
    rules = _rules(world=1)
    feed = Feed(rules)
    fired = []
    for t in range(0, 70):
        # stall for 25 s, progress again, stall again
        since = float(t) if t < 25 else float(t - 25)
        seq = 5 if t < 25 else 6
        feed.beat(0, t, progress_seq=seq, since=since)
        fired += [(t, f.finding_type) for f in rules.evaluate(t + 0.1)]
    assert fired == [(20, PROGRESS_TIMEOUT), (45, PROGRESS_TIMEOUT)]


def test_never_seen_rank_counted_from_first_rank_seen() -> None:
    rules = _rules(world=2, started_at=0.0)
    feed = Feed(rules)
    findings = []
    for t in range(5, 40):
        feed.beat(0, t, progress_seq=t)
        findings += [(t, f) for f in rules.evaluate(t + 0.5)]
    # first rank seen at t=5: waited 10.5 > 10 at t=15 (not at t=10 from the monitor start)
    assert [(t, f.rank, f.finding_type) for t, f in findings] == [(15, 1, PROCESS_TIMEOUT)]
    f = findings[0][1]
    assert f.reason == "rank_process_heartbeat_never_observed"
    assert f.pid is None
    assert f.process_liveness == "not_observed"
    assert f.gpu_progress == "not_observed"
    assert f.timeout_s == 10.0


def test_never_seen_ranks_counted_from_monitor_start_when_none_seen() -> None:
    rules = _rules(world=3, started_at=100.0)
    assert rules.evaluate(105.0) == []
    assert rules.evaluate(110.0) == []
    findings = rules.evaluate(110.5)
    assert sorted(types_of(findings)) == [(r, PROCESS_TIMEOUT) for r in range(3)]
    assert {f.reason for f in findings} == {"rank_process_heartbeat_never_observed"}
    assert rules.evaluate(200.0) == []  # only once


def test_never_seen_message_says_what_the_wait_counts_from() -> None:
    """With no rank seen, the wait ran from the monitor's start: the finding says so
    and does not claim a first rank was seen (8 ranks whose start-up outlasted the
    initial timeout on a loaded machine were each told so)."""
    rules = _rules(world=2, started_at=100.0)
    none_seen = rules.evaluate(110.5)
    assert [f.rank for f in none_seen] == [0, 1]
    for f in none_seen:
        assert "after the monitor started (no rank of the job has published yet)" in f.message
        assert "first rank was seen" not in f.message
    rules = _rules(world=2, started_at=0.0)
    feed = Feed(rules)
    late = []
    for t in range(5, 20):
        feed.beat(0, t, progress_seq=t)
        late += rules.evaluate(t + 0.5)
    assert [f.rank for f in late] == [1]
    assert "after the job's first rank was seen" in late[0].message


def test_never_seen_waits_for_the_preload_fork_then_counts_from_it() -> None:
    """``--preload``: while the launcher waits for its fork server's imports no rank is
    reported never seen, however long; once the ranks were forked the initial timeout
    counts from that fork (not from the monitor's start), and the finding says so."""
    rules = _rules(world=2, started_at=100.0)
    rules.note_ranks_forking(None)  # the fork server still imports
    assert rules.evaluate(110.5) == [] and rules.evaluate(150.0) == []
    rules.note_ranks_forking(150.0)  # forked
    assert rules.evaluate(155.0) == [] and rules.evaluate(160.0) == []
    late = rules.evaluate(160.5)
    assert [(f.rank, f.reason) for f in late] == [
        (0, "rank_process_heartbeat_never_observed"),
        (1, "rank_process_heartbeat_never_observed"),
    ]
    assert "10.5s after the ranks were forked (--preload's fork server" in late[0].message
    # forked before the monitor started (a fast fork server): from the monitor's start
    rules = _rules(world=1, started_at=100.0)
    rules.note_ranks_forking(None)
    rules.note_ranks_forking(90.0)
    assert rules.evaluate(110.0) == [] and len(rules.evaluate(110.5)) == 1


def test_no_never_seen_finding_without_expected_world_size() -> None:
    rules = _rules(world=None, started_at=0.0)
    assert rules.evaluate(1000.0) == []


def test_world_size_from_records_when_not_expected() -> None:
    rules = _rules(world=None, started_at=0.0)
    rules.ingest(rec(0, 0, world_size=3), 0.0)
    assert rules.world_size() == 3
    findings = rules.evaluate(10.5)
    never = [f for f in findings if f.reason == "rank_process_heartbeat_never_observed"]
    assert sorted(f.rank for f in never) == [1, 2]


# ---- restarts and record filtering -------------------------------------------------


def test_new_pid_resets_rank_and_active_findings() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, pid=111, t=0.0, event="process_start"), 0.0)
    assert types_of(rules.evaluate(11.0)) == [(0, PROCESS_TIMEOUT)]
    assert rules.ranks[0].active == {PROCESS_TIMEOUT}
    # the launcher restarts the rank: new pid, seq starts at 0 again
    assert rules.ingest(
        rec(0, 0, pid=222, t=20.0, event="process_start", progress_seq=0, since=0.0), 20.0
    )
    state = rules.ranks[0]
    assert state.pid == 222
    assert state.active == set()
    assert rules.evaluate(20.5) == []
    assert state.liveness is Liveness.ALIVE
    assert state.progress is Progress.STARTING
    # and a new episode of the new pid fires again
    findings = rules.evaluate(31.0)
    assert types_of(findings) == [(0, PROCESS_TIMEOUT)]
    assert findings[0].pid == 222


def test_late_records_of_old_pid_are_ignored() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, pid=111, t=0.0, event="process_start"), 0.0)
    rules.ingest(rec(0, 1, pid=111, t=1.0), 1.0)
    rules.ingest(rec(0, 0, pid=222, t=20.0, event="process_start", progress_seq=0), 20.0)
    before = rules.ignored_records
    # a line the old process wrote before it died, read late
    assert rules.ingest(rec(0, 2, pid=111, t=2.0, progress_seq=9), 21.0) is False
    assert rules.ignored_records == before + 1
    assert rules.ranks[0].pid == 222
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.pid == 222
    assert rules.ranks[0].record.progress_seq == 0


def test_other_run_id_is_ignored() -> None:
    rules = _rules(world=1)
    assert rules.ingest(rec(0, 0, run_id="another-run"), 0.0) is False
    assert rules.ignored_records == 1
    assert rules.ranks == {}


def test_record_without_rank_or_pid_is_ignored() -> None:
    rules = _rules(world=1)
    bad = rec(0, 0)
    del bad["pid"]
    assert rules.ingest(bad, 0.0) is False
    assert rules.ingest({**rec(0, 0), "rank": "x"}, 0.0) is False
    assert rules.ignored_records == 2
    assert rules.ranks == {}


def test_duplicate_and_older_seq_are_ignored() -> None:
    rules = _rules(world=1)
    assert rules.ingest(rec(0, 5, progress_seq=50, t=5.0), 5.0)
    assert rules.ingest(rec(0, 5, progress_seq=99, t=6.0), 6.0) is False
    assert rules.ingest(rec(0, 3, progress_seq=30, t=3.0), 7.0) is False
    state = rules.ranks[0]
    assert state.record is not None
    assert state.record.progress_seq == 50
    assert state.seen_at == 5.0  # age is not refreshed by a duplicate
    assert types_of(rules.evaluate(15.5)) == [(0, PROCESS_TIMEOUT)]


# ---- exits --------------------------------------------------------------------------


def test_clean_process_end_is_exited_completed() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, event="process_start", progress_seq=0), 0.0)
    rules.ingest(rec(0, 1, progress_seq=10), 1.0)
    end = rec(0, 2, event="process_end", progress_seq=10)
    end["exit"] = {"clean": True, "exit_code": 0, "error": None}
    rules.ingest(end, 2.0)
    assert rules.evaluate(2.5) == []
    assert rules.ranks[0].liveness is Liveness.EXITED
    assert rules.ranks[0].progress is Progress.COMPLETED
    # an exited rank never times out
    assert rules.evaluate(5000.0) == []
    assert rules.first_failure is None


def test_error_exit_is_reported() -> None:
    rules = _rules(world=1)
    rules.ingest(rec(0, 0, progress_seq=3), 0.0)
    end = rec(0, 1, event="process_end", progress_seq=3)
    end["exit"] = {"clean": False, "exit_code": 1, "error": "RuntimeError: boom"}
    rules.ingest(end, 1.0)
    findings = rules.evaluate(1.5)
    assert types_of(findings) == [(0, PROCESS_EXITED)]
    f = findings[0]
    assert f.reason == "rank_process_exited_with_error"
    assert f.process_liveness == "exited"
    assert f.gpu_progress == "unknown"
    assert f.exit["exit_code"] == 1
    assert "boom" in f.message
    assert rules.ranks[0].progress is Progress.UNKNOWN
    assert rules.evaluate(2.0) == []  # once
    assert rules.first_failure == (0, 1.5)


def test_vanished_process_is_reported_as_died() -> None:
    rules = _rules(world=1)
    last = rec(0, 4, progress_seq=3)
    rules.ingest(last, 0.0)
    synth = vanished_record(last)
    assert synth.seq == 5 and synth.event == "process_end"
    assert rules.ingest(synth, 1.0)
    findings = rules.evaluate(1.5)
    assert types_of(findings) == [(0, PROCESS_EXITED)]
    assert findings[0].reason == "rank_process_died_without_process_end"
    assert findings[0].exit["vanished"] is True
    assert rules.ranks[0].liveness is Liveness.EXITED


def test_real_process_end_replaces_synthesized_one() -> None:
    # race: the process wrote its clean end and exited between the monitor's file read
    # and its pid check; the synthesized end has the same seq as the real one
    rules = _rules(world=1)
    last = rec(0, 4, progress_seq=3)
    rules.ingest(last, 0.0)
    assert rules.ingest(vanished_record(last), 0.5)
    end = rec(0, 5, event="process_end", progress_seq=3)
    end["exit"] = {"clean": True, "exit_code": 0, "error": None}
    assert rules.ingest(end, 1.0)
    assert rules.evaluate(1.5) == []
    assert rules.ranks[0].liveness is Liveness.EXITED
    assert rules.ranks[0].progress is Progress.COMPLETED
    assert rules.first_failure is None


def test_late_heartbeat_after_synthesized_end_is_ignored() -> None:
    rules = _rules(world=1)
    last = rec(0, 4, progress_seq=3)
    rules.ingest(last, 0.0)
    rules.ingest(vanished_record(last), 0.5)
    assert types_of(rules.evaluate(0.6)) == [(0, PROCESS_EXITED)]
    # the heartbeat the process wrote just before SIGKILL, read one scan late
    assert rules.ingest(rec(0, 5, progress_seq=3), 1.0) is False
    assert rules.evaluate(1.5) == []
    assert rules.ranks[0].liveness is Liveness.EXITED
    assert rules.evaluate(30.0) == []


def test_exits_after_shutdown_are_not_findings() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, progress_seq=3), 0.0)
    rules.note_shutdown("SIGTERM")
    rules.note_shutdown("later reason")  # the first reason is kept
    assert rules.shutdown == "SIGTERM"
    for rank in (0, 1):
        end = rec(rank, 1, event="process_end", t=1.0)
        end["exit"] = {"clean": False, "exit_code": -15, "error": "terminated"}
        rules.ingest(end, 1.0)
    assert rules.evaluate(1.5) == []
    for rank in (0, 1):
        state = rules.ranks[rank]
        assert state.liveness is Liveness.EXITED
        assert state.record is not None
        assert state.record.exit["after_shutdown"] == "SIGTERM"
    assert rules.first_failure is None


def test_peer_terminated_after_first_failure_gets_no_finding() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, progress_seq=3), 0.0)
    assert rules.evaluate(0.5) == []
    end0 = rec(0, 1, event="process_end", t=1.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": "CUDA error"}
    rules.ingest(end0, 1.0)
    assert types_of(rules.evaluate(1.5)) == [(0, PROCESS_EXITED)]
    # the launcher then terminates rank 1 (within process_timeout_s of the failure)
    end1 = rec(1, 1, event="process_end", t=3.0)
    end1["exit"] = {"clean": False, "exit_code": -15, "error": "terminated"}
    rules.ingest(end1, 3.0)
    assert rules.evaluate(3.5) == []
    state = rules.ranks[1]
    assert state.liveness is Liveness.EXITED
    assert state.record is not None
    assert state.record.exit["after_failure_of_rank"] == 0
    assert rules.evaluate(4.0) == []


def test_peer_failures_seen_in_the_same_scan_blame_the_earliest() -> None:
    rules = _rules(world=2)
    # rank 1's end record is older (publisher wall clock) than rank 0's
    end0 = rec(0, 1, event="process_end", t=5.0)
    end0["exit"] = {"clean": False, "exit_code": -15, "error": "terminated"}
    end1 = rec(1, 1, event="process_end", t=4.0)
    end1["exit"] = {"clean": False, "exit_code": 1, "error": "OOM"}
    rules.ingest(end0, 6.0)
    rules.ingest(end1, 6.0)
    findings = rules.evaluate(6.5)
    assert types_of(findings) == [(1, PROCESS_EXITED)]
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1


def test_a_killed_rank_is_blamed_not_the_peer_whose_collective_broke() -> None:
    # rank 1 is SIGKILLed; rank 0's all_reduce fails with gloo's error and it exits
    # with that error; both are seen in the same scan
    rules = _rules(world=2)
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=4.0)
    end0["exit"] = {
        "clean": False,
        "exit_code": 1,
        "error": "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    }
    rules.ingest(end0, 6.0)
    rules.ingest(vanished_record(rec(1, 0, t=1.0)), 6.0)
    findings = rules.evaluate(6.5)
    assert types_of(findings) == [(1, PROCESS_EXITED)]
    assert findings[0].reason == "rank_process_died_without_process_end"
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1


_BROKEN = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def test_a_victims_end_waits_a_relay_period_for_its_cause_from_another_node() -> None:
    # rank 0 (this node) ends at once with the broken collective's error; rank 1's own
    # error comes from node 1's relay a scan later: rank 1 is named, not its echo
    rules = _rules(world=2)
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=4.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 6.0)
    assert rules.evaluate(6.0) == []  # held
    end1 = rec(1, 1, event="process_end", t=4.0)
    end1["exit"] = {"clean": False, "exit_code": 1, "error": "RuntimeError: injected"}
    rules.ingest(end1, 6.5)
    assert types_of(rules.evaluate(6.5)) == [(1, PROCESS_EXITED)]
    assert rules.evaluate(6.0 + rules.fresh_s) == []
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1


def test_a_victims_end_with_no_cause_coming_is_named_after_the_relay_period() -> None:
    rules = _rules(world=1)
    end0 = rec(0, 1, event="process_end", t=4.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 6.0)
    assert rules.evaluate(6.0) == []
    assert rules.evaluate(6.0 + rules.fresh_s - 0.01) == []
    assert types_of(rules.evaluate(6.0 + rules.fresh_s)) == [(0, PROCESS_EXITED)]
    assert rules.evaluate(20.0) == []  # once


def test_a_victims_end_waits_for_the_heartbeat_timeout_of_a_silent_peer() -> None:
    # rank 1's node is lost (its agent and workers killed together): no end of rank 1
    # ever comes, its heartbeats just stop; rank 0's collective breaks at once. Rank 1's
    # heartbeat timeout names it, and rank 0's end is its echo.
    rules = _rules(world=2)
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=2.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 2.0)
    assert rules.evaluate(2.0) == []
    assert rules.evaluate(2.0 + rules.fresh_s) == []  # rank 1 late: held on
    assert rules.evaluate(11.0) == []  # not yet past rank 1's 10 s process timeout
    assert types_of(rules.evaluate(11.5)) == [(1, PROCESS_TIMEOUT)]
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1
    assert rules.evaluate(20.0) == []


def _lost_peer(rules: Any) -> None:
    """Rank 1's node is lost at t=1 (no end ever comes from it); rank 0's collective
    breaks at t=2 and its end is held for rank 1, whose heartbeats are late."""
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=2.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 2.0)
    assert rules.evaluate(2.0) == []
    assert rules.evaluate(4.0) == []  # rank 1 late: held for its 10 s process timeout


@pytest.mark.parametrize("new_rank_first", [0, 1])
def test_a_restart_before_the_silent_peers_timeout_names_it(new_rank_first: int) -> None:
    # the agent restarts the group (a spare takes the lost node's place) 2.6 s after
    # rank 0's end, before rank 1's process timeout: rank 1 is named then, and rank 0's
    # end is its echo; even when a new process is taken in before the next scan
    rules = _rules(world=2)
    _lost_peer(rules)
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=4.6)
    assert rules.ingest(rec(new_rank_first, 0, pid=2000 + new_rank_first, t=5.0), 5.0)
    found = rules.evaluate(5.0)
    assert types_of(found) == [(1, PROCESS_TIMEOUT)]
    assert (
        found[0].pid == 1001 and found[0].reason == "rank_process_or_heartbeat_thread_unresponsive"
    )
    assert found[0].observed_s == pytest.approx(3.6) and found[0].timeout_s == 10.0
    assert found[0].detail["named_at"] == "restart 1: worker_failed"
    assert "no heartbeat for 3.6s when the worker group was restarted" in found[0].message
    assert "its process or its node was lost" in found[0].message
    assert rules.findings_total == 1
    if new_rank_first == 1:
        assert rules.ranks[0].record is not None
        assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, pid=2000 + rank, t=6.0), 6.0)
    assert rules.evaluate(6.0) == [] and rules.evaluate(12.0) == []  # once


def test_a_restart_that_shrinks_the_group_names_the_lost_rank_before_retiring_it() -> None:
    # no spare: the group re-forms with rank 0 alone, rank 1's state retired with it
    rules = _rules(world=2)
    _lost_peer(rules)
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=4.6)
    assert rules.retire_ranks(1, 4.7) == [1]
    found = rules.evaluate(5.0)
    assert types_of(found) == [(1, PROCESS_TIMEOUT)]
    assert found[0].observed_s == pytest.approx(3.6)


def test_a_silent_peer_named_at_a_restart_stays_named_until_its_timeout() -> None:
    rules = _rules(world=2)
    _lost_peer(rules)
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=4.6)
    assert types_of(rules.evaluate(5.0)) == [(1, PROCESS_TIMEOUT)]
    assert rules.ranks[1].liveness is Liveness.STALE
    assert rules.evaluate(11.5) == []  # its timeout passes: not a second finding


def test_the_runs_end_names_the_silent_peer_a_held_end_waited_for() -> None:
    rules = _rules(world=2)
    _lost_peer(rules)
    assert rules.end_run() == [0]
    found = rules.evaluate(5.0)
    assert types_of(found) == [(1, PROCESS_TIMEOUT)]
    assert found[0].detail["named_at"] == "run_end"
    assert "no heartbeat for 4.0s when the run ended" in found[0].message
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_failure_of_rank"] == 1


def test_a_restart_with_no_silent_peer_leaves_the_held_end_to_the_restart() -> None:
    # rank 1 still publishes: nothing is named at the restart, rank 0's end is its doing
    rules = _rules(world=2)
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=2.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 2.0)
    assert rules.evaluate(2.0) == []
    rules.ingest(rec(1, 1, t=2.5), 2.5)
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=2.6)
    assert rules.evaluate(3.0) == []
    assert rules.ranks[0].record is not None
    assert rules.ranks[0].record.exit["after_restart"] == "restart 1: worker_failed"


def _node0_lost(rules: Any) -> None:
    """Node 0 (rank 0, and the monitor) was lost; the new round formed at t=3 on the
    survivor, renumbered node 0, whose new monitor reads rank 1's end of t=2 (its
    collective broke: its peer went away) and is told which node did not come back."""
    end1 = rec(1, 5, event="process_end", t=2.0)
    end1["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    assert rules.ingest(end1, 3.5)
    rules.note_lost_node(
        LostNode(
            node=0,
            agent="host0:4242",
            ranks=(0,),
            victim=1,
            restart="restart 1: worker_failed",
            before_ns=BASE_NS + 3_000_000_000,
        )
    )


def test_a_monitor_started_after_node_0_was_lost_names_its_rank_not_the_victim() -> None:
    rules = _rules(world=2)
    _node0_lost(rules)
    found = rules.evaluate(3.5)
    assert types_of(found) == [(0, PROCESS_TIMEOUT)]
    assert found[0].hostname == "host0" and found[0].node_rank == 0
    assert found[0].detail["named_at"] == "restart 1: worker_failed"
    assert found[0].detail["lost_node"]["agent"] == "host0:4242"
    assert "its agent left the rendezvous" in found[0].message
    assert "rank 1's collective with it broke" in found[0].message
    assert rules.ranks[1].record is not None
    assert rules.ranks[1].record.exit["after_failure_of_rank"] == 0
    # the new round's processes come; nothing more is named, ever
    for t in (4.0, 8.0, 12.0):
        for rank in (0, 1):
            rules.ingest(rec(rank, int(t), pid=2000 + rank, t=t), t)
        assert rules.evaluate(t) == []
    assert rules.findings_total == 1


def _node1_lost_too_soon(rules: Any) -> None:
    """Rank 1's node is lost at t=1 and rank 0's collective breaks at t=1.2; the agent
    restarts the group at t=1.3, while rank 1 has been silent less than the fresh
    period: nothing is named at the restart, rank 0's end is the restart's."""
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=1.2)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end0, 1.2)
    assert rules.evaluate(1.2) == []
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=1.3)
    assert rules.evaluate(1.4) == []
    assert rules.fresh_s >= 1.3 - 1.0


def test_a_node_lost_a_moment_before_the_restart_is_named_when_the_new_round_says_so() -> None:
    # node 0 stayed node 0: the new round (a spare in node 1's place) formed without
    # node 1's agent; its rank, seen by this monitor, is named then, with its process
    rules = _rules(world=2)
    _node1_lost_too_soon(rules)
    rules.note_lost_node(
        LostNode(
            node=1,
            agent="host1:4343",
            ranks=(1,),
            victim=0,
            restart="restart 1: worker_failed",
            before_ns=BASE_NS + 3_000_000_000,
        )
    )
    found = rules.evaluate(3.0)
    assert types_of(found) == [(1, PROCESS_TIMEOUT)]
    assert found[0].pid == 1001 and found[0].node_rank == 1
    assert found[0].detail["named_at"] == "restart 1: worker_failed"
    assert "its agent left the rendezvous" in found[0].message
    # its own process timeout, and the new round's processes, name nothing more
    assert rules.evaluate(11.5) == []
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, pid=2000 + rank, t=12.0), 12.0)
    assert rules.evaluate(12.0) == [] and rules.evaluate(13.0) == []
    assert rules.findings_total == 1


def test_a_lost_nodes_rank_named_at_the_restart_is_not_named_again() -> None:
    rules = _rules(world=2)
    _lost_peer(rules)
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=4.6)
    assert types_of(rules.evaluate(5.0)) == [(1, PROCESS_TIMEOUT)]
    rules.note_lost_node(
        LostNode(
            node=1,
            agent="host1:4343",
            ranks=(1,),
            victim=0,
            restart="restart 1: worker_failed",
            before_ns=BASE_NS + 5_000_000_000,
        )
    )
    assert rules.evaluate(5.5) == [] and rules.findings_total == 1


def test_an_end_of_the_new_round_is_not_the_lost_nodes_echo() -> None:
    rules = _rules(world=2)
    _node0_lost(rules)
    assert types_of(rules.evaluate(3.5)) == [(0, PROCESS_TIMEOUT)]
    rules.ingest(rec(0, 0, pid=2000, t=4.0), 4.0)
    rules.ingest(rec(1, 0, pid=2001, t=4.0), 4.0)
    end1 = rec(1, 1, pid=2001, event="process_end", t=5.0)
    end1["exit"] = {"clean": False, "exit_code": 1, "error": _BROKEN}
    rules.ingest(end1, 5.0)
    rules.evaluate(5.0)
    assert rules.ranks[1].record is not None and rules.ranks[1].record.exit is not None
    assert "after_failure_of_rank" not in rules.ranks[1].record.exit


def test_the_agents_root_cause_is_blamed_among_vanished_ranks() -> None:
    # ranks 1 and 2 both vanished in one scan; the agent's exit codes say rank 2 was
    # killed first (rank 1 died in the broken collective without a record)
    rules = _rules(world=3)
    for rank in (0, 1, 2):
        assert rules.ingest(rec(rank, 0, t=1.0), 1.0)
    rules.note_root_cause(2, 1002)
    rules.ingest(vanished_record(rec(1, 0, t=1.0)), 6.0)
    rules.ingest(vanished_record(rec(2, 0, t=1.0)), 6.0)
    assert types_of(rules.evaluate(6.5)) == [(2, PROCESS_EXITED)]
    assert rules.ranks[1].record is not None
    assert rules.ranks[1].record.exit["after_failure_of_rank"] == 2


def test_a_root_cause_for_another_pid_is_ignored() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        assert rules.ingest(rec(rank, 0, t=1.0), 1.0)
    rules.note_root_cause(1, 99)  # a process of rank 1 that is not this one
    end0 = rec(0, 1, event="process_end", t=4.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": "ValueError: bad batch"}
    rules.ingest(end0, 6.0)
    rules.ingest(vanished_record(rec(1, 0, t=1.0)), 6.0)
    assert types_of(rules.evaluate(6.5)) == [(0, PROCESS_EXITED)]


def test_an_own_error_is_blamed_before_a_vanished_peer() -> None:
    rules = _rules(world=2)
    assert rules.ingest(rec(1, 0, t=1.0), 1.0)
    end0 = rec(0, 1, event="process_end", t=4.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": "ValueError: bad batch"}
    rules.ingest(end0, 6.0)
    rules.ingest(vanished_record(rec(1, 0, t=1.0)), 6.0)
    assert types_of(rules.evaluate(6.5)) == [(0, PROCESS_EXITED)]


def test_independent_failure_long_after_first_is_reported() -> None:
    rules = _rules(world=2)
    end0 = rec(0, 1, event="process_end", t=1.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": "a"}
    rules.ingest(end0, 1.0)
    rules.ingest(rec(1, 0, progress_seq=3), 1.0)
    assert types_of(rules.evaluate(1.5)) == [(0, PROCESS_EXITED)]
    end1 = rec(1, 1, event="process_end", t=50.0)
    end1["exit"] = {"clean": False, "exit_code": 1, "error": "b"}
    rules.ingest(end1, 50.0)
    assert types_of(rules.evaluate(50.5)) == [(1, PROCESS_EXITED)]


def test_after_restart_peer_of_new_failure_is_not_blamed() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, t=0.0, event="process_start"), 0.0)
    end0 = rec(0, 1, event="process_end", t=1.0)
    end0["exit"] = {"clean": False, "exit_code": 1, "error": "first crash"}
    rules.ingest(end0, 1.0)
    end1 = rec(1, 1, event="process_end", t=2.0)
    end1["exit"] = {"clean": False, "exit_code": -15, "error": "terminated"}
    rules.ingest(end1, 2.0)
    assert types_of(rules.evaluate(2.5)) == [(0, PROCESS_EXITED)]
    # in-job restart: both ranks come back with new pids and train for a while
    for rank in (0, 1):
        rules.ingest(rec(rank, 0, pid=2000 + rank, t=100.0, event="process_start"), 100.0)
    assert rules.evaluate(100.5) == []
    # second episode: rank 1 crashes, rank 0 is terminated 2 s later by the launcher
    e1 = rec(1, 1, pid=2001, event="process_end", t=105.0)
    e1["exit"] = {"clean": False, "exit_code": 1, "error": "second crash"}
    rules.ingest(e1, 105.0)
    assert types_of(rules.evaluate(105.5)) == [(1, PROCESS_EXITED)]
    e0 = rec(0, 1, pid=2000, event="process_end", t=107.0)
    e0["exit"] = {"clean": False, "exit_code": -15, "error": "terminated"}
    rules.ingest(e0, 107.0)
    assert rules.evaluate(107.5) == []


# ---- culprits and victims ------------------------------------------------------------


def test_rank_furthest_behind_is_the_culprit() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    findings = []
    for t in range(0, 30):
        feed.beat(0, t, progress_seq=10, since=float(t))
        feed.beat(1, t, progress_seq=9, since=float(t) + 3.0)
        findings += rules.evaluate(t + 0.5)
    assert types_of(findings) == [(1, PROGRESS_TIMEOUT)]
    assert rules.ranks[1].progress is Progress.STALLED
    assert rules.ranks[0].progress is Progress.STALLED
    assert rules.ranks[0].blocked_by == [1]
    assert rules.ranks[0].active == set()


def test_culprit_found_in_same_scan_when_both_cross_together() -> None:
    rules = _rules(world=2)
    rules.ingest(rec(0, 0, progress_seq=10, since=25.0), 0.0)
    rules.ingest(rec(1, 0, progress_seq=9, since=25.0), 0.0)
    findings = rules.evaluate(1.0)
    assert types_of(findings) == [(1, PROGRESS_TIMEOUT)]
    assert rules.ranks[0].blocked_by == [1]


def test_stale_rank_is_the_only_culprit_of_stalled_peers() -> None:
    rules = _rules(world=3)
    feed = Feed(rules)
    for rank in (0, 1, 2):
        feed.beat(rank, 0, progress_seq=10, since=0.0)
    findings = []
    for t in range(1, 40):
        # rank 2 was SIGSTOPped: no more heartbeats; ranks 0 and 1 wait in a collective
        feed.beat(0, t, progress_seq=10, since=float(t))
        feed.beat(1, t, progress_seq=10, since=float(t))
        findings += rules.evaluate(t + 0.5)
    assert types_of(findings) == [(2, PROCESS_TIMEOUT)]
    assert rules.ranks[2].liveness is Liveness.STALE
    for rank in (0, 1):
        assert rules.ranks[rank].progress is Progress.STALLED
        assert rules.ranks[rank].blocked_by == [2]


def test_errored_rank_is_the_culprit_of_stalled_peers() -> None:
    rules = _rules(world=2)
    end = rec(1, 0, event="process_end", progress_seq=5)
    end["exit"] = {"clean": False, "exit_code": 1, "error": "boom"}
    rules.ingest(end, 0.0)
    rules.ingest(rec(0, 0, progress_seq=5, since=30.0), 0.0)
    findings = rules.evaluate(0.5)
    assert types_of(findings) == [(1, PROCESS_EXITED)]
    assert rules.ranks[0].blocked_by == [1]


def test_all_stalled_at_same_seq_are_all_reported() -> None:
    rules = _rules(world=3)
    for rank in range(3):
        rules.ingest(rec(rank, 0, progress_seq=10, since=21.0), 0.0)
    findings = rules.evaluate(0.5)
    assert sorted(types_of(findings)) == [(r, PROGRESS_TIMEOUT) for r in range(3)]
    for rank in range(3):
        assert rules.ranks[rank].blocked_by == []


def test_all_stalled_at_same_seq_reported_even_when_crossing_in_different_scans() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    reported: set[int] = set()
    for t in range(0, 40):
        # same step; rank 0's progress age is 1.5 s ahead of rank 1's (seen a scan later)
        feed.beat(0, t, progress_seq=10, since=float(t) + 1.5)
        feed.beat(1, t, progress_seq=10, since=float(t))
        reported |= {f.rank for f in rules.evaluate(t + 0.1)}
    assert reported == {0, 1}


def test_victim_of_recovered_culprit_waits_one_more_timeout() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    fired: list[tuple[int, int]] = []
    for t in range(0, 23):
        feed.beat(0, t, progress_seq=10, since=float(t))
        feed.beat(1, t, progress_seq=9, since=float(t) + 5.0)
        fired += [(t, f.rank) for f in rules.evaluate(t + 0.5)]
    assert fired == [(15, 1)]
    assert rules.ranks[0].blocked_by == [1]
    # the culprit recovers (progresses again); rank 0 stays stuck
    for t in range(23, 60):
        feed.beat(0, t, progress_seq=10, since=float(t))
        feed.beat(1, t, progress_seq=10 + t, since=0.1)
        fired += [(t, f.rank) for f in rules.evaluate(t + 0.5)]
    assert rules.ranks[1].progress is Progress.PROGRESSING
    # culprit gone at scan 23.5; rank 0 gets one more progress timeout (20 s)
    assert fired == [(15, 1), (44, 0)]


# ---- GPU health -------------------------------------------------------------------


def _health(verdict: str, **extra: Any) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def lookup(record: HeartbeatRecord) -> dict[str, Any] | None:
        if record.rank != 1:
            return None
        return {"uuid": "GPU-1", "health": verdict, "problems": ["ecc_uncorrected=2"], **extra}

    return lookup


def test_unhealthy_gpu_fires_failure_once() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    findings = []
    for t in range(0, 5):
        feed.beat(0, t, progress_seq=t + 1)
        feed.beat(1, t, progress_seq=t + 1)
        findings += rules.evaluate(t + 0.5, _health("unhealthy"))
    assert types_of(findings) == [(1, "gpu_hardware_health_failure")]
    f = findings[0]
    assert f.reason == "gpu_unhealthy"
    assert f.gpu_health["uuid"] == "GPU-1"
    assert f.gpu["token"] == "GPU-1"
    assert "ecc_uncorrected=2" in f.message
    assert rules.ranks[1].gpu_health is not None
    assert rules.ranks[0].gpu_health is None


def test_warning_gpu_fires_warning() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        rules.ingest(rec(rank, 0), 0.0)
    findings = rules.evaluate(0.5, _health("warning"))
    assert types_of(findings) == [(1, "gpu_hardware_health_warning")]
    assert findings[0].reason == "gpu_warning"


def test_stale_health_gives_no_finding() -> None:
    rules = _rules(world=2)
    for rank in (0, 1):
        rules.ingest(rec(rank, 0), 0.0)
    assert rules.evaluate(0.5, _health("unhealthy", stale=True)) == []
    assert rules.evaluate(0.6, _health("warning", stale=True)) == []


def test_health_finding_refires_after_gpu_recovers() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    out = []
    for seq, verdict in enumerate(("unhealthy", "unhealthy", "ok", "unhealthy"), start=1):
        feed.beat(0, seq, progress_seq=seq)
        feed.beat(1, seq, progress_seq=seq)
        out += types_of(rules.evaluate(seq + 0.5, _health(verdict)))
    assert out == [(1, "gpu_hardware_health_failure")] * 2
