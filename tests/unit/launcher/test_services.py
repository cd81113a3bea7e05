"""NodeServices: a restart whose line cannot be written (a full disk) is kept and
written at a later scan; the status says how many wait."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import rankguard.util.fs as fs
from rankguard.config import RankguardConfig
from rankguard.launcher.services import NodeServices
from rankguard.schema.layout import RESTARTS_FILE
from rankguard.schema.restarts import LostRank, RestartCause
from tests.factories import read_jsonl


def _services(run_dir: Path) -> NodeServices:
    return NodeServices(
        cfg=RankguardConfig(),
        run_dir=run_dir,
        run_id="run-services",
        node_rank=0,
        nnodes=1,
        expected_world_size=2,
    )


def test_a_restart_that_cannot_be_written_is_kept_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fs.append_bytes

    def no_space(path: Any, data: bytes, *, fsync: bool = True) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fs, "append_bytes", no_space)
    services = _services(tmp_path)
    cause = RestartCause(finding_type="gpu_progress_timeout", rank=1, message="stalled")
    services.on_restart(1, cause)  # does not raise
    services.on_restart(2, None)
    assert [r.restart for r in services.restarts] == [1, 2]
    fields = services.status_fields()  # what the monitor's scan asks for
    assert fields["unwritten_restarts"] == 2
    assert "No space left on device" in fields["restarts_write_error"]
    assert not (tmp_path / RESTARTS_FILE).exists()

    monkeypatch.setattr(fs, "append_bytes", real)
    fields = services.status_fields()
    assert "unwritten_restarts" not in fields
    assert [r["restart"] for r in read_jsonl(tmp_path / RESTARTS_FILE)] == [1, 2]
    assert read_jsonl(tmp_path / RESTARTS_FILE)[0]["cause"] == "gpu_progress_timeout"


def test_only_a_killed_ranks_root_cause_is_passed_to_the_monitor(tmp_path: Path) -> None:
    from types import SimpleNamespace

    noted: list[tuple[int, int | None]] = []
    svc = NodeServices(
        cfg=RankguardConfig(),
        run_dir=tmp_path,
        run_id="r",
        node_rank=0,
        nnodes=1,
        expected_world_size=2,
    )
    svc.monitor = SimpleNamespace(  # type: ignore[assignment]
        note_root_cause=lambda rank, pid: noted.append((rank, pid))
    )
    # an error exit: the monitor orders those itself, with every node's records
    svc.on_group_failure(RestartCause(rank=1, pid=11, exit_code=1, signal=None))
    assert noted == []
    svc.on_group_failure(RestartCause(rank=2, pid=12, exit_code=-9, signal="SIGKILL"))
    assert noted == [(2, 12)]


def test_a_renumbered_node_moves_its_services_node0_runs_the_monitor(tmp_path: Path) -> None:
    from rankguard.config import build
    from rankguard.schema.layout import STATUS_FILE

    services = NodeServices(
        cfg=build(RankguardConfig, {"heartbeat": {"enabled": True, "scan_interval_s": 0.2}}),
        run_dir=tmp_path,
        run_id="run-move",
        node_rank=1,
        nnodes=2,
        expected_world_size=2,
    )
    services.start()
    assert services.monitor is None  # node 1: no monitor (and no store: no relay)
    services.move(0)  # the node that was 1 is node 0 of the new round
    try:
        assert services.node_rank == 0 and services.monitor is not None
        assert services.agreement is not None
        monitor = services.monitor
        services.move(1)  # and back: the monitor's last status is written, it stops
        assert services.monitor is None and services.agreement is None
        assert monitor._stop.is_set()
        assert (tmp_path / STATUS_FILE).is_file()
    finally:
        services.stop()


def test_a_rank_whose_peer_went_away_is_not_named_the_cause_alone(tmp_path: Path) -> None:
    """After a node is lost, this node's rank fails in its broken collective: the restart
    says that its peer went away, and names the rank the monitor saw fail first."""
    from types import SimpleNamespace

    services = _services(tmp_path)
    peer = (
        "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:19330. This is typically caused by a remote worker crashing."
    )
    failed = RestartCause(finding_type="worker_failed", rank=0, exit_code=1, error=peer)
    noted: list[tuple[str, bool]] = []

    def note_restart(reason: str, *, cause_pending: bool = False) -> None:
        noted.append((reason, cause_pending))

    services.monitor = SimpleNamespace(  # type: ignore[assignment]
        first_failed_rank=lambda: 1, note_restart=note_restart
    )
    services.on_restart(1, failed)
    services.monitor = SimpleNamespace(  # type: ignore[assignment]
        first_failed_rank=lambda: None, note_restart=note_restart
    )
    services.on_restart(2, failed)
    # a rank's own error, or one killed by a signal, is the cause as it was
    own = RestartCause(finding_type="worker_failed", rank=1, exit_code=1, error="ZeroDivisionError")
    services.on_restart(3, own)
    killed = RestartCause(finding_type="worker_failed", rank=1, exit_code=-9, signal="SIGKILL")
    services.on_restart(4, replace(killed, error=peer))
    first, unknown, plain, signalled = read_jsonl(tmp_path / RESTARTS_FILE)
    # only the restart whose cause the monitor has not seen yet leaves it pending
    assert [pending for _, pending in noted] == [False, True, False, False]
    assert (first["cause"], first["rank"], first["reason"]) == ("worker_failed", 0, "peer_failure")
    assert first["message"].startswith(
        "its peer went away (rank 1 failed first, as the monitor saw): RuntimeError"
    )
    assert unknown["message"].startswith("its peer went away (the root cause is on another rank)")
    assert (plain["reason"], plain["message"]) == (None, "ZeroDivisionError")
    assert signalled["reason"] is None and signalled["message"] == peer


def test_an_excluded_node_stops_relaying_at_once_and_leaves_its_number_undone(
    tmp_path: Path,
) -> None:
    """Excluded while its launcher stays (it holds the rendezvous store): the relay
    stops without a last push, nor at the launcher's final stop, and its node number is
    not marked done (in the new round it may be another agent's)."""
    from datetime import timedelta

    import torch.distributed as dist

    from rankguard.config import build
    from rankguard.schema.layout import StoreKeys

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    cfg = build(
        RankguardConfig,
        {"no_shared_fs": True, "heartbeat": {"enabled": True, "publish_interval_s": 0.05}},
    )
    services = NodeServices(
        cfg=cfg,
        run_dir=tmp_path,
        run_id="run-leave",
        node_rank=1,
        nnodes=3,
        expected_world_size=3,
        store=store,
    )
    services.start()
    relay = services.relay
    assert relay is not None and services.relaying
    keys = StoreKeys("run-leave")
    deadline = time.monotonic() + 5.0
    while not store.check([keys.tick(1)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.check([keys.tick(1)])
    services.leave()
    assert services.relay is None
    assert relay._thread is not None and not relay._thread.is_alive()
    pushes = relay.pushes
    store.delete_key(keys.tick(1))
    time.sleep(0.2)  # four publish intervals
    services.stop()
    assert relay.pushes == pushes
    assert not store.check([keys.tick(1)]) and not store.check([keys.done(1)])


def test_an_excluded_node_pushes_its_ranks_last_records_before_it_leaves(
    tmp_path: Path,
) -> None:
    """A rank's crash excludes its node, decided before the relay's next push (a rank
    forked by ``--preload`` ends at once after its ``process_end``): that record
    reaches node 0 all the same, pushed while the node is still in the rendezvous
    (through the exclusion's leave), and the relay stops there: no later push, no
    ``done`` mark. Without it node 0 saw the rank fall silent and named a heartbeat
    timeout instead of its exit."""
    import json
    from datetime import timedelta
    from types import SimpleNamespace

    import torch.distributed as dist

    from rankguard.config import build
    from rankguard.launcher.exclusion import NodeExcluded
    from rankguard.launcher.membership import ExclusionService
    from rankguard.schema.layout import StoreKeys
    from tests.factories import heartbeat_record

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    cfg = build(
        RankguardConfig,
        {
            "no_shared_fs": True,
            # no push of the relay's own within the test: the ones it makes are called
            "heartbeat": {"enabled": True, "publish_interval_s": 20},
            "fault_tolerance": {"exclude_after_restarts": 1},
        },
    )
    run_id, pid = "run-excluded", os.getpid()
    services = NodeServices(
        cfg=cfg,
        run_dir=tmp_path,
        run_id=run_id,
        node_rank=1,
        nnodes=2,
        expected_world_size=2,
        store=store,
    )
    launch = SimpleNamespace(
        cfg=cfg,
        opts=SimpleNamespace(min_nodes=1, max_nodes=2),
        run_id=run_id,
        run_dir=tmp_path,
        store_client=lambda: store,
        say=lambda line: None,
        services=services,
    )
    feature = ExclusionService()
    handler = feature.wrap_rendezvous(SimpleNamespace(), launch)  # type: ignore[arg-type]
    services.start()
    relay = services.relay
    assert relay is not None
    beats = tmp_path / f"rank_1_pid_{pid}.heartbeat.jsonl"
    common = {"run_id": run_id, "pid": pid, "node_rank": 1, "local_rank": 0}
    beats.write_text(json.dumps(heartbeat_record(1, 1, **common)) + "\n")
    relay.push_once()  # node 0 has the rank alive
    keys = StoreKeys(run_id)
    crash = {"clean": False, "exit_code": 1, "error": "RuntimeError: crash"}
    end = heartbeat_record(1, 2, event="process_end", exit=crash, **common)
    with beats.open("a") as fh:
        fh.write(json.dumps(end) + "\n")
    exclusion = feature.exclusion
    assert exclusion is not None
    exclusion.note_failure({"exit_code": 1, "rank": 1, "local_rank": 0}, [1])
    early = int(store.add(keys.early_pushes, 0))
    with pytest.raises(NodeExcluded):
        handler.next_rendezvous()
    services.leave()  # the launcher's, once the agent's run ended (NodeLeft)
    (last,) = json.loads(store.get(keys.heartbeats(1)))["records"]
    assert (last["event"], last["pid"], last.get("exit")) == ("process_end", pid, crash)
    # off the relay's schedule: node 0 reads every tick at its next scan, not when due
    assert int(store.add(keys.early_pushes, 0)) == early + 1
    assert services.relay is None
    assert relay._thread is not None and not relay._thread.is_alive()
    pushes = relay.pushes
    services.stop()
    assert relay.pushes == pushes and not store.check([keys.done(1)])


def test_a_rank_lost_to_a_standby_is_one_finding_naming_the_standby(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from rankguard.schema.findings import FindingType, Reason

    services = _services(tmp_path)
    reported: list[Any] = []
    replaced: set[tuple[int, int]] = set()

    def note_replaced(rank: int, pid: int) -> bool:
        new = (rank, pid) not in replaced
        replaced.add((rank, pid))
        return new

    services.monitor = SimpleNamespace(  # type: ignore[assignment]
        note_replaced=note_replaced, report=reported.append
    )
    lost = LostRank(
        rank=2, pid=102, standby_pid=104, node=0, reason=Reason.DIED.value, exit="SIGKILL"
    )
    services.on_rank_lost(lost)
    services.on_rank_lost(lost)  # once
    (finding,) = reported
    assert finding.finding_type is FindingType.PROCESS_EXITED and finding.reason is Reason.DIED
    assert (finding.rank, finding.pid, finding.node_rank) == (2, 102, 0)
    assert "standby pid 104 takes its place" in finding.message
    assert finding.exit == {"vanished": True, "how": "SIGKILL"}


def test_a_rank_lost_to_a_standby_lets_fault_tolerance_act_again(tmp_path: Path) -> None:
    """The monitor may see the exit first and its finding sets fault tolerance waiting
    for a group restart; live recovery does none: the next fault (a hang) must be acted
    on, not left as 'a restart is already under way'."""
    from types import SimpleNamespace

    from rankguard.schema.findings import Reason

    services = _services(tmp_path)
    calls: list[str] = []
    services.faults = SimpleNamespace(  # type: ignore[assignment]
        restarted=lambda: calls.append("restarted"), killed=lambda rank, pid: False
    )
    services.monitor = SimpleNamespace(  # type: ignore[assignment]
        note_replaced=lambda rank, pid: False, report=lambda f: None
    )
    lost = LostRank(
        rank=2, pid=102, standby_pid=104, node=0, reason=Reason.DIED.value, exit="SIGKILL"
    )
    services.on_rank_lost(lost)
    assert calls == ["restarted"]


def test_a_rank_fault_tolerance_killed_gets_no_second_finding(tmp_path: Path) -> None:
    """A hang: its finding made fault tolerance kill the rank, and a standby takes its
    place; the end of the process it killed is that action's doing, not a new fault."""
    from types import SimpleNamespace

    from rankguard.schema.findings import Reason

    services = _services(tmp_path)
    reported: list[Any] = []
    noted: list[tuple[int, int]] = []
    services.faults = SimpleNamespace(  # type: ignore[assignment]
        restarted=lambda: None, killed=lambda rank, pid: (rank, pid) == (2, 102)
    )
    services.monitor = SimpleNamespace(  # type: ignore[assignment]
        note_replaced=lambda rank, pid: noted.append((rank, pid)) or True,
        report=reported.append,
    )
    services.on_rank_lost(
        LostRank(rank=2, pid=102, standby_pid=104, node=0, reason=Reason.DIED.value, exit="SIGKILL")
    )
    assert noted == [(2, 102)] and reported == []  # the monitor knows; no second finding
    services.on_rank_lost(
        LostRank(rank=1, pid=101, standby_pid=105, node=0, reason=Reason.DIED.value, exit="SIGKILL")
    )
    assert [(f.rank, f.pid) for f in reported] == [(1, 101)]  # a loss of its own
