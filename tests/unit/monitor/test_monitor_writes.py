"""JobMonitor when its writes fail (a full disk): findings are acted on anyway, kept in
order and written at a later scan; status.json failures are counted; each node's disk
state reaches the rules and the status."""

from __future__ import annotations

import errno
import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import rankguard.monitor.ingest as ingest_mod
import rankguard.monitor.monitor as monitor_mod
import rankguard.util.fs as fs
from rankguard.monitor.api import RemoteSource
from rankguard.monitor.monitor import FindingSink, JobMonitor
from rankguard.schema.findings import Finding
from rankguard.schema.layout import FINDINGS_FILE, PERF_RANKS_FILE, STATUS_FILE
from rankguard.util.disk import DiskState
from tests.factories import FakeClock, heartbeat_config, publisher_record, read_jsonl, read_status
from tests.factories import write_heartbeats as write

RUN = "run-writes"

rec = partial(publisher_record, run_id=RUN)


class Acted(FindingSink):
    def __init__(self) -> None:
        self.types: list[tuple[int, str]] = []

    def after_write(self, finding: Finding) -> None:
        self.types.append((finding.rank, finding.finding_type.value))


class FullDisk:
    """``append_bytes`` that fails with ENOSPC for the files named in ``names``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.names = set(names)
        self.real = fs.append_bytes
        self.calls = 0
        monkeypatch.setattr(fs, "append_bytes", self)

    def __call__(self, path: Any, data: bytes, *, fsync: bool = True) -> None:
        if Path(path).name in self.names:
            self.calls += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(path, data, fsync=fsync)


def _monitor(run_dir: Path, clock: FakeClock, world: int = 2, **kw: Any) -> JobMonitor:
    kw.setdefault("check_pids", False)
    return JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        RUN,
        expected_world_size=world,
        clock=clock,
        **kw,
    )


def _silence_rank(mon: JobMonitor, run_dir: Path, clock: FakeClock, rank: int, seqs: range) -> None:
    """Rank ``1 - rank`` keeps publishing; ``rank`` publishes nothing."""
    other = 1 - rank
    for seq in seqs:
        clock.t += 1
        write(run_dir, rec(other, seq, progress_seq=seq))
        mon.scan_once()


def test_a_finding_that_cannot_be_written_is_acted_on_kept_and_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    acted = Acted()
    mon.add_sink(acted)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    full = FullDisk(monkeypatch, FINDINGS_FILE)
    _silence_rank(mon, tmp_path, clock, 1, range(1, 13))

    assert acted.types == [(1, "rank_process_heartbeat_timeout")]  # acted on at once
    assert full.calls >= 2  # retried at the following scans
    assert read_jsonl(tmp_path / FINDINGS_FILE) == []
    status = read_status(tmp_path)
    assert status["monitor"]["unwritten_findings"] == 1
    assert status["monitor"]["write_errors"] == full.calls
    assert "No space left on device" in status["monitor"]["last_write_error"]
    assert status["monitor"]["last_write_error"].startswith(FINDINGS_FILE)
    assert status["recent_findings"][0]["finding_type"] == "rank_process_heartbeat_timeout"
    assert mon.scan_errors == 0 and mon.sink_errors == 0

    # Rank 0 goes silent too while the disk is still full: queued after the first one.
    for _ in range(12):
        clock.t += 1
        mon.scan_once()
    assert acted.types == [
        (1, "rank_process_heartbeat_timeout"),
        (0, "rank_process_heartbeat_timeout"),
    ]
    assert read_status(tmp_path)["monitor"]["unwritten_findings"] == 2

    monkeypatch.setattr(fs, "append_bytes", full.real)  # space again
    clock.t += 1
    mon.scan_once()
    written = read_jsonl(tmp_path / FINDINGS_FILE)
    assert [(f["rank"], f["finding_type"]) for f in written] == acted.types  # in order
    assert read_status(tmp_path)["monitor"]["unwritten_findings"] == 0
    assert len(acted.types) == 2  # nothing acted on twice


def test_unwritten_findings_are_bounded_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    monkeypatch.setattr(mon._findings_out, "max_pending", 1)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    FullDisk(monkeypatch, FINDINGS_FILE)
    for _ in range(12):
        clock.t += 1
        mon.scan_once()  # both ranks silent: two findings, room for one
    monitor = read_status(tmp_path)["monitor"]
    assert monitor["unwritten_findings"] == 1
    assert monitor["dropped_lines"] == 1


def test_status_write_failure_is_counted_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0))
    real = monitor_mod.atomic_write_json

    def no_space(path: Any, obj: Any, **kw: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(monitor_mod, "atomic_write_json", no_space)
    mon.scan_once()
    mon.scan_once()
    assert not (tmp_path / STATUS_FILE).exists()
    assert mon.scan_errors == 0
    assert mon.status_write_errors == 2
    monkeypatch.setattr(monitor_mod, "atomic_write_json", real)
    mon.scan_once()
    monitor = read_status(tmp_path)["monitor"]
    assert monitor["status_write_errors"] == 2
    assert monitor["last_write_error"].startswith(STATUS_FILE)
    assert monitor["scan_count"] == 3


def test_perf_lines_that_cannot_be_written_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    full = FullDisk(monkeypatch, PERF_RANKS_FILE)
    for seq in range(1, 4):
        clock.t += 1
        for rank in (0, 1):
            ms = 100.0 + rank
            perf = {"step": seq, "step_time_ms": ms, "windows": [[seq, seq, ms]]}
            write(tmp_path, rec(rank, seq, progress_seq=seq, perf=perf))
        mon.scan_once()
    unwritten = read_status(tmp_path)["monitor"]["unwritten_perf_lines"]
    assert unwritten > 0 and full.calls > 0
    monkeypatch.setattr(fs, "append_bytes", full.real)
    clock.t += 1
    mon.scan_once()
    lines = read_jsonl(tmp_path / PERF_RANKS_FILE)
    assert len(lines) >= unwritten
    assert [line["step"] for line in lines] == sorted(line["step"] for line in lines)
    assert read_status(tmp_path)["monitor"]["unwritten_perf_lines"] == 0


# ---- disk states ------------------------------------------------------------------------


def test_local_disk_state_is_in_the_status(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    mon.scan_once()
    disk = read_status(tmp_path)["disks"]["0"]
    assert disk["full"] is False and disk["free_bytes"] > 0 and disk["total_bytes"] > 0


def test_a_full_local_disk_gives_node_disk_full_not_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    acted = Acted()
    mon.add_sink(acted)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    full = DiskState(full=True, free_bytes=0, total_bytes=1 << 20)
    monkeypatch.setattr(ingest_mod, "disk_state", lambda path: full)
    _silence_rank(mon, tmp_path, clock, 1, range(1, 13))
    assert acted.types == [(1, "node_disk_full")]
    status = read_status(tmp_path)
    assert status["disks"]["0"]["full"] is True
    assert status["ranks"][1]["active_findings"] == ["node_disk_full"]
    finding = read_jsonl(tmp_path / FINDINGS_FILE)[0]
    assert finding["reason"] == "heartbeats_unwritable_on_a_full_disk"
    assert finding["disk"] == full.to_dict()

    # Space again, heartbeats resume: the episode ends without another finding.
    monkeypatch.setattr(ingest_mod, "disk_state", lambda path: DiskState(full=False))
    clock.t += 1
    write(tmp_path, rec(1, 13, progress_seq=13))
    mon.scan_once()
    status = read_status(tmp_path)
    assert status["ranks"][1]["process_liveness"] == "alive"
    assert status["ranks"][1]["active_findings"] == []
    assert acted.types == [(1, "node_disk_full")]


class DiskRemote(RemoteSource):
    """Another node's relayed records and its disk state."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.disk: dict[int, DiskState] = {}

    def fetch(self) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        return list(self.records), {}

    def nodes_done(self) -> bool:
        return True

    def disks(self) -> dict[int, DiskState]:
        return dict(self.disk)


def test_a_full_disk_on_another_node_is_told_apart(tmp_path: Path) -> None:
    """Node 1's disk is full: its rank gets node_disk_full; node 0's silent rank (its
    disk has space) gets the heartbeat timeout."""
    clock = FakeClock()
    remote = DiskRemote()
    mon = _monitor(tmp_path, clock, world=3, remote=remote)
    acted = Acted()
    mon.add_sink(acted)
    remote.records = [rec(2, 0, node_rank=1, hostname="node-b", world_size=3)]
    remote.disk = {1: DiskState(full=True, free_bytes=0, total_bytes=1 << 30)}
    write(tmp_path, rec(0, 0, world_size=3), rec(1, 0, world_size=3))
    mon.scan_once()
    for seq in range(1, 13):
        clock.t += 1
        write(tmp_path, rec(0, seq, progress_seq=seq, world_size=3))
        mon.scan_once()
    assert sorted(acted.types) == [(1, "rank_process_heartbeat_timeout"), (2, "node_disk_full")]
    disks = read_status(tmp_path)["disks"]
    assert disks["0"]["full"] is False and disks["1"]["full"] is True
    assert json.dumps(disks)  # plain JSON


def test_the_final_status_says_a_disk_freed_after_the_last_scan_is_not_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks end while the disk is full: the drain's scan measures it full and its
    status cannot be written; space comes back before the launcher's last status, which
    then says the disk is not full (a user reads it), not the scan's measure."""
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    clock.t += 1
    write(
        tmp_path,
        rec(0, 1, event="process_end", exit={"clean": True, "exit_code": 0, "error": None}),
        rec(1, 1, event="process_end", exit={"clean": True, "exit_code": 0, "error": None}),
    )
    disk = {"full": True}
    monkeypatch.setattr(ingest_mod, "disk_state", lambda path: DiskState(full=disk["full"]))
    real = monitor_mod.atomic_write_json

    def write_status(path: Any, obj: Any, **kw: Any) -> None:
        if disk["full"]:
            disk["full"] = False  # freed right after this write failed
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, obj, **kw)

    monkeypatch.setattr(monitor_mod, "atomic_write_json", write_status)
    mon.note_end(None)
    status = mon.stop(drain_timeout_s=0.0, write_wait_s=0.0)
    assert status["state"] == "completed"
    assert mon.status_write_errors == 1
    assert read_status(tmp_path)["disks"]["0"]["full"] is False
