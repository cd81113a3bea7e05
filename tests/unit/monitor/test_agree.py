"""All ranks stop at one step: the stop step, control.json, the rank's reader, the
session's ``should_stop()`` and the launcher side (``fastest_step_s``, ``request_stop``).

No processes: the heartbeat thread's tick is called by hand (``_poll_control``), and
the launcher side runs against a fake monitor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.monitor.agree import (
    CONTROL_FILE,
    ControlReader,
    StopAgreement,
    choose_stop_step,
    fastest_step_s,
    finished_before_stop,
    script_offset,
    write_control,
)
from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.cadence import Cadence
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import HeartbeatRecord, RecordError
from rankguard.session import Session
from tests.factories import rank_identity
from tests.factories import read_records as _records

RUN = "run-agree"

# ---- choose_stop_step ------------------------------------------------------------------


def test_stop_step_is_furthest_plus_lead_in_steps() -> None:
    # 4 s of lead at 0.1 s per step: 40 steps after the furthest rank
    assert choose_stop_step({0: 5, 1: 9, 2: 7}, 0.1, 4.0) == 49
    # not an integer number of steps: round up
    assert choose_stop_step({0: 10}, 0.3, 1.0) == 14


def test_stop_step_margin_is_at_least_two() -> None:
    assert choose_stop_step({0: 10, 1: 11}, 5.0, 1.0) == 13  # ceil(0.2) = 1 -> 2
    assert choose_stop_step({0: 10}, 5.0, 0.0) == 12


@pytest.mark.parametrize("step_time", [None, 0.0, -1.0])
def test_stop_step_without_a_step_time_is_ten_ahead(step_time: float | None) -> None:
    assert choose_stop_step({0: 3, 1: 8}, step_time, 5.0) == 18


def test_stop_step_without_ranks() -> None:
    assert choose_stop_step({}, None, 5.0) == 10
    assert choose_stop_step({}, 1.0, 5.0) == 5


# ---- write_control / ControlReader -----------------------------------------------------


def test_write_control_writes_atomically(tmp_path: Path) -> None:
    control = write_control(tmp_path, 42, "straggler: rank 3")
    path = tmp_path / CONTROL_FILE
    assert json.loads(path.read_text(encoding="utf-8")) == control
    assert control["stop_at_step"] == 42 and control["reason"] == "straggler: rank 3"
    assert control["schema_version"] == 1 and control["requested_wall_time"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONTROL_FILE]  # no temp left
    write_control(tmp_path, 50, "again")  # replaces, never appends or tears
    assert json.loads(path.read_text(encoding="utf-8"))["stop_at_step"] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONTROL_FILE]


def test_write_control_creates_the_run_dir(tmp_path: Path) -> None:
    write_control(tmp_path / "a" / "b", 7, "x")
    assert (tmp_path / "a" / "b" / CONTROL_FILE).is_file()


def _set_mtime(path: Path, seconds: float) -> None:
    os.utime(path, (seconds, seconds))


def test_reader_missing_file_is_no_stop(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    reader.poll()
    reader.poll()
    assert reader.stop_at_step is None and reader.reason is None


def test_reader_picks_control_up_once_by_mtime(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    write_control(tmp_path, 12, "first")
    path = tmp_path / CONTROL_FILE
    _set_mtime(path, 1_000_000.0)
    reader.poll()
    assert (reader.stop_at_step, reader.reason) == (12, "first")
    # same mtime: the reader does not read again (one stat per beat)
    path.write_text(json.dumps({"stop_at_step": 99, "reason": "sneaky"}), encoding="utf-8")
    _set_mtime(path, 1_000_000.0)
    reader.poll()
    assert (reader.stop_at_step, reader.reason) == (12, "first")
    # rewritten (new mtime): updated
    write_control(tmp_path, 20, "second")
    _set_mtime(path, 1_000_001.0)
    reader.poll()
    assert (reader.stop_at_step, reader.reason) == (20, "second")


def test_reader_ignores_malformed_file_and_retries(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    path = tmp_path / CONTROL_FILE
    path.write_text('{"stop_at_step": 1', encoding="utf-8")  # torn / not JSON
    _set_mtime(path, 1_000_000.0)
    reader.poll()
    assert reader.stop_at_step is None
    # fixed in place with the same mtime: a malformed read is retried, not remembered
    path.write_text('{"stop_at_step": 15, "reason": "ok"}', encoding="utf-8")
    _set_mtime(path, 1_000_000.0)
    reader.poll()
    assert (reader.stop_at_step, reader.reason) == (15, "ok")


@pytest.mark.parametrize(
    "content", ['{"stop_at_step": "12"}', '{"stop_at_step": 12.5}', '{"reason": "x"}', "{}"]
)
def test_reader_ignores_a_control_without_an_integer_step(tmp_path: Path, content: str) -> None:
    reader = ControlReader(tmp_path)
    (tmp_path / CONTROL_FILE).write_text(content, encoding="utf-8")
    reader.poll()
    assert reader.stop_at_step is None


def test_reader_keeps_the_previous_step_on_a_bad_rewrite(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    path = tmp_path / CONTROL_FILE
    write_control(tmp_path, 30, "first")
    _set_mtime(path, 1_000_000.0)
    reader.poll()
    path.write_text("garbage", encoding="utf-8")
    _set_mtime(path, 1_000_001.0)
    reader.poll()
    assert reader.stop_at_step == 30


def test_reader_ignores_a_json_document_that_is_not_an_object(tmp_path: Path) -> None:
    reader = ControlReader(tmp_path)
    (tmp_path / CONTROL_FILE).write_text("[1, 2]", encoding="utf-8")
    reader.poll()
    assert reader.stop_at_step is None


# ---- Session.should_stop ---------------------------------------------------------------


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    # a long interval: the heartbeat thread does not tick on its own during a test
    s = Session(
        rank_identity(run_id=RUN),
        tmp_path,
        HeartbeatConfig(publish_interval_s=20.0),
        tracker=ProgressTracker(mode="cpu"),
        publish=True,
    )
    try:
        yield s
    finally:
        s.close()


def _tick(s: Session) -> None:
    """What the heartbeat thread does before each record."""
    assert s.publisher is not None
    for tick in s.publisher.ticks:
        tick()


def test_session_registers_the_control_poll(session: Session) -> None:
    assert session.publisher is not None
    assert session._poll_control in session.publisher.ticks


def test_should_stop_exactly_at_the_agreed_step(session: Session, tmp_path: Path) -> None:
    _tick(session)
    assert session.should_stop() is False and session.stop_reason is None
    session.step_end(1)
    write_control(tmp_path, 3, "straggler: rank 2")
    assert session.should_stop() is False  # not seen until the heartbeat thread polls
    _tick(session)
    assert session.stop_reason == "straggler: rank 2"
    assert session.should_stop() is False  # step 1 < 3
    session.step_end(2)
    assert session.should_stop() is False
    session.step_end(3)
    assert session.should_stop() is True
    session.step_end(4)  # a rank that ran past it (never happens in the loop) still stops
    assert session.should_stop() is True


def test_should_stop_at_once_when_already_past(session: Session, tmp_path: Path) -> None:
    for i in range(1, 6):
        session.step_end(i)
    write_control(tmp_path, 4, "late")
    session._poll_control()
    assert session.should_stop() is True


def test_should_stop_counts_issued_steps_not_iterations(session: Session, tmp_path: Path) -> None:
    write_control(tmp_path, 2, "x")
    session._poll_control()
    session.step_end(1000)  # a resumed job's iteration number
    assert session.should_stop() is False
    session.step_end(1001)
    assert session.should_stop() is True


def test_should_stop_follows_a_rewritten_control(session: Session, tmp_path: Path) -> None:
    path = tmp_path / CONTROL_FILE
    write_control(tmp_path, 2, "first")
    _set_mtime(path, 1_000_000.0)
    session._poll_control()
    write_control(tmp_path, 5, "later")
    _set_mtime(path, 1_000_001.0)
    session._poll_control()
    for i in range(1, 5):
        session.step_end(i)
        assert session.should_stop() is False
    session.step_end(5)
    assert session.should_stop() is True and session.stop_reason == "later"


def test_should_stop_without_publisher_is_false(tmp_path: Path) -> None:
    s = Session(
        rank_identity(run_id=RUN),
        tmp_path,
        HeartbeatConfig(),
        tracker=ProgressTracker(mode="cpu"),
        publish=False,
    )
    write_control(tmp_path, 1, "ignored")
    s.step_end(1)
    s.step_end(2)
    assert s.should_stop() is False and s.stop_reason is None


# ---- launcher side ---------------------------------------------------------------------


def _raw(**kw: Any) -> dict[str, Any]:
    return {"event": "heartbeat", "run_id": RUN, "rank": 0, "pid": 100, **kw}


def _rec(**kw: Any) -> HeartbeatRecord:
    return HeartbeatRecord.from_dict(_raw(**{"phase": "train", **kw}))


def test_fastest_step_s_from_perf_windows() -> None:
    records = [_rec(perf={"step_time_ms": 250.0}), _rec(perf={"step_time_ms": 120})]
    assert fastest_step_s(records) == pytest.approx(0.12)


def test_fastest_step_s_from_phase_elapsed_and_progress() -> None:
    records = [
        _rec(progress_seq=10, phase_elapsed_s=2.0),  # 0.2 s a step
        _rec(progress_seq=40, phase_elapsed_s=4.0),  # 0.1 s a step
    ]
    assert fastest_step_s(records) == pytest.approx(0.1)


def test_fastest_step_s_takes_the_minimum_of_both_sources() -> None:
    records = [
        _rec(perf={"step_time_ms": 300.0}, progress_seq=10, phase_elapsed_s=1.0),
        _rec(perf={"step_time_ms": 90.0}, progress_seq=10, phase_elapsed_s=5.0),
    ]
    assert fastest_step_s(records) == pytest.approx(0.09)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"phase": "setup", "progress_seq": 10, "phase_elapsed_s": 2.0},  # not training
        {"phase": "train", "progress_seq": 0, "phase_elapsed_s": 2.0},  # no step yet
        {"phase": "train", "progress_seq": 10, "phase_elapsed_s": 0.0},
        {"phase": "train", "progress_seq": 10},
        {"phase": "train", "progress_seq": "10", "phase_elapsed_s": 2.0},
        {"phase": "train", "perf": None},
        {"phase": "train", "perf": [120.0]},
        {"phase": "train", "perf": {"step_time_ms": None}},
        {"phase": "train", "perf": {"step_time_ms": "120"}},
        {"phase": "train", "perf": {"step_time_ms": 0.0}},
        {"phase": "train", "perf": {"step_time_ms": -5.0}},
    ],
)
def test_fastest_step_s_ignores_unusable_records(fields: dict[str, Any]) -> None:
    try:
        record = HeartbeatRecord.from_dict(_raw(**fields))
    except RecordError:
        return  # rejected where records come in: it can never reach the stop step
    assert fastest_step_s([record]) is None
    assert fastest_step_s([record, _rec(perf={"step_time_ms": 500.0})]) == pytest.approx(0.5)


def test_fastest_step_s_without_records() -> None:
    assert fastest_step_s([]) is None


@dataclass
class _State:
    record: HeartbeatRecord | None


def _agreement(
    tmp_path: Path, ranks: dict[int, _State], stop_on_straggler: Any = lambda: False
) -> StopAgreement:
    return StopAgreement(
        tmp_path,
        Cadence.of(HeartbeatConfig()),
        lambda: ranks,  # type: ignore[arg-type,return-value]
        stop_on_straggler=stop_on_straggler,
    )


def _finding(ftype: FindingType, message: str) -> Finding:
    return Finding(
        finding_type=ftype, run_id=RUN, rank=0, reason=Reason.SLOW_COMPUTE, message=message
    )


def test_request_stop_writes_control_ahead_of_the_furthest_rank(tmp_path: Path) -> None:
    ranks = {
        0: _State(_rec(progress_seq=100, perf={"step_time_ms": 200.0})),
        1: _State(_rec(rank=1, progress_seq=103, phase_elapsed_s=41.2)),  # 0.4 s a step
        2: _State(None),  # not observed yet
    }
    agreement = _agreement(tmp_path, ranks)
    # lead = 2 publish + 2 scan + 1 s = 13 s at the defaults; fastest step 0.2 s (rank 0)
    assert agreement.cadence.stop_lead_s == 13.0
    stop_at = agreement.request_stop("straggler: rank 1")
    assert stop_at == 103 + 65 == agreement.stop_at
    control = json.loads((tmp_path / CONTROL_FILE).read_text(encoding="utf-8"))
    assert control["stop_at_step"] == stop_at and control["reason"] == "straggler: rank 1"
    assert agreement.status_fields()["stop_requested"].to_dict() == {
        "stop_at_step": stop_at,
        "reason": "straggler: rank 1",
        "stop_at_script_step": None,
    }
    reader = ControlReader(tmp_path)
    reader.poll()
    assert reader.stop_at_step == stop_at


def test_stop_on_straggler_requests_once(tmp_path: Path) -> None:
    ranks = {0: _State(_rec(progress_seq=10))}
    detector = SimpleNamespace(stop_requested=False)  # stop_if_detected off: no stop
    svc = _agreement(tmp_path, ranks, lambda: detector.stop_requested)
    assert svc.status_fields() == {}
    svc.after_write(_finding(FindingType.STRAGGLER, "rank 0 slow"))
    assert svc.stop_at is None and not (tmp_path / CONTROL_FILE).exists()
    detector.stop_requested = True  # the detector decided (stop_if_detected)
    svc.after_write(_finding(FindingType.PROGRESS_TIMEOUT, "hang"))
    assert svc.stop_at is None and not (tmp_path / CONTROL_FILE).exists()
    svc.after_write(_finding(FindingType.STRAGGLER, "rank 0 slow"))
    first = svc.stop_at
    assert first == 20  # no step time known: 10 steps ahead
    ranks[0] = _State(_rec(progress_seq=50))
    svc.after_write(_finding(FindingType.STRAGGLER, "rank 1 slow"))
    assert svc.stop_at == first  # a second straggler does not move the agreed step
    control = json.loads((tmp_path / CONTROL_FILE).read_text(encoding="utf-8"))
    assert control["reason"] == "straggler: rank 0 slow"


def test_the_stop_step_counts_training_steps_not_saves(tmp_path: Path) -> None:
    # rank 0 saved 3 times more than rank 1: same training step, different progress_seq;
    # the stop step is in training steps, which every rank counts alike
    ranks = {
        0: _State(_rec(progress_seq=53, checkpoint_count=3, perf={"step_time_ms": 200.0})),
        1: _State(_rec(rank=1, progress_seq=50, checkpoint_count=0)),
    }
    stop_at = _agreement(tmp_path, ranks).request_stop("preempted")
    assert stop_at == 50 + 65  # furthest rank's training step + 13 s / 0.2 s


def test_a_session_stops_at_the_agreed_training_step_whatever_its_saves(
    tmp_path: Path,
) -> None:
    from rankguard.rank.timeline import ProgressTracker

    tracker = ProgressTracker()
    for _ in range(4):
        tracker.step_end()
    tracker.checkpoint_start("extra")  # a save only this rank makes
    tracker.checkpoint_end()
    assert tracker.issued_seq - tracker.checkpoint_count == 4  # what should_stop compares


# ---- the stop step's numbering, and a training that ended before it ------------------


def test_a_rank_that_stops_at_the_request_says_so_in_its_end(
    session: Session, tmp_path: Path
) -> None:
    """should_stop() said stop: the process_end carries the training steps it left at,
    so the launcher tells a stop from a training that ran to its end."""
    write_control(tmp_path, 2, "straggler: rank 2")
    session._poll_control()
    session.step_end(101)
    assert session.should_stop() is False
    session.step_end(102)
    assert session.should_stop() is True
    session.close(clean=True, exit_code=0)
    end = _records(tmp_path / heartbeat_file_name(0, os.getpid()))[-1]
    assert end["event"] == "process_end" and end["exit"]["stopped_at"] == 2


def test_a_rank_that_finished_before_the_stop_step_does_not(
    session: Session, tmp_path: Path
) -> None:
    write_control(tmp_path, 5, "preempted: node 0's launcher received SIGTERM")
    session._poll_control()
    for i in (1, 2):
        session.step_end(i)
        assert session.should_stop() is False
    session.close(clean=True, exit_code=0)
    end = _records(tmp_path / heartbeat_file_name(0, os.getpid()))[-1]
    assert end["exit"] == {"clean": True, "exit_code": 0, "error": None}


def test_leaving_after_the_signal_says_it_left_at_the_request(session: Session) -> None:
    session.step_end(1)
    with pytest.raises(SystemExit):
        session.exit_preempted()
    assert session.tracker.stopped_at == 1


def test_the_script_step_of_a_stop_step_from_a_save() -> None:
    """A run resumed from script step 100 saved step 150 after 50 of its training steps:
    its stop step 99 is the script's step 199."""
    saved = {"signal_received": True, "saved_step": 150, "saved_seq": 50}
    records = [_rec(progress_seq=60, preempt=saved), _rec(rank=1, progress_seq=61, preempt=saved)]
    assert script_offset(records) == 100


def test_the_script_step_of_a_stop_step_from_the_iteration_shown() -> None:
    records = [
        _rec(progress_seq=60, iteration=160, iteration_source="script"),
        _rec(rank=1, progress_seq=62, checkpoint_count=2, iteration=160, iteration_source="script"),
    ]
    assert script_offset(records) == 100
    # this run's own count is no script numbering; ranks that disagree tell nothing
    assert script_offset([_rec(progress_seq=60, iteration=60, iteration_source="steps")]) is None
    other = _rec(rank=1, progress_seq=60, iteration=170, iteration_source="script")
    assert script_offset([records[0], other]) is None


def test_the_stop_is_said_in_both_numberings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ranks = {
        0: _State(_rec(progress_seq=90, iteration=190, iteration_source="script")),
        1: _State(_rec(rank=1, progress_seq=90, iteration=190, iteration_source="script")),
    }
    agreement = _agreement(tmp_path, ranks)
    with caplog.at_level("WARNING"):
        stop_at = agreement.request_stop("preempted", 1.0)
    assert agreement.script_step == stop_at + 100
    said = caplog.records[-1].getMessage()
    assert (
        f"all ranks stop after {stop_at} training step(s) of this run (script step "
        f"{stop_at + 100})" in said
    )
    block = agreement.status_fields()["stop_requested"]
    assert block.stop_at_step == stop_at and block.stop_at_script_step == stop_at + 100


def _end(rank: int, exit_info: dict[str, Any], **kw: Any) -> HeartbeatRecord:
    return _rec(rank=rank, event="process_end", exit=exit_info, **kw)


CLEAN = {"clean": True, "exit_code": 0, "error": None}


def test_every_rank_finished_before_the_stop_step() -> None:
    assert finished_before_stop([_end(0, CLEAN), _end(1, CLEAN)], 2)
    signalled = {"preempt": {"signal_received": True, "asks_stop": True}}
    assert finished_before_stop([_end(0, CLEAN, **signalled), _end(1, CLEAN, **signalled)])


@pytest.mark.parametrize(
    "ends",
    [
        [CLEAN, {**CLEAN, "stopped_at": 99}],  # one rank left at the request
        [CLEAN, {"clean": False, "exit_code": 1, "error": "boom"}],
        [CLEAN, {**CLEAN, "exit_code": 3}],
        [CLEAN, {"clean": True, "exit_code": None, "error": None, "vanished": True}],
    ],
)
def test_a_rank_that_did_not_finish_is_no_completed_training(ends: list[dict[str, Any]]) -> None:
    assert not finished_before_stop([_end(r, e) for r, e in enumerate(ends)], 2)


def test_a_rank_still_running_or_missing_is_no_completed_training() -> None:
    assert not finished_before_stop([_end(0, CLEAN), _rec(rank=1)], 2)
    assert not finished_before_stop([_end(0, CLEAN)], 2)
    assert not finished_before_stop([], None)


def test_a_signalled_rank_of_a_script_that_never_asks_is_no_completed_training() -> None:
    """It may have left at the signal with its own save: a requeue, not a completion."""
    signalled = {"preempt": {"signal_received": True}}
    assert not finished_before_stop([_end(0, CLEAN, **signalled)], 1)
