"""The launcher's side: records carry the restart, one finding and one restarts.jsonl
line per in-process restart, the re-entry is not a hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.inprocess import RESTART_PHASE
from rankguard.inprocess.monitor import InProcessRestarts
from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.findings import FindingType, Reason
from rankguard.schema.records import HeartbeatRecord, RecordError
from rankguard.schema.restarts import RestartEntry
from rankguard.util.fs import QueuedJsonl
from tests.factories import (
    RUN_ID,
    FakeClock,
    heartbeat_config,
    heartbeat_record,
    heartbeat_rules,
    read_jsonl,
    types_of,
    write_heartbeats,
)


def _last(rid: str = "run/0/1/0", cause: str = "exception", culprit: int = 1) -> dict[str, Any]:
    return {
        "id": rid,
        "round": 0,
        "cause": cause,
        "culprit": culprit,
        "culprit_host": "h1",
        "message": "RuntimeError: boom",
    }


def _inproc(restarts: int, last: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"restarts": restarts, "recovering": False}
    if last is not None:
        out["last"] = last
    return out


def test_record_keeps_and_validates_the_inprocess_object() -> None:
    raw = heartbeat_record(0, inprocess=_inproc(1, _last()))
    rec = HeartbeatRecord.from_dict(raw)
    assert rec.inprocess is not None and rec.inprocess["restarts"] == 1
    assert rec.to_dict()["inprocess"] == raw["inprocess"]
    assert "inprocess" not in HeartbeatRecord.from_dict(heartbeat_record(0)).to_dict()
    with pytest.raises(RecordError, match=r"inprocess\.restarts"):
        HeartbeatRecord.from_dict(heartbeat_record(0, inprocess={"restarts": "1"}))
    with pytest.raises(RecordError, match=r"inprocess\.culprit"):
        HeartbeatRecord.from_dict(
            heartbeat_record(0, inprocess=_inproc(1, {**_last(), "culprit": "x"}))
        )


def test_one_finding_and_one_line_per_restart_whichever_rank_shows_it() -> None:
    rules = heartbeat_rules(2)
    lines: list[RestartEntry] = []
    ev = InProcessRestarts("run", lines.append)
    rules.ingest(heartbeat_record(0, 1, t=1.0, inprocess=_inproc(1, _last())), 1.0)
    found = ev.evaluate(1.0, rules.ranks)
    assert types_of(found) == [(1, "inprocess_restart")]  # the culprit, not the reporter
    f = found[0]
    assert f.reason is Reason.INPROCESS_EXCEPTION and "in-process restart 1" in f.message
    assert f.info.default_action == "report" and not f.info.hang
    assert f.detail["inprocess"]["cause"] == "exception"
    rules.ingest(heartbeat_record(1, 1, t=1.5, inprocess=_inproc(1, _last())), 1.5)
    assert ev.evaluate(1.5, rules.ranks) == []  # the same restart seen on rank 1
    assert [(x.kind, x.restart, x.rank) for x in lines] == [("inprocess", 1, 1)]
    assert list(lines[0].to_dict()) == [  # the launcher adds wall_time
        *("schema_version", "kind", "run_id", "restart", "cause", "rank", "reason"),
        *("message", "id"),
    ]
    hang = _last("run/0/1/1", "soft_timeout", 0)
    rules.ingest(heartbeat_record(1, 2, t=5.0, inprocess=_inproc(2, hang)), 5.0)
    found = ev.evaluate(5.0, rules.ranks)
    assert types_of(found) == [(0, "inprocess_restart")]
    assert found[0].reason is Reason.INPROCESS_HANG
    assert ev.status() == {"restarts": 2, "last": {"restarts": 2, **hang}}
    assert FindingType.INPROCESS_RESTART.value == "inprocess_restart"


def test_no_restart_no_finding_and_no_status() -> None:
    rules = heartbeat_rules(2)
    rules.ingest(heartbeat_record(0, 1, t=1.0, inprocess=_inproc(0, None)), 1.0)
    ev = InProcessRestarts("run")
    assert ev.evaluate(1.0, rules.ranks) == [] and ev.status() is None


def test_the_reentry_phase_has_its_own_timeout_not_the_progress_timeout() -> None:
    """A rank re-entering (phase inprocess_restart) long after its last step is not a
    stall while the re-entry lasts less than its section timeout (hard_timeout)."""
    rules = heartbeat_rules(1, section_timeouts={RESTART_PHASE: 90.0})
    rec = heartbeat_record(
        0, 1, t=1.0, world_size=1, phase=RESTART_PHASE, since=50.0, phase_elapsed=10.0
    )
    rules.ingest(rec, 1.0)
    assert rules.evaluate(1.0) == []  # 50 s since the last step > progress timeout 20 s
    rec = heartbeat_record(
        0, 2, t=2.0, world_size=1, phase=RESTART_PHASE, since=150.0, phase_elapsed=95.0
    )
    rules.ingest(rec, 2.0)
    assert types_of(rules.evaluate(2.0)) == [(0, "rank_section_timeout")]


def test_tracker_progress_clock_restarts_after_a_reentry() -> None:
    from rankguard.rank.timeline import ProgressTracker
    from tests.factories import FakeNsClock

    clock = FakeNsClock()
    tracker = ProgressTracker(clock=clock, mode="cpu")
    tracker.step_end()
    clock.advance(40.0)
    assert tracker.snapshot()["since_progress_s"] == pytest.approx(40.0)
    tracker.mark_recovered()
    assert tracker.snapshot()["since_progress_s"] == 0.0
    assert tracker.progress_seq == 1  # no step counted


RESTARTS = [
    {"kind": "process", "restart": 1, "cause": "rank_process_exited", "rank": 0, "message": "x"},
    {"kind": "inprocess", "restart": 1, "cause": "exception", "rank": 1, "message": "boom"},
]


def test_status_screen_and_report_tell_the_two_kinds_apart(tmp_path: Any) -> None:
    from rankguard.cli.status_render import _ft_lines
    from rankguard.report.data import RunData
    from rankguard.report.tables import restarts_table

    lines = _ft_lines({"restarts": RESTARTS})
    assert "Restarts: 2 (1 process, 1 in-process)" in lines
    assert any(line.strip().startswith("in-process #1") for line in lines)
    entries = [RestartEntry.from_dict(r) for r in RESTARTS]
    html = restarts_table(RunData(run_id="r", restarts=[e for e in entries if e is not None]))
    assert "1 of the processes, 1 in-process" in html and "boom" in html
    assert restarts_table(RunData(run_id="r")) == ""


LIVE = {
    "kind": "live_recovery",
    "restart": 1,
    "cause": "rank_process_exited",
    "rank": 2,
    "lost_rank": 2,
    "message": "process ended (SIGKILL); standby pid 9 took rank 2",
    "recovery_s": 0.8,
    "steps_redone": 0,
}


def test_status_screen_and_report_show_a_live_recovery_with_its_cost() -> None:
    from rankguard.cli.status_render import _ft_lines
    from rankguard.report.data import RunData
    from rankguard.report.tables import restarts_table

    live = {
        "standbys_per_node": 1,
        "waiting": 0,
        "left_unused": 0,
        "used": 1,
        "replaced": [
            {"lost_rank": 2, "lost_pid": 7, "standby_pid": 9, "cause": "x"},
            {
                "lost_rank": 1,
                "lost_pid": 8,
                "standby_pid": 10,
                "cause": "x",
                "source": "replica on rank 0",
            },
        ],
    }
    lines = _ft_lines({"restarts": [*RESTARTS, LIVE], "live": live})
    assert "Restarts: 3 (1 process, 1 in-process, 1 live recovery)" in lines
    row = next(line for line in lines if line.strip().startswith("live #1"))
    assert "(fault -> next step 0.8 s, 0 step(s) redone)" in row
    assert "Standbys: 1 per node, 0 waiting, 1 used, 0 left unused" in lines
    assert "  rank 2: pid 7 lost (x), now standby pid 9" in lines  # its source not said yet
    assert "  rank 1: pid 8 lost (x), now standby pid 10, state from replica on rank 0" in lines
    entries = [RestartEntry.from_dict(r) for r in [*RESTARTS, LIVE]]
    html = restarts_table(RunData(run_id="r", restarts=[e for e in entries if e is not None]))
    assert "1 of the processes, 1 in-process, 1 lost rank(s) taken over by a standby" in html
    assert "fault -&gt; next step 0.8 s" in html or "fault -> next step 0.8 s" in html


def test_a_live_round_is_a_finding_but_not_a_second_restarts_line() -> None:
    rules = heartbeat_rules(4)
    lines: list[RestartEntry] = []
    ev = InProcessRestarts("run", lines.append)
    live = _last("run/0/1/0", "rank_lost", 2)
    rules.ingest(heartbeat_record(0, 1, t=1.0, inprocess=_inproc(1, live)), 1.0)
    found = ev.evaluate(1.0, rules.ranks)
    assert [f.reason for f in found] == [Reason.LIVE_REPLACED]
    assert lines == []  # the launcher writes the recovery's line (kind live_recovery)


def _killed_after_reentry(old: int, new: int) -> list[dict[str, Any]]:
    """Rank 0 (pid ``old``) re-entered after an exception and was SIGKILLed at once; a
    standby (pid ``new``) took rank 0 in a live round: its records follow in 0.1 s."""
    first = _last("run/0/1/0", "exception", 0)
    live = _last("run/0/1/1", "rank_lost", 0)
    one = {"world_size": 1, "hostname": "h0"}
    return [
        heartbeat_record(0, 2, old, t=1.0, inprocess=_inproc(1, first), **one),
        heartbeat_record(0, 0, new, t=1.1, event="process_start", **one),
        heartbeat_record(0, 1, new, t=1.2, inprocess=_inproc(2, live), **one),
    ]


@pytest.mark.parametrize("newcomer_first", [False, True])
def test_a_reentry_shown_by_one_record_only_keeps_its_line(
    tmp_path: Path, newcomer_first: bool
) -> None:
    """The re-entered process's last record and its standby's are read in the same scan
    (in either order): the re-entry has its finding and its restarts.jsonl line, though
    the rank's latest record at the scan's end shows only the live round."""
    clock = FakeClock()
    mon = JobMonitor(
        heartbeat_config(scan_interval_s=0.5),
        tmp_path,
        RUN_ID,
        expected_world_size=1,
        clock=clock,
        check_pids=False,
    )
    restarts = QueuedJsonl(tmp_path / "restarts.jsonl")
    mon.add_evaluator(InProcessRestarts(RUN_ID, lambda e: restarts.append([e.to_dict()])))
    start = heartbeat_record(0, 0, 1000, event="process_start", world_size=1, hostname="h0")
    write_heartbeats(tmp_path, start, {**start, "event": "heartbeat", "seq": 1})
    assert mon.scan_once() == []
    old, newcomer_start, newcomer = _killed_after_reentry(1000, 2000)
    clock.t += 0.5
    if newcomer_first:  # one scan reads the newcomer's file, then the lost one's
        mon.rules.ingest(newcomer_start, clock())
        mon.rules.ingest(newcomer, clock())
        mon.rules.ingest(old, clock())
        found = [f for e in mon._evaluators for f in e.evaluate(clock(), mon.rules.ranks)]
    else:
        write_heartbeats(tmp_path, old, newcomer_start, newcomer)
        found = mon.scan_once()
    reentry = [f for f in found if f.finding_type is FindingType.INPROCESS_RESTART]
    assert [f.reason for f in reentry] == [Reason.INPROCESS_EXCEPTION, Reason.LIVE_REPLACED]
    assert "in-process restart 1: exception on rank 0 (h1)" in reentry[0].message
    assert reentry[0].pid == 1000  # the record that said it, not the newcomer's
    lines = read_jsonl(tmp_path / "restarts.jsonl")
    assert [(x["kind"], x["restart"], x["id"]) for x in lines] == [("inprocess", 1, "run/0/1/0")]
