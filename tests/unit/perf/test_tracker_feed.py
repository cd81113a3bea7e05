"""How the perf reporter feeds its sinks: windows, the run directory's events and the
summary, through the sink thread (never the thread that steps)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rankguard.perf.config import PerfConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.perf.sinks import RunInfo, SinkSet, SinkThread
from rankguard.perf.trackers.events import RunEventTail
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.layout import CHECKPOINTS_FILE, FINDINGS_FILE, GOODPUT_FILE, RESTARTS_FILE
from rankguard.util.fs import append_jsonl, atomic_write_json
from tests.factories import FakeNsClock


class Recorder:
    name = "rec"

    def __init__(self, *, fail_open: bool = False, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[str] = set()
        self.fail_open = fail_open
        self.delay_s = delay_s

    def _note(self, call: str, arg: Any) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append((call, arg))

    def open(self, info: RunInfo) -> None:
        self._note("open", info.run_id)
        if self.fail_open:
            raise ConnectionError("tracker unreachable")
        time.sleep(self.delay_s)

    def window(self, entry: Mapping[str, Any]) -> None:
        self._note("window", entry["iteration"])

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        self._note("event", (kind, step))

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self._note("close", None if summary is None else sorted(summary))


def _finding(rank: int, iteration: int) -> dict[str, Any]:
    return {"finding_type": "rank_hung", "rank": rank, "iteration": iteration, "message": "m"}


# ---- the run directory's events ----------------------------------------------------


def test_event_tail_reads_only_what_is_new(tmp_path: Path) -> None:
    tail = RunEventTail(tmp_path)
    assert tail.poll() == []  # no files yet
    append_jsonl(tmp_path / FINDINGS_FILE, [_finding(1, 7)])
    with open(tmp_path / FINDINGS_FILE, "a") as fh:
        fh.write('{"finding_type": "rank_de')  # a line being written
    (ev,) = tail.poll(last_step=3)
    assert (ev.kind, ev.step, ev.fields["rank"]) == ("finding", 7, 1)
    assert tail.poll() == []
    with open(tmp_path / FINDINGS_FILE, "a") as fh:
        fh.write('ad", "rank": 0, "message": "gone"}\n')
    append_jsonl(
        tmp_path / RESTARTS_FILE,
        [
            {"kind": "process", "restart": 1, "cause": "x"},
            {"kind": "stop", "restart": None, "cause": "x"},  # a decision, no restart
        ],
    )
    got = tail.poll(last_step=9)
    assert [(e.kind, e.step) for e in got] == [("finding", None), ("restart", 9)]


def test_event_tail_one_event_per_newly_committed_checkpoint(tmp_path: Path) -> None:
    tail = RunEventTail(tmp_path)
    doc: dict[str, Any] = {
        "last_committed": {"persistent": 10, "local": None},
        "last": {"persistent": {"step": 10, "total_s": 1.25, "path": "/c/10"}},
    }
    atomic_write_json(tmp_path / CHECKPOINTS_FILE, doc)
    (ev,) = tail.poll()
    assert (ev.kind, ev.step) == ("checkpoint", 10)
    assert ev.fields == {"tier": "persistent", "step": 10, "total_s": 1.25, "path": "/c/10"}
    doc["updated"] = "later"  # rewritten, nothing newly committed
    atomic_write_json(tmp_path / CHECKPOINTS_FILE, doc)
    assert tail.poll() == []
    doc["last_committed"] = {"persistent": 20, "local": 15}
    (tmp_path / CHECKPOINTS_FILE).write_text(json.dumps(doc) + "  ")
    assert [(e.fields["tier"], e.step) for e in tail.poll()] == [("local", 15), ("persistent", 20)]
    (tmp_path / CHECKPOINTS_FILE).write_text("{not json")
    assert tail.poll() == [] and tail.unreadable == 1
    with pytest.raises(ValueError, match="max_bytes"):
        RunEventTail(tmp_path, max_bytes=10)


def test_event_tail_one_goodput_event_each_time_the_ledger_changes(tmp_path: Path) -> None:
    tail = RunEventTail(tmp_path)
    assert tail.poll(3) == []  # no ledger yet
    ledger = {
        "ettr": 0.8,
        "wall_s": 50.0,
        "parts_s": {"productive": 40.0, "startup": 10.0},
        "interruptions": [{"attempt": 0}],
        "final": False,
    }
    atomic_write_json(tmp_path / GOODPUT_FILE, ledger)
    (ev,) = tail.poll(3)
    assert (ev.kind, ev.step) == ("goodput", 3)
    assert ev.fields == {k: ledger[k] for k in ("final", "ettr", "wall_s", "parts_s")}
    assert tail.poll(4) == []  # unchanged
    (tmp_path / GOODPUT_FILE).write_text(json.dumps({**ledger, "ettr": 0.9}) + " ")
    assert [e.fields["ettr"] for e in tail.poll(5)] == [0.9]
    (tmp_path / GOODPUT_FILE).write_text("{torn")
    assert tail.poll(6) == [] and tail.unreadable == 1


def test_event_tail_reads_a_backlog_in_bounded_pieces(tmp_path: Path) -> None:
    rows = [_finding(r % 4, r) for r in range(400)]
    append_jsonl(tmp_path / FINDINGS_FILE, rows)
    tail = RunEventTail(tmp_path, max_bytes=4096)
    seen: list[int] = []
    for _ in range(100):
        got = tail.poll()
        assert len(got) < 100  # one poll reads at most max_bytes
        seen += [e.step for e in got if e.step is not None]
        if not got:
            break
    assert seen == list(range(400))


# ---- the sink thread ---------------------------------------------------------------


def test_sink_thread_calls_sinks_off_the_callers_thread_and_drops_when_full() -> None:
    rec = Recorder(delay_s=0.3)
    out = SinkThread(SinkSet([rec]), maxsize=3, close_timeout_s=10)
    t0 = time.monotonic()
    out.open(RunInfo(run_id="r", rank=0, world_size=1))
    for it in range(10):
        out.window({"iteration": it})
    assert time.monotonic() - t0 < 0.2  # never waits for the slow tracker
    assert out.close({"x": 1}) is True
    assert rec.threads == {"rankguard-trackers"}
    windows = [c for c in rec.calls if c[0] == "window"]
    assert out.dropped == 10 - len(windows) > 0
    assert rec.calls[-1] == ("close", ["x"])
    out.window({"iteration": 99})  # after close: ignored
    assert rec.calls[-1] == ("close", ["x"])


def test_sink_thread_close_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    out = SinkThread(SinkSet([Recorder(delay_s=2.0)]), close_timeout_s=0.2)
    out.open(RunInfo(run_id="r", rank=0, world_size=1))
    with caplog.at_level(logging.WARNING, logger="rankguard.perf.sinks"):
        assert out.close(None) is False
    assert any("did not finish within" in r.getMessage() for r in caplog.records)
    assert SinkThread(SinkSet()).close(None) is True  # never started: nothing to wait for


def test_a_sink_that_cannot_open_is_disabled_at_once(caplog: pytest.LogCaptureFixture) -> None:
    bad, good = Recorder(fail_open=True), Recorder()
    bad.name = "bad"
    sinks = SinkSet([bad, good])
    with caplog.at_level(logging.WARNING, logger="rankguard.perf.sinks"):
        sinks.open(RunInfo(run_id="r", rank=0, world_size=1))
        sinks.window({"iteration": 1})
    assert sinks.disabled == ["bad"] and sinks.errors == {"bad": 1}
    assert [c[0] for c in bad.calls] == ["open"]
    assert [c[0] for c in good.calls] == ["open", "window"]


# ---- the reporter ------------------------------------------------------------------


def _reporter(
    tmp_path: Path, rec: Recorder, *, rank: int = 0, run_dir: Path | None = None
) -> tuple[PerfReporter, ProgressTracker, FakeNsClock]:
    clock = FakeNsClock()
    tracker = ProgressTracker(clock=clock, mode="cpu")
    rep = PerfReporter(
        PerfConfig(log_interval=5, console=False),
        tracker,
        rank=rank,
        world_size=2,
        run_id="run-1",
        out_dir=tmp_path / "perf",
        sinks=[rec],
        run_dir=run_dir,
    )
    return rep, tracker, clock


def test_reporter_feeds_windows_events_and_summary_to_its_sinks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = Recorder()
    rep, tracker, clock = _reporter(tmp_path, rec, run_dir=run_dir)
    assert rep.poll() == [] and rec.calls == []  # nothing yet: not even opened
    for it in range(1, 11):
        clock.advance_ms(10)
        tracker.step_end(it)
        if it == 6:
            append_jsonl(run_dir / FINDINGS_FILE, [_finding(1, 6)])
        rep.poll()
    assert rep.close() is not None
    kinds = [c for c in rec.calls if c[0] != "window"]
    assert kinds[0] == ("open", "run-1")
    assert ("event", ("finding", 6)) in kinds
    assert [c[1] for c in rec.calls if c[0] == "window"] == [1, 5, 10]
    assert rec.calls[-1] == ("close", ["final_statistics", "iteration_logs", "session_info"])
    assert rec.threads == {"rankguard-trackers"}  # not the stepping thread
    assert not rep.sinks.errors


def test_other_ranks_forward_no_run_events(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    append_jsonl(run_dir / FINDINGS_FILE, [_finding(1, 1)])
    rec = Recorder()
    rep, tracker, clock = _reporter(tmp_path, rec, rank=1, run_dir=run_dir)
    clock.advance_ms(10)
    tracker.step_end(1)
    rep.poll()
    rep.close()
    assert [c[0] for c in rec.calls] == ["open", "window", "close"]
