"""JobMonitor: files in, status.json and findings.jsonl out, with a fake clock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.monitor.api import RemoteSource
from rankguard.monitor.monitor import FindingSink, JobMonitor
from rankguard.schema.findings import Finding
from rankguard.schema.layout import FINDINGS_FILE, heartbeat_file_name
from rankguard.schema.records import HeartbeatRecord
from tests.factories import BASE_NS, FakeClock, heartbeat_config, publisher_record, read_status
from tests.factories import write_heartbeats as write

RUN = "run-mon"

LIVENESS = {"not_observed", "alive", "stale", "exited"}
PROGRESS = {"not_observed", "starting", "progressing", "stalled", "unknown", "completed"}
ROW_KEYS = {
    "rank",
    "pid",
    "hostname",
    "node_rank",
    "local_rank",
    "process_liveness",
    "gpu_progress",
    "iteration",
    "progress_seq",
    "phase",
    "checkpoint_active",
    "heartbeat_age_s",
    "progress_age_s",
    "gpu",
    "gpu_health",
    "exit",
    "active_findings",
}
FINDING_KEYS = {
    "schema_version",
    "run_id",
    "finding_type",
    "reason",
    "rank",
    "pid",
    "hostname",
    "node_rank",
    "local_rank",
    "process_liveness",
    "gpu_progress",
    "phase",
    "iteration",
    "checkpoint_active",
    "timeout_s",
    "observed_s",
    "gpu",
    "gpu_health",
    "detected_wall_time",
    "message",
}


rec = partial(publisher_record, run_id=RUN)


def read_findings(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / FINDINGS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _monitor(run_dir: Path, clock: FakeClock, world: int | None = 2, **kw: Any) -> JobMonitor:
    kw.setdefault("check_pids", False)
    return JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        RUN,
        expected_world_size=world,
        clock=clock,
        **kw,
    )


def test_status_and_no_findings_for_healthy_ranks(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, config_snapshot={"x": 1})
    write(tmp_path, rec(0, 0, event="process_start", progress_seq=0))
    write(tmp_path, rec(1, 0, event="process_start", progress_seq=0))
    assert mon.scan_once() == []
    status = read_status(tmp_path)
    assert status["state"] == "running"
    assert [r["gpu_progress"] for r in status["ranks"]] == ["starting", "starting"]
    for seq in range(1, 6):
        clock.t += 1
        write(tmp_path, rec(0, seq, progress_seq=seq), rec(1, seq, progress_seq=seq))
        assert mon.scan_once() == []
    status = read_status(tmp_path)
    assert status == mon.status
    assert status["schema_version"] == 1
    assert status["run_id"] == RUN
    assert status["state"] == "running"
    assert set(status) >= {
        "updated_wall_time",
        "monitor",
        "summary",
        "ranks",
        "gpu_health",
        "recent_findings",
    }
    assert status["monitor"]["scan_count"] == 6
    assert status["monitor"]["expected_world_size"] == 2
    assert status["monitor"]["hostname"] == socket.gethostname()
    assert status["monitor"]["config"] == {"x": 1}
    summary = status["summary"]
    assert summary["ranks_expected"] == 2 and summary["ranks_observed"] == 2
    assert summary["process_liveness"] == {"alive": 2}
    assert summary["gpu_progress"] == {"progressing": 2}
    assert summary["findings_total"] == 0 and summary["findings_active"] == 0
    for i, row in enumerate(status["ranks"]):
        assert set(row) >= ROW_KEYS
        assert row["rank"] == i and row["pid"] == 4000 + i
        assert row["process_liveness"] == "alive"
        assert row["gpu_progress"] == "progressing"
        assert row["progress_seq"] == 5 and row["iteration"] == 5
        assert row["heartbeat_age_s"] == 0.0
        assert row["progress_age_s"] == pytest.approx(0.2)
        assert row["active_findings"] == []
    assert status["recent_findings"] == []
    assert not (tmp_path / FINDINGS_FILE).exists()
    assert list(tmp_path.glob("*.tmp")) == [] and list(tmp_path.glob(".*.tmp")) == []


def test_starting_state_before_any_rank(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, FakeClock())
    mon.scan_once()
    status = read_status(tmp_path)
    assert status["state"] == "starting"
    assert [r["process_liveness"] for r in status["ranks"]] == ["not_observed"] * 2
    assert [r["gpu_progress"] for r in status["ranks"]] == ["not_observed"] * 2


def test_findings_written_and_status_degraded(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    seen: list[dict[str, Any]] = []

    class Collect(FindingSink):
        def after_write(self, finding: Finding) -> None:
            seen.append(finding.to_dict())

    class Broken(FindingSink):
        def after_write(self, finding: Finding) -> None:
            raise ZeroDivisionError

    mon.add_sink(Collect())
    mon.add_sink(Broken())  # a broken sink must not break the scan
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    # rank 0 keeps publishing, rank 1 goes silent
    for seq in range(1, 13):
        clock.t += 1
        write(tmp_path, rec(0, seq, progress_seq=seq))
        mon.scan_once()
    findings = read_findings(tmp_path)
    assert len(findings) == 1
    f = findings[0]
    assert set(f) >= FINDING_KEYS
    assert f["finding_type"] == "rank_process_heartbeat_timeout"
    assert f["reason"] == "rank_process_or_heartbeat_thread_unresponsive"
    assert f["rank"] == 1 and f["pid"] == 4001
    assert f["hostname"] == "node-a"
    assert f["detected_wall_time"].endswith("+00:00")
    assert seen == findings
    assert mon.sink_errors == 1
    status = read_status(tmp_path)
    assert status["state"] == "degraded"
    assert status["summary"]["findings_total"] == 1
    assert status["summary"]["findings_active"] == 1
    assert status["summary"]["process_liveness"] == {"alive": 1, "stale": 1}
    row = status["ranks"][1]
    assert row["process_liveness"] == "stale"
    assert row["gpu_progress"] == "unknown"
    assert row["active_findings"] == ["rank_process_heartbeat_timeout"]
    assert status["recent_findings"] == findings
    assert mon.scan_errors == 0
    assert list(tmp_path.glob(".*.tmp")) == []


def test_progress_stall_finding(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1)
    for seq in range(0, 25):
        write(tmp_path, rec(0, seq, progress_seq=3, since=float(seq), world_size=1))
        mon.scan_once()
        clock.t += 1
    findings = read_findings(tmp_path)
    assert [(f["finding_type"], f["reason"]) for f in findings] == [
        ("gpu_progress_timeout", "rank_alive_but_gpu_progress_not_advancing")
    ]
    assert findings[0]["process_liveness"] == "alive"
    assert findings[0]["gpu_progress"] == "stalled"


def test_partial_and_malformed_lines_in_files(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1)
    write(tmp_path, rec(0, 0, world_size=1), raw_tail='not json\n{"rank": 0, "se')
    mon.scan_once()
    status = read_status(tmp_path)
    assert status["ranks"][0]["process_liveness"] == "alive"
    assert mon.scan_errors == 0


def test_other_files_and_other_runs_are_ignored(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=None)
    (tmp_path / "notes.heartbeat.jsonl").write_text(json.dumps(rec(5, 0)) + "\n")
    other = rec(0, 0)
    other["run_id"] = "another"
    write(tmp_path, other)
    mon.scan_once()
    status = read_status(tmp_path)
    assert status["ranks"] == []
    assert status["monitor"]["ignored_records"] == 1


class FakeRemote(RemoteSource):
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.health: dict[int, dict[str, Any]] = {}
        self.done = False
        self.fetches = 0

    def fetch(self) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        self.fetches += 1
        return list(self.records), dict(self.health)

    def nodes_done(self) -> bool:
        return self.done


def test_remote_records_are_mirrored_and_evaluated(tmp_path: Path) -> None:
    clock = FakeClock()
    remote = FakeRemote()
    mon = _monitor(tmp_path, clock, world=4, remote=remote)
    write(tmp_path, rec(0, 0, world_size=4), rec(1, 0, world_size=4))
    remote.records = [
        rec(2, 0, pid=7002, hostname="node-b", node_rank=1, world_size=4),
        rec(3, 0, pid=7003, hostname="node-b", node_rank=1, world_size=4),
    ]
    remote.health = {1: {"hostname": "node-b", "status": "ok", "source": "nvml", "gpus": []}}
    mon.scan_once()
    # the relay repeats the latest record until a newer one exists: no duplicate lines
    mon.scan_once()
    remote.records = [
        rec(2, 1, pid=7002, hostname="node-b", node_rank=1, progress_seq=2, world_size=4),
        rec(3, 0, pid=7003, hostname="node-b", node_rank=1, world_size=4),
    ]
    mon.scan_once()
    mirrored2 = tmp_path / heartbeat_file_name(2, 7002)
    mirrored3 = tmp_path / heartbeat_file_name(3, 7003)
    lines2 = [json.loads(x) for x in mirrored2.read_text().splitlines()]
    assert [r["seq"] for r in lines2] == [0, 1]
    assert [json.loads(x)["seq"] for x in mirrored3.read_text().splitlines()] == [0]
    status = read_status(tmp_path)
    assert status["summary"]["ranks_observed"] == 4
    rows = {r["rank"]: r for r in status["ranks"]}
    assert rows[2]["hostname"] == "node-b" and rows[2]["node_rank"] == 1
    assert rows[2]["process_liveness"] == "alive"
    assert rows[2]["progress_seq"] == 2
    assert status["gpu_health"]["1"]["status"] == "ok"
    assert json.loads((tmp_path / "gpu_health_node_1.json").read_text())["hostname"] == "node-b"
    # node 1 goes silent: its ranks time out like local ones
    clock.t += 11
    write(tmp_path, rec(0, 1, world_size=4), rec(1, 1, world_size=4))
    mon.scan_once()
    stale = {f["rank"] for f in read_findings(tmp_path)}
    assert stale == {2, 3}


def test_remote_records_of_other_runs_are_not_mirrored(tmp_path: Path) -> None:
    remote = FakeRemote()
    mon = _monitor(tmp_path, FakeClock(), world=None, remote=remote)
    other = rec(2, 0, pid=7002, hostname="node-b")
    other["run_id"] = "someone-else"
    remote.records = [other, {"rank": "x"}]
    mon.scan_once()
    assert not (tmp_path / heartbeat_file_name(2, 7002)).exists()
    assert mon.scan_errors == 0


def test_remote_fetch_failure_is_tolerated(tmp_path: Path) -> None:
    class Broken(FakeRemote):
        def fetch(self) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
            raise ConnectionError("store gone")

    mon = _monitor(tmp_path, FakeClock(), world=1, remote=Broken())
    write(tmp_path, rec(0, 0, world_size=1))
    mon.scan_once()
    assert mon.scan_errors == 0
    assert read_status(tmp_path)["ranks"][0]["process_liveness"] == "alive"


def _health_snapshot(hostname: str, uuid: str, verdict: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "source": "nvml",
        "status": verdict,
        "error": None,
        "hostname": hostname,
        "node_rank": 0,
        "gpus": [
            {"index": 0, "uuid": "GPU-aaaa-0000", "health": "ok", "problems": []},
            {
                "index": 1,
                "uuid": uuid,
                "health": verdict,
                "problems": ["ecc_uncorrected_volatile=4"] if verdict == "unhealthy" else [],
            },
        ],
    }


def test_gpu_health_file_maps_to_rank(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    (tmp_path / "gpu_health_node_0.json").write_text(
        json.dumps(_health_snapshot("node-a", "GPU-bbbb-1111", "unhealthy"))
    )
    write(
        tmp_path,
        rec(0, 0, gpu_token="GPU-aaaa-0000"),
        rec(1, 0, gpu_token="GPU-bbbb-1111"),
    )
    mon.scan_once()
    clock.t += 1
    write(tmp_path, rec(0, 1, gpu_token="GPU-aaaa-0000"), rec(1, 1, gpu_token="GPU-bbbb-1111"))
    mon.scan_once()
    findings = read_findings(tmp_path)
    assert len(findings) == 1
    f = findings[0]
    assert f["finding_type"] == "gpu_hardware_health_failure"
    assert f["reason"] == "gpu_unhealthy"
    assert f["rank"] == 1
    assert f["gpu_health"]["uuid"] == "GPU-bbbb-1111"
    assert f["gpu_health"]["problems"] == ["ecc_uncorrected_volatile=4"]
    assert f["gpu_health"]["stale"] is False
    status = read_status(tmp_path)
    assert status["ranks"][0]["gpu_health"]["uuid"] == "GPU-aaaa-0000"
    assert status["ranks"][1]["active_findings"] == ["gpu_hardware_health_failure"]
    assert status["gpu_health"]["0"]["status"] == "unhealthy"
    assert status["gpu_health"]["0"]["gpus"] == 2


def test_gpu_health_of_another_host_is_not_used(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, FakeClock())
    (tmp_path / "gpu_health_node_0.json").write_text(
        json.dumps(_health_snapshot("other-host", "GPU-bbbb-1111", "unhealthy"))
    )
    write(tmp_path, rec(0, 0), rec(1, 0, gpu_token="GPU-bbbb-1111"))
    mon.scan_once()
    assert read_findings(tmp_path) == []
    assert read_status(tmp_path)["ranks"][1]["gpu_health"] is None


def test_stale_gpu_health_gives_no_finding(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1)
    (tmp_path / "gpu_health_node_0.json").write_text(
        json.dumps(_health_snapshot("node-a", "GPU-bbbb-1111", "unhealthy"))
    )
    mon.scan_once()  # reads the health file at t=1000, before any rank
    clock.t += 181  # default stale_after_s = 3 x 60 s
    write(tmp_path, rec(0, 0, gpu_token="GPU-bbbb-1111", world_size=1))
    mon.scan_once()
    assert read_findings(tmp_path) == []
    assert read_status(tmp_path)["ranks"][0]["gpu_health"]["stale"] is True


def test_vanished_local_pid_is_reported(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1, check_pids=True)
    write(tmp_path, rec(0, 0, pid=proc.pid, hostname=socket.gethostname(), world_size=1))
    mon.scan_once()
    findings = read_findings(tmp_path)
    assert [(f["finding_type"], f["reason"]) for f in findings] == [
        ("rank_process_exited", "rank_process_died_without_process_end")
    ]
    assert findings[0]["pid"] == proc.pid
    status = read_status(tmp_path)
    assert status["state"] == "failed"
    assert status["ranks"][0]["process_liveness"] == "exited"
    assert status["ranks"][0]["exit"]["vanished"] is True


def test_running_local_pid_and_remote_hosts_are_not_marked(tmp_path: Path) -> None:
    import os

    mon = _monitor(tmp_path, FakeClock(), world=2, check_pids=True)
    write(
        tmp_path,
        rec(0, 0, pid=os.getpid(), hostname=socket.gethostname()),
        rec(1, 0, pid=999_999_999, hostname="some-other-host"),
    )
    mon.scan_once()
    assert read_findings(tmp_path) == []
    assert [r["process_liveness"] for r in read_status(tmp_path)["ranks"]] == ["alive"] * 2


def _pid_gone() -> int:
    """The pid of a process that ran on this host and is gone (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("node", [0, 1])
def test_a_pid_gone_from_this_host_ends_only_a_rank_of_this_node(tmp_path: Path, node: int) -> None:
    # Two agents on one host (a two-node test): rank 1's pid no longer runs here. As
    # node 0's own rank (its file in this run directory) it vanished; as node 1's rank
    # (relayed) its pid is not this node's to look up: node 1's relay says when it ends.
    here = socket.gethostname()
    remote = FakeRemote()
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=2, check_pids=True, remote=remote)
    write(tmp_path, rec(0, 0, pid=os.getpid(), hostname=here, node_rank=0))
    rank1 = rec(1, 0, pid=_pid_gone(), hostname=here, node_rank=node)
    if node == 0:
        write(tmp_path, rank1)
    else:
        remote.records = [rank1]
    mon.scan_once()
    clock.t += 5.0  # within the process timeout: no heartbeat is late yet
    mon.scan_once()
    found = [(f["rank"], f["reason"]) for f in read_findings(tmp_path)]
    rows = {r["rank"]: r for r in read_status(tmp_path)["ranks"]}
    if node == 0:
        assert found == [(1, "rank_process_died_without_process_end")]
        assert rows[1]["exit"]["vanished"] is True
    else:
        assert found == []
        assert rows[1]["process_liveness"] == "alive"


def test_a_rank_mirrored_by_an_earlier_monitor_is_not_judged_by_its_pid(
    tmp_path: Path,
) -> None:
    # The monitor of an agent numbered 0 again by a later round reads its run directory
    # from the start: the mirrors of another node's ranks (records relayed to it, their
    # ``relayed_age_s`` set) are that node's, whose pids this host cannot judge.
    here = socket.gethostname()
    mon = _monitor(tmp_path, FakeClock(), world=2, check_pids=True, remote=FakeRemote())
    write(
        tmp_path,
        rec(0, 0, pid=os.getpid(), hostname=here, node_rank=0),
        {**rec(1, 0, pid=_pid_gone(), hostname=here, node_rank=1), "relayed_age_s": 0.2},
    )
    mon.scan_once()
    assert read_findings(tmp_path) == []
    rows = {r["rank"]: r for r in read_status(tmp_path)["ranks"]}
    assert rows[1]["process_liveness"] == "alive"


def test_a_rank_of_another_node_is_ended_by_its_relayed_end(tmp_path: Path) -> None:
    here = socket.gethostname()
    remote = FakeRemote()
    mon = _monitor(tmp_path, FakeClock(), world=2, check_pids=True, remote=remote)
    write(tmp_path, rec(0, 0, pid=os.getpid(), hostname=here, node_rank=0))
    rank1 = rec(1, 0, pid=_pid_gone(), hostname=here, node_rank=1)
    remote.records = [rank1]
    mon.scan_once()
    assert read_findings(tmp_path) == []
    # node 1's relay saw the pid vanish on its node and sent the end it wrote for it
    end = HeartbeatRecord.from_dict(rank1).vanished(BASE_NS + 2 * 10**9)
    remote.records = [end.to_dict()]
    mon.scan_once()
    found = read_findings(tmp_path)
    assert [(f["rank"], f["reason"]) for f in found] == [
        (1, "rank_process_died_without_process_end")
    ]
    assert read_status(tmp_path)["ranks"][1]["exit"]["vanished"] is True


def test_stop_returns_completed_status(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    mon.start()
    clean = {"clean": True, "exit_code": 0, "error": None}
    write(
        tmp_path,
        rec(0, 0, event="process_start", progress_seq=0),
        rec(1, 0, event="process_start", progress_seq=0),
        rec(0, 1, progress_seq=10),
        rec(1, 1, progress_seq=10),
        rec(0, 2, event="process_end", progress_seq=10, exit=clean),
        rec(1, 2, event="process_end", progress_seq=10, exit=clean),
    )
    status = mon.stop(drain_timeout_s=5.0)
    assert status["state"] == "completed"
    assert [(r["process_liveness"], r["gpu_progress"]) for r in status["ranks"]] == [
        ("exited", "completed")
    ] * 2
    assert status["summary"]["process_liveness"] == {"exited": 2}
    assert read_status(tmp_path) == status
    assert read_findings(tmp_path) == []
    assert mon._thread is not None and not mon._thread.is_alive()


def test_stop_waits_for_remote_nodes(tmp_path: Path) -> None:
    ticks = FakeClock()
    remote = FakeRemote()
    mon = _monitor(tmp_path, ticks, world=1, remote=remote)
    clean = {"clean": True, "exit_code": 0, "error": None}
    write(tmp_path, rec(0, 0, event="process_end", world_size=1, exit=clean))
    remote.done = True
    status = mon.stop(drain_timeout_s=5.0)
    assert status["state"] == "completed"
    assert remote.fetches == 1


def test_states_are_from_the_documented_sets(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=4)
    err = {"clean": False, "exit_code": 1, "error": "x"}
    write(
        tmp_path,
        rec(0, 0, world_size=4),
        rec(1, 0, progress_seq=0, world_size=4),
        rec(2, 0, event="process_end", world_size=4, exit=err),
    )
    for _ in range(3):
        mon.scan_once()
        clock.t += 5
    status = read_status(tmp_path)
    assert status["state"] in {"starting", "running", "degraded", "completed", "failed"}
    for row in status["ranks"]:
        assert row["process_liveness"] in LIVENESS
        assert row["gpu_progress"] in PROGRESS
    assert status["ranks"][3]["process_liveness"] == "not_observed"
    assert status["state"] == "failed"


def test_gpu_health_matched_by_uuid_when_token_is_an_index(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, FakeClock(), world=1)
    (tmp_path / "gpu_health_node_0.json").write_text(
        json.dumps(_health_snapshot("node-a", "GPU-bbbb-1111", "warning"))
    )
    r = rec(0, 0, world_size=1, gpu_token="0")  # index 0 is the healthy GPU in NVML order
    r["gpu"]["uuid"] = "GPU-bbbb-1111"  # but CUDA reported this UUID
    write(tmp_path, r)
    findings = mon.scan_once()
    assert [(f.finding_type, (f.gpu_health or {})["uuid"]) for f in findings] == [
        ("gpu_hardware_health_warning", "GPU-bbbb-1111")
    ]


def test_shutdown_exits_give_stopped_state(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    mon.note_shutdown("SIGTERM")
    killed = {"clean": False, "exit_code": -15, "error": "terminated"}
    write(
        tmp_path,
        rec(0, 1, event="process_end", exit=killed),
        rec(1, 1, event="process_end", exit=killed),
    )
    clock.t += 1
    assert mon.scan_once() == []
    status = read_status(tmp_path)
    assert status["state"] == "stopped"
    assert [r["exit"]["after_shutdown"] for r in status["ranks"]] == ["SIGTERM"] * 2
    assert read_findings(tmp_path) == []
    # the exits are held as state (one episode each), not findings: none is "active"
    assert [r["active_findings"] for r in status["ranks"]] == [[], []]
    assert (status["summary"]["findings_total"], status["summary"]["findings_active"]) == (0, 0)


def test_state_recovers_after_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1)
    err = {"clean": False, "exit_code": 1, "error": "boom"}
    write(tmp_path, rec(0, 0, world_size=1), rec(0, 1, event="process_end", world_size=1, exit=err))
    mon.scan_once()
    assert read_status(tmp_path)["state"] == "failed"
    clock.t += 30
    restarted = rec(0, 0, pid=5000, event="process_start", world_size=1, progress_seq=0)
    restarted["wall_time_ns"] = BASE_NS + 60_000_000_000
    later = rec(0, 1, pid=5000, world_size=1, progress_seq=4)
    later["wall_time_ns"] = BASE_NS + 61_000_000_000
    write(tmp_path, restarted, later)
    mon.scan_once()
    status = read_status(tmp_path)
    assert status["ranks"][0]["pid"] == 5000
    assert status["ranks"][0]["gpu_progress"] == "progressing"
    assert status["state"] == "running"


# ---- rotated heartbeat files (heartbeat.max_file_mb) ------------------------------------


def test_a_rotating_rank_file_is_followed_without_findings(tmp_path: Path) -> None:
    from rankguard.util.fs import rotate_jsonl

    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=1)
    start = rec(0, 0, event="process_start", progress_seq=0, world_size=1)
    write(tmp_path, start)
    mon.scan_once()
    path = tmp_path / heartbeat_file_name(0, start["pid"])
    for seq in range(1, 30):
        clock.t += 1
        write(tmp_path, rec(0, seq, progress_seq=seq, world_size=1))
        if seq % 7 == 0:  # what the publisher does: the start record heads the new file
            rotate_jsonl(path, (json.dumps(start) + "\n").encode())
        assert mon.scan_once() == []
    clock.t += 1
    write(tmp_path, rec(0, 30, progress_seq=30, world_size=1))
    assert mon.scan_once() == []
    (row,) = read_status(tmp_path)["ranks"]
    assert row["progress_seq"] == 30 and row["process_liveness"] == "alive"
    assert row["gpu_progress"] == "progressing"


def test_mirrored_files_rotate_like_the_ranks_own(tmp_path: Path) -> None:
    cfg = heartbeat_config(scan_interval_s=0.05, max_file_mb=0.002)  # 2000 bytes
    remote = FakeRemote()
    mon = JobMonitor(
        cfg,
        tmp_path,
        RUN,
        expected_world_size=1,
        clock=FakeClock(),
        check_pids=False,
        remote=remote,
    )
    for seq in range(40):
        event = "process_start" if seq == 0 else "heartbeat"
        remote.records = [
            rec(
                0,
                seq,
                pid=7000,
                event=event,
                progress_seq=seq,
                hostname="node-b",
                node_rank=1,
                world_size=1,
            )
        ]
        mon.scan_once()
    path = tmp_path / heartbeat_file_name(0, 7000)
    older = path.with_name(path.name + ".1")
    assert path.stat().st_size <= 2000 and older.stat().st_size <= 2000
    current = [json.loads(x) for x in path.read_text().splitlines()]
    assert current[0]["event"] == "process_start" and current[0]["seq"] == 0
    assert current[-1]["seq"] == 39
    seqs = [json.loads(x)["seq"] for x in older.read_text().splitlines()[1:]]
    seqs += [r["seq"] for r in current[1:]]
    assert seqs == list(range(seqs[0], 40))
    assert read_status(tmp_path)["ranks"][0]["progress_seq"] == 39


def test_a_finding_the_launcher_reports_is_written_and_counted_at_the_next_scan(
    tmp_path: Path,
) -> None:
    """Bad-node exclusion's ``node_excluded`` is made by the launcher, in another thread:
    the monitor writes it through its sinks with the scan's own findings and counts it
    (findings.jsonl, the status, the end-of-run line), once."""
    from rankguard.schema.findings import Finding, FindingType, Reason

    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    seen: list[str] = []

    class Sink:
        def before_write(self, f: Finding) -> None:
            seen.append(f"before {f.finding_type.value}")

        def after_write(self, f: Finding) -> None:
            seen.append(f"after {f.finding_type.value}")

    mon.add_sink(Sink())  # type: ignore[arg-type]
    write(tmp_path, rec(0, 0, event="process_start", progress_seq=0))
    write(tmp_path, rec(1, 0, event="process_start", progress_seq=0))
    assert mon.scan_once() == []
    excluded = Finding.build(
        FindingType.NODE_EXCLUDED,
        Reason.EXCLUDED_UNHEALTHY_GPU,
        run_id=RUN,
        rank=-1,
        message="node 1 excluded: GPU 0 XID 79",
        hostname="node-b",
    )
    assert mon.report(excluded)
    assert read_findings(tmp_path) == []  # not before the scan
    (found,) = mon.scan_once()
    assert found is excluded and found.detected_wall_time is not None
    (line,) = read_findings(tmp_path)
    assert line["finding_type"] == "node_excluded" and line["hostname"] == "node-b"
    assert read_status(tmp_path)["summary"]["findings_total"] == 1
    assert seen == ["before node_excluded", "after node_excluded"]
    assert mon.scan_once() == [] and len(read_findings(tmp_path)) == 1
    mon.stop()
    assert not mon.report(excluded)  # stopped: the caller writes it itself
