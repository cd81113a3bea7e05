"""StoreRelay / StoreRemoteSource over a real torch.distributed TCPStore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.monitor import JobMonitor
from rankguard.relay.relay import StoreRelay, StoreRemoteSource
from rankguard.schema.layout import StoreKeys, heartbeat_file_name
from tests.factories import heartbeat_record
from tests.factories import write_heartbeats as write

dist = pytest.importorskip("torch.distributed")

RUN = "run-relay"


rec = partial(
    heartbeat_record,
    run_id=RUN,
    seq_step_ns=1_000_000_000,
    hostname="node-b",
    node_rank=1,
    ranks_per_node=2,
    world_size=4,
    gpu_token=None,
    progress_lead=0,
    since=0.1,
    omit=("checkpoint_id",),
)


class SyncedClient:
    """The node-1 client store, with a round trip after every ``set``.

    TCPStore.set does not wait for the server, so a read on node 0's own connection may
    not see it yet; the real monitor polls, a test must not race. A ``check`` on the
    same connection returns only after the server applied the earlier ``set``.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def set(self, key: str, value: Any) -> None:
        self.store.set(key, value)
        self.store.check([key])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def stores() -> Iterator[tuple[Any, Any]]:
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10))
    yield master, SyncedClient(client)
    del client, master


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_relay_pushes_latest_record_per_rank(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    me = os.getpid()  # a running pid: not synthesized as vanished
    write(tmp_path, rec(2, 0, me, event="process_start"), rec(2, 1, me), rec(2, 2, me))
    write(tmp_path, rec(3, 0, me, event="process_start"))
    health = {"hostname": "node-b", "status": "ok", "source": "nvml", "gpus": [{"index": 0}]}
    (tmp_path / "gpu_health_node_1.json").write_text(json.dumps(health))
    other = rec(2, 9, me, run_id="another-run")
    write(tmp_path, other)

    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    assert relay.pushes == 1 and relay.errors == 0
    source = StoreRemoteSource(master, RUN, nnodes=2)
    records, got_health = source.fetch()
    latest = {r["rank"]: r for r in records}
    assert sorted(latest) == [2, 3]
    assert latest[2]["seq"] == 2  # the latest, not the other run's seq 9
    assert latest[2]["run_id"] == RUN
    assert latest[3]["event"] == "process_start"
    assert got_health == {1: health}
    assert source.nodes_done() is False

    # newer lines arrive: the next push carries them
    write(tmp_path, rec(2, 3, me, progress_seq=42))
    relay.push_once()
    records, _ = source.fetch()
    assert {r["rank"]: r["progress_seq"] for r in records}[2] == 42

    relay.stop()
    assert source.nodes_done() is True
    key = StoreKeys(RUN).heartbeats(1)
    assert master.check([key])


def test_fetch_before_any_push_is_empty(stores: tuple[Any, Any]) -> None:
    master, _ = stores
    source = StoreRemoteSource(master, RUN, nnodes=3)
    assert source.fetch() == ([], {})
    assert source.nodes_done() is False


def test_single_node_has_nothing_to_fetch_and_is_done(stores: tuple[Any, Any]) -> None:
    master, _ = stores
    source = StoreRemoteSource(master, RUN, nnodes=1)
    assert source.fetch() == ([], {})
    assert source.nodes_done() is True


def test_nodes_done_needs_every_node(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    (tmp_path / "n1").mkdir()
    (tmp_path / "n2").mkdir()
    r1 = StoreRelay(client, tmp_path / "n1", RUN, node_rank=1, interval_s=0.05)
    r2 = StoreRelay(client, tmp_path / "n2", RUN, node_rank=2, interval_s=0.05)
    source = StoreRemoteSource(master, RUN, nnodes=3)
    r1.stop()
    assert source.nodes_done() is False
    r2.stop()
    assert source.nodes_done() is True


def test_nodes_done_does_not_wait_for_a_node_live_recovery_took_over(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """Node 2 lost with its relay, its ranks taken by other nodes' standbys: node 0's
    final drain waits for node 1 only (until a new round)."""
    master, client = stores
    (tmp_path / "n1").mkdir()
    r1 = StoreRelay(client, tmp_path / "n1", RUN, node_rank=1, interval_s=0.05)
    source = StoreRemoteSource(master, RUN, nnodes=3)
    source.note_lost(2)
    assert source.nodes_done() is False
    r1.stop()
    assert source.nodes_done() is True
    source.note_round(3)  # a new round: node 2 is a node again
    assert source.nodes_done() is False


def test_nodes_done_waits_for_the_rounds_nodes_and_every_node_that_relayed(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """``--nnodes 1:3`` with one node in the round: node 0's final drain does not wait
    the whole drain time for nodes that never came; a node that relayed, or one of the
    round, is still waited for."""
    master, client = stores
    source = StoreRemoteSource(master, RUN, nnodes=3)
    assert source.nodes_done() is False  # no round told: every node the job allows
    source.note_round(1)
    assert source.nodes_done() is True  # nodes 1 and 2 never came
    source.note_round(2)  # node 1 joins the next round
    assert source.nodes_done() is False
    (tmp_path / "n1").mkdir()
    r1 = StoreRelay(client, tmp_path / "n1", RUN, node_rank=1, interval_s=0.05)
    r1.push_once()
    source.fetch()  # node 0 sees node 1's tick
    source.note_round(1)  # node 1 lost again: it relayed, its last records may be in flight
    assert source.nodes_done() is False
    r1.stop()
    assert source.nodes_done() is True


def test_nodes_done_does_not_wait_for_an_earlier_rounds_node_whose_relay_went_silent(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """Node 2 of a round of three was excluded (its relay halted: no last push, no done
    mark) and the job went on with two nodes: node 0's final drain waited its whole
    length for a node that never says it is done. While that node's relay still
    pushes it is waited for; once it has pushed nothing new for ``silent_s``, not."""
    master, client = stores
    now = [100.0]
    source = StoreRemoteSource(master, RUN, nnodes=3, silent_s=3.0, clock=lambda: now[0])
    (tmp_path / "n1").mkdir()
    (tmp_path / "n2").mkdir()
    r1 = StoreRelay(client, tmp_path / "n1", RUN, node_rank=1, interval_s=0.05)
    r2 = StoreRelay(client, tmp_path / "n2", RUN, node_rank=2, interval_s=0.05)
    r1.push_once()
    r2.push_once()
    source.note_round(3)
    source.fetch()
    r2.halt()  # excluded: it leaves without a done mark
    source.note_round(2)
    r1.stop()
    now[0] += 2.0
    source.fetch()
    assert source.nodes_done() is False  # node 2 pushed 2 s ago: it may still deliver
    now[0] += 1.5
    source.fetch()
    assert source.nodes_done() is True  # silent for 3.5 s: it left the job
    r2.push_once()  # an earlier round's node still pushing is waited for again
    source.fetch()
    assert source.nodes_done() is False


def test_dead_pid_becomes_vanished_process_end(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    pid = dead_pid()
    write(tmp_path, rec(2, 0, pid, event="process_start"), rec(2, 1, pid, progress_seq=7))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    (record,), _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert record["event"] == "process_end"
    assert record["pid"] == pid
    assert record["seq"] == 2
    assert record["progress_seq"] == 7
    assert record["synthesized"] is True
    assert record["exit"]["vanished"] is True
    assert record["exit"]["clean"] is False


def test_clean_process_end_is_relayed_as_is(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    pid = dead_pid()
    clean = {"clean": True, "exit_code": 0, "error": None}
    write(tmp_path, rec(2, 0, pid), rec(2, 1, pid, event="process_end", exit=clean))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    (record,), _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert record["event"] == "process_end"
    assert record["exit"] == clean
    assert "synthesized" not in record


def test_real_process_end_replaces_synthesized_one(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    pid = dead_pid()
    write(tmp_path, rec(2, 0, pid))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()  # the pid is gone and no end record yet: synthesized
    clean = {"clean": True, "exit_code": 0, "error": None}
    write(tmp_path, rec(2, 1, pid, event="process_end", exit=clean))  # read one push late
    relay.push_once()
    (record,), _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert record["exit"] == clean
    assert "synthesized" not in record


def test_restarted_rank_replaces_old_pid(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    old = dead_pid()
    me = os.getpid()
    write(tmp_path, rec(2, 0, old), rec(2, 1, old))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    (first,), _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert first["pid"] == old and first["exit"]["vanished"] is True
    newer = rec(2, 0, me, event="process_start")
    newer["wall_time_ns"] = time.time_ns()  # started after the old pid was found dead
    write(tmp_path, newer)
    relay.push_once()
    write(tmp_path, rec(2, 5, old))  # a late line of the replaced process
    relay.push_once()
    (record,), _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert record["pid"] == me
    assert record["event"] == "process_start"


def test_records_of_this_agents_earlier_node_number_are_not_relayed(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """An agent renumbered from node 2 to node 1 (a node before it was excluded): its run
    directory still holds its rank's files of the earlier rounds, under node 2. Only the
    records of node 1 go out under node 1's keys, and node 0 skips nothing."""
    master, client = stores
    me, gone = os.getpid(), dead_pid()
    earlier = rec(2, 0, gone, node_rank=2, ranks_per_node=1, world_size=3)
    write(tmp_path, earlier, rec(2, 1, gone, node_rank=2, ranks_per_node=1, world_size=3))
    write(tmp_path, rec(1, 0, me, event="process_start", ranks_per_node=1, world_size=2))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    source = StoreRemoteSource(master, RUN, nnodes=2)
    records, _ = source.fetch()
    assert [(r["rank"], r["node_rank"], r["pid"]) for r in records] == [(1, 1, me)]
    assert source.ignored() == (0, None)


def test_records_mirrored_here_when_this_agent_was_node_0_are_not_relayed(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """An agent that ran node 0's monitor, renumbered 1 by a later round: its run
    directory still holds its mirrors of the other nodes' ranks (records relayed to it,
    ``relayed_age_s`` set), one of them under node 1, its pid gone from this host. That
    rank is another agent's: this relay neither relays it nor writes its end."""
    master, client = stores
    me = os.getpid()
    write(tmp_path, {**rec(2, 0, dead_pid()), "relayed_age_s": 0.2})
    write(tmp_path, rec(3, 0, me, event="process_start"))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    records, _ = StoreRemoteSource(master, RUN, nnodes=2).fetch()
    assert [(r["rank"], r["pid"], r["event"]) for r in records] == [(3, me, "process_start")]


def test_a_halted_relay_pushes_no_more_and_leaves_its_number_undone(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """An excluded agent stops relaying at once: its node number may be another agent's
    in the new round (which marks it done itself)."""
    master, client = stores
    write(tmp_path, rec(2, 0, os.getpid()))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.start()
    deadline = time.monotonic() + 2.0
    while relay.pushes < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    relay.halt()
    pushes = relay.pushes
    assert pushes >= 1 and relay._thread is not None and not relay._thread.is_alive()
    time.sleep(0.2)  # four intervals
    assert relay.pushes == pushes
    assert StoreRemoteSource(master, RUN, nnodes=2).nodes_done() is False


def test_node0_follows_the_agent_that_took_over_an_excluded_nodes_number(
    tmp_path: Path, stores: tuple[Any, Any]
) -> None:
    """The excluded agent was node 1 and stays (it holds the rendezvous store); the agent
    that was node 2 is node 1 of the new round, its rank a heartbeat every interval.
    With the excluded agent's relay still pushing, node 0 read the keys of whichever
    relay wrote last, and the new rank's heartbeats stopped reaching it for seconds at
    a time (a false heartbeat timeout in an end-to-end run); once it has halted, node 0
    sees every heartbeat."""
    master, client = stores
    excluded, taker = tmp_path / "excluded", tmp_path / "taker"
    excluded.mkdir()
    taker.mkdir()
    gone = dead_pid()
    write(excluded, rec(1, 0, gone, ranks_per_node=1, world_size=3))
    old = StoreRelay(client, excluded, RUN, node_rank=1, interval_s=0.001)
    old.start()
    deadline = time.monotonic() + 2.0
    while old.pushes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    old.halt()  # what NodeServices.leave() does when the agent is excluded
    new = StoreRelay(client, taker, RUN, node_rank=1, interval_s=0.02)
    source = StoreRemoteSource(master, RUN, nnodes=2)
    me = os.getpid()
    seen = []
    for seq in range(8):
        write(taker, rec(1, seq, me, ranks_per_node=1, world_size=2))
        new.push_once()
        time.sleep(0.01)  # node 0 scans a while after the push
        records, _ = source.fetch()
        seen.append([(r["pid"], r["seq"]) for r in records])
    assert seen == [[(me, seq)] for seq in range(8)]


def test_relay_thread_pushes_periodically(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    write(tmp_path, rec(2, 0, os.getpid()))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.start()
    try:
        deadline = time.monotonic() + 2.0
        while relay.pushes < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert relay.pushes >= 3
    finally:
        relay.stop()
    assert StoreRemoteSource(master, RUN, nnodes=2).nodes_done() is True


def test_push_error_is_counted_not_raised(tmp_path: Path) -> None:
    class BrokenStore:
        def set(self, key: str, value: Any) -> None:
            raise RuntimeError("connection reset")

    relay = StoreRelay(BrokenStore(), tmp_path, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    relay.stop()  # the done mark fails too: logged, not raised
    assert relay.errors == 2


def test_monitor_evaluates_relayed_records(tmp_path: Path, stores: tuple[Any, Any]) -> None:
    master, client = stores
    node0 = tmp_path / "node0"
    node1 = tmp_path / "node1"
    node0.mkdir()
    node1.mkdir()
    pid = dead_pid()
    write(node1, rec(2, 0, pid, event="process_start"), rec(2, 1, pid))
    relay = StoreRelay(client, node1, RUN, node_rank=1, interval_s=0.05)
    relay.push_once()
    cfg = HeartbeatConfig(publish_interval_s=1, process_timeout_s=10)
    t = [100.0]
    mon = JobMonitor(
        cfg,
        node0,
        RUN,
        remote=StoreRemoteSource(master, RUN, nnodes=2),
        check_pids=True,
        clock=lambda: t[0],
    )
    findings = mon.scan_once()
    assert [(f.rank, f.reason) for f in findings] == [(2, "rank_process_died_without_process_end")]
    mirrored = node0 / heartbeat_file_name(2, pid)
    assert json.loads(mirrored.read_text().splitlines()[-1])["exit"]["vanished"] is True
    relay.stop()
    assert mon.remote is not None and mon.remote.nodes_done() is True


def test_relay_carries_the_nodes_disk_state(
    tmp_path: Path, stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rankguard.relay.relay as relay_mod
    from rankguard.util.disk import DiskState

    master, client = stores
    write(tmp_path, rec(2, 0, os.getpid(), event="process_start"))
    relay = StoreRelay(client, tmp_path, RUN, node_rank=1, interval_s=0.05)
    source = StoreRemoteSource(master, RUN, nnodes=2)
    assert source.disks() == {}
    relay.push_once()
    source.fetch()
    disk = source.disks()[1]
    assert disk.full is False and disk.free_bytes and disk.total_bytes

    full = DiskState(full=True, free_bytes=0, total_bytes=1 << 20)
    monkeypatch.setattr(relay_mod, "disk_state", lambda path: full)
    relay.push_once()
    records, _ = source.fetch()
    assert source.disks() == {1: full}
    assert [r["rank"] for r in records] == [2]


def test_a_stopped_nodes_exits_are_not_failures(tmp_path: Path) -> None:
    """Node 1's launcher got SIGTERM: its relay says so at once, and node 0's monitor
    takes the exits of node 1's ranks (and of its own, whose collective broke) for the
    shutdown's doing, not for failures."""
    import os

    from rankguard.monitor.monitor import JobMonitor
    from tests.factories import DictStore, FakeClock, heartbeat_config

    run = "run-stop"
    node1, node0 = tmp_path / "n1", tmp_path / "n0"
    node1.mkdir()
    store = DictStore()
    relay = StoreRelay(store, node1, run, node_rank=1, interval_s=60.0)  # this process: rank 1
    source = StoreRemoteSource(store, run, nnodes=2)
    mon = JobMonitor(
        heartbeat_config(),
        node0,
        run,
        expected_world_size=2,
        remote=source,
        clock=FakeClock(0.0),
        check_pids=False,
    )
    base = {"run_id": run, "world_size": 2, "event": "heartbeat", "progress_seq": 3}
    (node0 / heartbeat_file_name(0, 100)).write_text(
        json.dumps({**base, "rank": 0, "pid": 100, "seq": 0, "node_rank": 0, "hostname": "a"})
        + "\n"
    )
    (node1 / heartbeat_file_name(1, os.getpid())).write_text(
        json.dumps(
            {**base, "rank": 1, "pid": os.getpid(), "seq": 0, "node_rank": 1, "hostname": "b"}
        )
        + "\n"
    )
    relay.push_once()
    mon.scan_once()
    relay.note_shutdown("SIGTERM")
    end = {"event": "process_end", "exit": {"clean": False, "exit_code": -15, "error": "x"}}
    with open(node1 / heartbeat_file_name(1, os.getpid()), "a") as fh:
        fh.write(
            json.dumps(
                {
                    **base,
                    "rank": 1,
                    "pid": os.getpid(),
                    "seq": 1,
                    "node_rank": 1,
                    "hostname": "b",
                    **end,
                }
            )
            + "\n"
        )
    with open(node0 / heartbeat_file_name(0, 100), "a") as fh:
        fh.write(
            json.dumps(
                {
                    **base,
                    "rank": 0,
                    "pid": 100,
                    "seq": 1,
                    "node_rank": 0,
                    "hostname": "a",
                    **end,
                    "exit": {"clean": False, "exit_code": 1, "error": "Connection closed by peer"},
                }
            )
            + "\n"
        )
    relay.push_once()
    assert mon.scan_once() == []
    assert mon.rules.rank_errors == 0, mon.rules.rank_errors
    assert source.shutdowns() == {1: "SIGTERM"}
    assert mon.status["state"] == "stopped"
    assert mon.rules.ranks[1].record is not None
    assert (
        mon.rules.ranks[1].record.exit.get("after_shutdown") == "node 1's launcher received SIGTERM"
    ), mon.rules.ranks[1].record.exit


def test_another_nodes_root_cause_reaches_node_0(tmp_path: Path) -> None:
    from tests.factories import DictStore

    store = DictStore()
    relay = StoreRelay(store, tmp_path, "run-rc", node_rank=1, interval_s=60.0)
    source = StoreRemoteSource(store, "run-rc", nnodes=2)
    relay.push_once()
    source.fetch()
    assert source.root_causes() == {}
    relay.note_root_cause(3, 4242)  # node 1's agent: rank 3 was killed by a signal
    relay.push_once()
    source.fetch()
    assert source.root_causes() == {1: (3, 4242)}
