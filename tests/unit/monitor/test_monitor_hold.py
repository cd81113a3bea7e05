"""The monitor itself held up (its process not scheduled, the host stalled, another thread
keeping the interpreter): the time it did not watch is nobody's silence. Ranks on its
host were most likely held too and have not written their next record when the monitor
wakes; they are not named unresponsive for it, and a rank that stays silent is still
named, its silence counted without the hold."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.findings import Finding
from tests.factories import heartbeat_config, publisher_record, read_jsonl, read_status, types_of
from tests.factories import heartbeat_record as rec
from tests.factories import heartbeat_rules as _rules
from tests.factories import write_heartbeats as write

PROCESS_TIMEOUT = "rank_process_heartbeat_timeout"

# ---- the rules (an explicit clock: process timeout 10 s) ------------------------------


def test_the_monitors_hold_is_not_counted_as_the_ranks_silence() -> None:
    rules = _rules(world=2)
    rules.ingest(rec(0, 0, progress_seq=1), 0.0)  # seen before the hold
    rules.ingest(rec(1, 0, progress_seq=1), 5.0)  # seen during it (read by another path)
    rules.observer_held(2.0, 9.0)
    assert rules.ranks[0].seen_at == 7.0  # 2 s watched before the hold
    assert rules.ranks[1].seen_at == 9.0  # nothing watched since it was seen
    assert rules.evaluate(10.5) == []  # 10.5 s after rank 0's record, 3.5 s watched
    found = rules.evaluate(17.2)
    assert types_of(found) == [(0, PROCESS_TIMEOUT)]
    assert found[0].observed_s == pytest.approx(10.2)  # the watched silence only
    assert types_of(rules.evaluate(19.5)) == [(1, PROCESS_TIMEOUT)]


def test_a_hold_before_a_record_or_after_an_end_changes_nothing() -> None:
    rules = _rules(world=2)
    rules.ingest(rec(0, 0, progress_seq=1), 0.0)
    rules.ingest(rec(1, 0, progress_seq=1), 0.0)
    rules.ingest(rec(1, 1, event="process_end", progress_seq=1, exit={"clean": True}), 1.0)
    rules.ingest(rec(0, 1, progress_seq=2), 4.0)
    rules.observer_held(2.0, 3.0)  # over before rank 0's latest record; rank 1 ended
    assert rules.ranks[0].seen_at == 4.0
    assert rules.ranks[1].seen_at == 1.0
    assert types_of(rules.evaluate(14.5)) == [(0, PROCESS_TIMEOUT)]


# ---- the monitor's own thread ---------------------------------------------------------

RUN = "run-held"
prec = partial(publisher_record, run_id=RUN, world_size=1)


class HeldStop(threading.Event):
    """The monitor's stop event, whose next wait returns ``hold_s`` late once armed:
    the scanning thread not scheduled for that long."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_s = 0.0
        self.resumed = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        hold, self.hold_s = self.hold_s, 0.0
        stopped = super().wait(timeout)
        if hold and not stopped:
            time.sleep(hold)
            self.resumed.set()
        return stopped or self.is_set()


def _wait(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


class HeldScan(JobMonitor):
    """A monitor whose next scan, once armed, is held ``hold_s`` after it read and judged
    (the thread not scheduled, or a write blocked, inside the scan)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hold_s = 0.0
        self.resumed = threading.Event()

    def scan_once(self) -> list[Finding]:
        hold, self.hold_s = self.hold_s, 0.0
        found = super().scan_once()
        if hold:
            time.sleep(hold)
            self.resumed.set()
        return found


@pytest.mark.parametrize("where", ["wait", "scan"])
def test_a_held_monitor_names_no_rank_for_its_hold_and_still_names_a_silent_one(
    tmp_path: Path, where: str
) -> None:
    """Heartbeats every 0.1 s, process timeout 1 s; the monitor held 1.5 s (woken late
    from its wait, or inside a scan) while the rank wrote nothing (held too): no finding;
    the rank writes again 0.15 s after the monitor woke. Then it falls silent: named
    after 1 s of watched silence."""
    cfg = heartbeat_config(publish_interval_s=0.1, scan_interval_s=0.05, process_timeout_s=1.0)
    mon = HeldScan(cfg, tmp_path, RUN, expected_world_size=1, check_pids=False)
    stop = mon._stop = HeldStop()
    held: HeldScan | HeldStop = stop if where == "wait" else mon
    seq = 0

    def beat() -> None:
        nonlocal seq
        write(tmp_path, prec(0, seq, progress_seq=seq + 1))
        seq += 1

    def findings() -> list[dict[str, object]]:
        path = tmp_path / "findings.jsonl"
        return read_jsonl(path) if path.exists() else []

    beat()
    started = time.monotonic()
    mon.start()
    try:
        for _ in range(5):
            time.sleep(0.1)
            beat()
        held.hold_s = 1.5  # the host stalls: the rank writes nothing either
        _wait(held.resumed.is_set)
        time.sleep(0.15)  # the rank's publisher runs again (within its interval)
        for _ in range(5):
            beat()
            time.sleep(0.1)
        assert findings() == []
        silent_at = time.monotonic()
        _wait(findings, timeout=5.0)
        named_after = time.monotonic() - silent_at
    finally:
        mon.stop()
    (finding,) = findings()
    assert finding["finding_type"] == PROCESS_TIMEOUT and finding["rank"] == 0
    assert 1.0 < finding["observed_s"] < 1.0 + 0.5
    assert named_after >= 0.9  # the silence after the hold counts in full
    monitor = read_status(tmp_path)["monitor"]
    # the injected hold is counted; a loaded machine may hold the monitor's thread more
    # (4 test workers on 2 cores: holds of 0.2-0.5 s seen), and those are holds too
    assert monitor["holds"] >= 1
    assert 1.5 - 0.3 <= monitor["held_s"] <= time.monotonic() - started
