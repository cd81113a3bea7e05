"""HeartbeatPublisher: record stream of one rank (start, heartbeats, end), prompt wake-ups."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.rank.identity import GpuAssignment
from rankguard.rank.publisher import HeartbeatPublisher
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import Event
from tests.factories import rank_identity
from tests.factories import read_records as _records

RECORD_KEYS = {
    "schema_version",
    "event",
    "run_id",
    "seq",
    "wall_time_ns",
    "monotonic_ns",
    "hostname",
    "node_rank",
    "rank",
    "local_rank",
    "world_size",
    "pid",
    "gpu",
    "progress_seq",
    "iteration",
    "phase",
    "checkpoint_active",
    "checkpoint_id",
    "last_progress_monotonic_ns",
    "since_progress_s",
    "progress_source",
}


_identity = partial(
    rank_identity,
    run_id="run-pub",
    rank=3,
    local_rank=1,
    world_size=4,
    node_rank=1,
    hostname="node-b",
)


def _wait_for(cond: Callable[[], bool], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@dataclass(frozen=True)
class _Block:
    outcome: str
    name = "verdict"
    flat = False

    def to_dict(self) -> dict[str, str]:
        return {"outcome": self.outcome}


@pytest.fixture
def publishers() -> Iterator[list[HeartbeatPublisher]]:
    created: list[HeartbeatPublisher] = []
    yield created
    for pub in created:
        pub.close()


def _start(
    tmp_path: Path,
    publishers: list[HeartbeatPublisher],
    interval_s: float,
    gpu: GpuAssignment | None = None,
) -> tuple[HeartbeatPublisher, ProgressTracker]:
    tracker = ProgressTracker(mode="cpu")
    pub = HeartbeatPublisher(_identity(gpu=gpu), tmp_path, tracker, interval_s)
    publishers.append(pub)
    pub.start()
    return pub, tracker


def test_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        HeartbeatPublisher(_identity(), tmp_path, ProgressTracker(mode="cpu"), 0)


def test_stream_start_heartbeats_end(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    pub, tracker = _start(tmp_path, publishers, 0.05)
    assert pub.path == tmp_path / heartbeat_file_name(3, os.getpid())
    tracker.set_phase("train")
    tracker.step_end(41)
    assert _wait_for(lambda: len(_records(pub.path)) >= 5)
    pub.close(clean=True, exit_code=0)
    records = _records(pub.path)
    events = [r["event"] for r in records]
    assert events[0] == "process_start"
    assert events[-1] == "process_end"
    assert set(events[1:-1]) == {"heartbeat"}
    assert len(events) >= 5
    assert [r["seq"] for r in records] == list(range(len(records)))
    for r in records:
        missing = RECORD_KEYS - set(r)
        assert not missing, missing
        assert r["schema_version"] == 1
        assert r["run_id"] == "run-pub"
        assert (r["rank"], r["local_rank"], r["world_size"], r["node_rank"]) == (3, 1, 4, 1)
        assert r["hostname"] == "node-b" and r["pid"] == os.getpid()
        assert r["gpu"] is None
        assert ("exit" in r) == (r["event"] == "process_end")
    end = records[-1]
    assert end["exit"] == {"clean": True, "exit_code": 0, "error": None}
    assert end["progress_seq"] == 1 and end["iteration"] == 41
    assert end["phase"] == "train"
    mono = [r["monotonic_ns"] for r in records]
    assert mono == sorted(mono)
    assert pub.records_written == len(records)


def test_heartbeats_follow_the_interval(
    tmp_path: Path, publishers: list[HeartbeatPublisher]
) -> None:
    pub, _ = _start(tmp_path, publishers, 0.05)
    time.sleep(0.5)
    pub.close()
    beats = [r for r in _records(pub.path) if r["event"] == "heartbeat"]
    # ~10 expected in 0.5 s; generous bounds for a loaded machine
    assert 3 <= len(beats) <= 12
    gaps = [(b["monotonic_ns"] - a["monotonic_ns"]) / 1e9 for a, b in itertools.pairwise(beats)]
    assert min(gaps) >= 0.04


def test_gpu_identity_is_written(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    gpu = GpuAssignment(ordinal=1, token="GPU-0b1c2d3e")
    pub, _ = _start(tmp_path, publishers, 10.0, gpu)
    pub.close()
    for r in _records(pub.path):
        assert r["gpu"] == {"ordinal": 1, "token": "GPU-0b1c2d3e", "uuid": "GPU-0b1c2d3e"}


def test_error_exit_info(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    pub, _ = _start(tmp_path, publishers, 10.0)
    pub.close(clean=False, exit_code=3, error="ValueError: bad batch")
    end = _records(pub.path)[-1]
    assert end["event"] == "process_end"
    assert end["exit"] == {"clean": False, "exit_code": 3, "error": "ValueError: bad batch"}


def test_close_is_idempotent(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    pub, _ = _start(tmp_path, publishers, 10.0)
    t0 = time.monotonic()
    pub.close()
    assert time.monotonic() - t0 < 2.0  # the thread wakes up, it does not sleep 10 s
    pub.close(clean=False, exit_code=1)
    records = _records(pub.path)
    assert [r["event"] for r in records] == ["process_start", "process_end"]
    assert records[-1]["exit"]["clean"] is True
    assert not pub._thread or not pub._thread.is_alive()


def test_close_without_start_writes_nothing(tmp_path: Path) -> None:
    pub = HeartbeatPublisher(_identity(), tmp_path, ProgressTracker(mode="cpu"), 1.0)
    pub.close()
    assert not pub.path.exists()
    assert pub.records_written == 0


def test_wake_publishes_promptly(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    pub, _ = _start(tmp_path, publishers, 30.0)
    assert [r["event"] for r in _records(pub.path)] == ["process_start"]
    pub.wake()
    assert _wait_for(lambda: len(_records(pub.path)) >= 2, timeout=1.0)
    assert _records(pub.path)[1]["event"] == "heartbeat"


def test_publish_writes_the_record_before_it_returns(
    tmp_path: Path, publishers: list[HeartbeatPublisher]
) -> None:
    """``publish()`` returns once the thread has written a record built after the call (a
    verdict on disk before the rank may be killed), long before the interval; the
    sources run on the thread only. Nothing after close."""
    pub, tracker = _start(tmp_path, publishers, 30.0)
    verdict: list[str] = []
    threads: set[str] = set()

    def source() -> _Block | None:
        threads.add(threading.current_thread().name)
        return _Block(verdict[-1]) if verdict else None

    pub.add_block(source)
    tracker.step_end(7)
    verdict.append("reproducible")
    assert pub.publish() is True  # on disk when it returns (the interval is 30 s)
    records = _records(pub.path)
    assert [r["event"] for r in records] == ["process_start", "heartbeat"]
    assert records[1]["verdict"] == {"outcome": "reproducible"}
    assert records[1]["iteration"] == 7 and records[1]["seq"] == 1
    assert threads == {"rankguard-heartbeat"}
    pub.close()
    assert pub.publish() is False
    assert [r["event"] for r in _records(pub.path)][-1] == "process_end"


def test_publish_gives_up_when_the_thread_is_stuck(
    tmp_path: Path, publishers: list[HeartbeatPublisher]
) -> None:
    """A heartbeat thread stuck in a source does not take the caller (a rank on its way
    out) with it: ``publish()`` says False after its timeout."""
    pub, _ = _start(tmp_path, publishers, 30.0)
    stuck, release = threading.Event(), threading.Event()

    def source() -> None:
        stuck.set()
        release.wait(10)

    pub.add_block(source)
    pub.wake()
    assert stuck.wait(5)
    t0 = time.monotonic()
    assert pub.publish(timeout_s=0.3) is False
    assert 0.3 <= time.monotonic() - t0 < 3
    release.set()


def test_phase_change_publishes_promptly(
    tmp_path: Path, publishers: list[HeartbeatPublisher]
) -> None:
    pub, tracker = _start(tmp_path, publishers, 30.0)
    tracker.checkpoint_start("step_10")
    assert _wait_for(
        lambda: any(r.get("checkpoint_active") for r in _records(pub.path)), timeout=1.0
    )
    rec = next(r for r in _records(pub.path) if r.get("checkpoint_active"))
    assert rec["phase"] == "checkpointing"
    assert rec["checkpoint_id"] == "step_10"
    tracker.checkpoint_end()
    assert _wait_for(
        lambda: (
            _records(pub.path)[-1].get("checkpoint_active") is False
            and _records(pub.path)[-1]["progress_seq"] == 1
        ),
        timeout=1.0,
    )


def test_steps_do_not_wake_the_publisher(
    tmp_path: Path, publishers: list[HeartbeatPublisher]
) -> None:
    pub, tracker = _start(tmp_path, publishers, 30.0)
    for i in range(100):
        tracker.step_end(i)
    time.sleep(0.2)
    assert len(_records(pub.path)) == 1


def test_appends_to_existing_file(tmp_path: Path, publishers: list[HeartbeatPublisher]) -> None:
    path = tmp_path / heartbeat_file_name(3, os.getpid())
    path.write_text('{"old": true}\n')
    pub, _ = _start(tmp_path, publishers, 10.0)
    pub.close()
    records = _records(path)
    assert records[0] == {"old": True}
    assert [r["event"] for r in records[1:]] == ["process_start", "process_end"]


# ---- rotation (heartbeat.max_file_mb) -----------------------------------------------------


def test_rotate_jsonl_keeps_one_older_file_and_starts_with_the_given_line(tmp_path: Path) -> None:
    from rankguard.util.fs import rotate_jsonl

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":2}\n')
    (tmp_path / "r.jsonl.1").write_bytes(b'{"old":1}\n')
    inode = path.stat().st_ino
    rotate_jsonl(path, b'{"start":1}\n')
    assert (tmp_path / "r.jsonl.1").read_bytes() == b'{"a":1}\n{"a":2}\n'  # the full file
    assert (tmp_path / "r.jsonl.1").stat().st_ino == inode  # moved, not copied
    assert path.read_bytes() == b'{"start":1}\n'
    assert path.stat().st_ino != inode  # a reader following the inode starts anew
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r.jsonl.1"]  # no tmp


def test_publisher_rotates_before_the_file_passes_the_limit(tmp_path: Path) -> None:
    from rankguard.util.tailer import JsonlTailer

    tracker = ProgressTracker(mode="cpu")
    pub = HeartbeatPublisher(_identity(), tmp_path, tracker, 3600.0, max_file_bytes=4000)
    pub.start()
    tailer = JsonlTailer(pub.path)
    seen = [r["seq"] for r in tailer.read()]
    for i in range(60):
        tracker.step_end(i)
        pub._write(Event.HEARTBEAT)  # what the thread does each interval
        assert pub.path.stat().st_size <= 4000
        seen += [r["seq"] for r in tailer.read()]
    pub.close()
    seen += [r["seq"] for r in tailer.read()]
    assert pub.rotations >= 3
    older = pub.path.with_name(pub.path.name + ".1")
    assert older.stat().st_size <= 4000
    current = _records(pub.path)
    # every file starts with the process_start record, then continues the sequence
    assert current[0]["event"] == "process_start" and current[0]["seq"] == 0
    assert _records(older)[0] == current[0]
    assert current[-1]["event"] == "process_end" and current[-1]["seq"] == 61
    tail = [r["seq"] for r in _records(older)[1:]] + [r["seq"] for r in current[1:]]
    assert tail == list(range(tail[0], 62))  # nothing lost across the last rotation
    # a tailer that reads after each write sees every record, plus the start copies
    assert [s for s in seen if s] == list(range(1, 62))


def test_publisher_without_a_limit_never_rotates(tmp_path: Path) -> None:
    tracker = ProgressTracker(mode="cpu")
    pub = HeartbeatPublisher(_identity(), tmp_path, tracker, 3600.0)
    pub.start()
    for _ in range(50):
        pub._write(Event.HEARTBEAT)
    pub.close()
    assert pub.rotations == 0 and len(_records(pub.path)) == 52
    assert not pub.path.with_name(pub.path.name + ".1").exists()


def test_publisher_rotation_failure_keeps_appending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rankguard.rank.publisher as pub_mod

    def fail(path: Any, first: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pub_mod, "rotate_jsonl", fail)
    tracker = ProgressTracker(mode="cpu")
    pub = HeartbeatPublisher(_identity(), tmp_path, tracker, 3600.0, max_file_bytes=2000)
    pub.start()
    for _ in range(20):
        pub._write(Event.HEARTBEAT)
    pub.close()
    assert len(_records(pub.path)) == 22 and pub.write_errors == 0  # no heartbeat lost
    assert pub.max_file_bytes == 0  # rotation turned off after the failure


def test_replaced_files_keep_their_mode_and_new_ones_are_world_readable(tmp_path: Path) -> None:
    from rankguard.util.fs import atomic_write_json, rotate_jsonl

    status = tmp_path / "status.json"
    atomic_write_json(status, {"a": 1})
    assert status.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    status.chmod(0o640)
    atomic_write_json(status, {"a": 2})
    assert status.stat().st_mode & 0o777 == 0o640
    log = tmp_path / "r.jsonl"
    log.write_bytes(b"{}\n")
    log.chmod(0o604)
    rotate_jsonl(log, b"{}\n")
    assert log.stat().st_mode & 0o777 == 0o604
