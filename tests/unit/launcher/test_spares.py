"""Hot spares: the agents' entries in a real TCPStore, the status block node 0 builds from
them, and the rendezvous wrapper (no restart for a spare, a timeout waited out)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from rankguard.cli.status_render import elastic_lines
from rankguard.ft.config import FaultToleranceConfig
from rankguard.launcher.membership import SpareService
from rankguard.launcher.rendezvous import SpareKeeper, keep_alive_settings, round_tag
from rankguard.launcher.spares import (
    AgentRegistry,
    SpareWatch,
    elastic_status,
    full_round_without,
    lost_in_round,
    read_agents,
    waiting_agents,
)
from rankguard.monitor.lostnode import LostNode
from rankguard.schema.restarts import RestartEntry
from rankguard.schema.statusblocks import ElasticBlock, Replacement

pytestmark = pytest.mark.timeout(60)


def _store() -> TCPStore:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )


def test_entries_go_through_the_store_and_node0_tells_who_replaced_whom() -> None:
    store = _store()
    a, b, spare = (AgentRegistry(store, "r", max_nodes=2, agent=n) for n in ("h:1", "h:2", "h:3"))
    for reg in (a, b, spare):
        reg.waiting()
    a.joined(0, 2, "R1")
    b.joined(1, 2, "R1")
    agents = read_agents(store, "r")
    assert {x["agent"]: x["state"] for x in agents} == {
        "h:1": "training",
        "h:2": "training",
        "h:3": "waiting",
    }
    assert full_round_without(agents, "h:3", 2) and not full_round_without(agents, "h:1", 2)
    history: list[Replacement] = []
    first = elastic_status(
        agents, round_tag="R1", nodes=2, min_nodes=2, max_nodes=2, history=history
    )
    assert [s.agent for s in first.spares_waiting] == ["h:3"]
    assert (first.lost, first.replacements) == ((), ())

    # h:2 is lost; h:1 leaves its round and the spare joins the next one as node 1
    a.waiting()
    a.joined(0, 2, "R2")
    spare.joined(1, 2, "R2")
    status = elastic_status(
        read_agents(store, "r"), round_tag="R2", nodes=2, min_nodes=2, max_nodes=2, history=history
    )
    assert status.lost == ("h:2",) and status.spares_waiting == ()
    [rep] = status.replacements
    assert (rep.node, rep.spare, rep.replaced) == (1, "h:3", "h:2")
    again = elastic_status(
        read_agents(store, "r"), round_tag="R2", nodes=2, min_nodes=2, max_nodes=2, history=history
    )
    assert len(again.replacements) == 1  # found once
    assert ElasticBlock.from_dict(again.to_dict()) == again  # read back as written
    text = "\n".join(elastic_lines(status))
    assert "Nodes: 2 of 2:2, 0 spare(s) waiting" in text
    assert "replaced node 1: h:2 lost, spare h:3 took its place" in text
    assert waiting_agents(store, "r") == 0
    spare2 = AgentRegistry(store, "r", max_nodes=2, agent="h:4")
    spare2.waiting()
    assert waiting_agents(store, "r") == 1
    spare2.left()
    assert waiting_agents(store, "r") == 0


def test_a_shrunk_round_is_said() -> None:
    store = _store()
    a = AgentRegistry(store, "r", max_nodes=2, agent="h:1")
    a.waiting()
    a.joined(0, 1, "R2")
    status = elastic_status(
        read_agents(store, "r"), round_tag="R2", nodes=1, min_nodes=1, max_nodes=2, history=[]
    )
    assert (status.nodes, status.shrunk) == (1, True)
    assert "Nodes: 1 of 1:2 (shrunk)" in "\n".join(elastic_lines(status))


def test_a_store_that_is_gone_is_no_error_for_the_entries() -> None:
    class Gone:
        def add(self, *a: Any) -> int:
            raise RuntimeError("connection refused")

    reg = AgentRegistry(Gone(), "r", max_nodes=2, agent="h:1")
    reg.waiting()  # logged, not raised
    assert read_agents(Gone(), "r") == []


class Inner:
    """A rendezvous handler with a scripted sequence of outcomes."""

    def __init__(self, outcomes: list[Any], waiting: int = 1) -> None:
        self.outcomes = outcomes
        self.waiting = waiting
        self.calls = 0

    def next_rendezvous(self) -> RendezvousInfo:
        self.calls += 1
        out = self.outcomes.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    def num_nodes_waiting(self) -> int:
        return self.waiting

    def shutdown(self) -> bool:
        self.shut = True
        return True

    use_agent_store = True


def _info(rank: int, nodes: int, port: int = 7) -> RendezvousInfo:
    return RendezvousInfo(
        store=None,  # type: ignore[arg-type]
        rank=rank,
        world_size=nodes,
        bootstrap_store_info=RendezvousStoreInfo(master_addr="h", master_port=port),
    )


def test_a_full_group_is_not_restarted_for_a_waiting_spare_a_shrunk_one_is() -> None:
    store = _store()
    inner = Inner([_info(0, 2), _info(0, 1)])
    keeper = SpareKeeper(inner, AgentRegistry(store, "r", max_nodes=2, agent="h:1"))  # type: ignore[arg-type]
    info = keeper.next_rendezvous()
    assert round_tag(info) == "h:7"
    assert keeper.num_nodes_waiting() == 0  # full: whoever waits is a spare
    keeper.next_rendezvous()
    assert keeper.num_nodes_waiting() == 1  # shrunk: a node that comes is let in
    [entry] = read_agents(store, "r")
    assert (entry["state"], entry["node"], entry["nodes"], entry["rounds"]) == ("training", 0, 1, 2)


def test_a_spare_waits_on_past_the_join_timeout_while_a_full_round_trains() -> None:
    store = _store()
    for name, node in (("h:1", 0), ("h:2", 1)):
        reg = AgentRegistry(store, "r", max_nodes=2, agent=name)
        reg.waiting()
        reg.joined(node, 2, "R1")
    said: list[str] = []
    inner = Inner([RendezvousTimeoutError("join"), _info(1, 2)])
    keeper = SpareKeeper(
        inner,  # type: ignore[arg-type]
        AgentRegistry(store, "r", max_nodes=2, agent="h:3"),
        say=said.append,
    )
    assert keeper.next_rendezvous().rank == 1 and inner.calls == 2
    assert said and "waits on as a spare" in said[0]


def test_a_timeout_without_a_full_round_is_torchs_error() -> None:
    keeper = SpareKeeper(
        Inner([RendezvousTimeoutError("join")]),  # type: ignore[arg-type]
        AgentRegistry(_store(), "r", max_nodes=2, agent="h:1"),
    )
    with pytest.raises(RendezvousTimeoutError):
        keeper.next_rendezvous()


def test_a_closed_rendezvous_while_waiting_is_a_spare_not_needed() -> None:
    store = _store()
    keeper = SpareKeeper(
        Inner([RendezvousGracefulExitError("closed")]),  # type: ignore[arg-type]
        AgentRegistry(store, "r", max_nodes=2, agent="h:1"),
    )
    with pytest.raises(RendezvousGracefulExitError):
        keeper.next_rendezvous()
    assert keeper.left_waiting
    assert read_agents(store, "r")[0]["state"] == "left"


def test_a_failed_rendezvous_leaves_the_agents_entry_and_stops_its_beat() -> None:
    """The rendezvous closed below --nnodes MIN (or its store went away) while this
    agent waited: its run ends, so its entry no longer says waiting and no beat moves (the
    store's host, this agent or another, would otherwise wait for it as for a spare)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    store = _store()
    registry = AgentRegistry(store, "r", max_nodes=2, agent="h:1", keepalive_s=0.05)
    keeper = SpareKeeper(Inner([RendezvousClosedError()]), registry)  # type: ignore[arg-type]
    with pytest.raises(RendezvousClosedError):
        keeper.next_rendezvous()
    [entry] = read_agents(store, "r")
    assert entry["state"] == "left" and not keeper.left_waiting
    time.sleep(0.2)  # past a few keep-alive intervals
    assert read_agents(store, "r")[0]["beat"] == entry["beat"]
    registry.close()


def _trained_then_ended(store: TCPStore, names: tuple[str, ...] = ("h:1", "h:2")) -> None:
    """A full round of ``names`` trained; the first one's launcher ended (its shutdown
    marks the job's end before torch closes the rendezvous)."""
    keepers = []
    for node, name in enumerate(names):
        keeper = SpareKeeper(
            Inner([_info(node, len(names))]),  # type: ignore[arg-type]
            AgentRegistry(store, "r", max_nodes=len(names), agent=name),
        )
        keeper.next_rendezvous()
        keepers.append(keeper)
    assert keepers[0].shutdown() and keepers[0].inner.shut  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "error",
    [
        RendezvousClosedError(),  # torch had it on the wait list, not the redundancy list
        RendezvousConnectionError("the store is gone"),
        RendezvousTimeoutError("join"),
    ],
    ids=["closed", "store-gone", "timeout"],
)
def test_a_spare_that_learns_of_the_jobs_end_in_any_way_was_not_needed(
    error: Exception,
) -> None:
    store = _store()
    _trained_then_ended(store)
    inner = Inner([error])
    keeper = SpareKeeper(inner, AgentRegistry(store, "r", max_nodes=2, agent="h:3"))  # type: ignore[arg-type]
    with pytest.raises(RendezvousGracefulExitError) as raised:
        keeper.next_rendezvous()
    assert raised.value.__cause__ is error and keeper.left_waiting
    assert [a["state"] for a in read_agents(store, "r") if a["agent"] == "h:3"] == ["left"]
    assert keeper.shutdown() and not hasattr(inner, "shut")  # nothing left to close


def test_a_spare_that_saw_the_jobs_end_before_the_store_went_was_not_needed() -> None:
    """The end marker seen at a beat; the store's host gone before the spare's next
    rendezvous sync: a lost store after the job's end is the end, not a failure."""
    store = _store()
    registry = AgentRegistry(store, "r", max_nodes=2, agent="h:3", keepalive_s=0.05)
    inner = Inner([RendezvousConnectionError("the store is gone")])
    keeper = SpareKeeper(inner, registry)  # type: ignore[arg-type]
    registry.waiting()  # beats from here on
    _trained_then_ended(store)
    deadline = time.monotonic() + 10
    while not registry._job_ended:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    class Gone:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("connection refused")

    registry.store = Gone()
    with pytest.raises(RendezvousGracefulExitError):
        keeper.next_rendezvous()
    assert keeper.left_waiting
    registry.close()


@pytest.mark.parametrize(
    "error",
    [RendezvousClosedError(), RendezvousConnectionError("the store is gone")],
    ids=["closed", "store-gone"],
)
def test_without_the_jobs_end_a_closed_rendezvous_or_a_lost_store_is_an_error(
    error: Exception,
) -> None:
    """No agent that trained ended the job: a rendezvous id closed before this agent
    came, or the store lost mid-job, fails loudly (torch's error)."""
    store = _store()
    for node, name in enumerate(("h:1", "h:2")):  # training, not ended
        reg = AgentRegistry(store, "r", max_nodes=2, agent=name)
        reg.waiting()
        reg.joined(node, 2, "R1")
    keeper = SpareKeeper(Inner([error]), AgentRegistry(store, "r", max_nodes=2, agent="h:3"))  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        keeper.next_rendezvous()
    assert not keeper.left_waiting
    assert [a["state"] for a in read_agents(store, "r") if a["agent"] == "h:3"] == ["left"]


def test_a_signal_while_a_spare_waits_after_the_jobs_end_still_stops_it() -> None:
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    store = _store()
    _trained_then_ended(store)
    stop = SignalException("SIGTERM", signal.SIGTERM)
    keeper = SpareKeeper(Inner([stop]), AgentRegistry(store, "r", max_nodes=2, agent="h:3"))  # type: ignore[arg-type]
    with pytest.raises(SignalException):
        keeper.next_rendezvous()
    assert not keeper.left_waiting


def test_a_node_rejoining_its_group_when_the_job_ends_under_it_is_not_a_spare() -> None:
    """Node 1 trained, its group failed, and it waits for the next round when node 0's
    launcher ends the job: no full round trains without it, it is no spare."""
    store = _store()
    member = AgentRegistry(store, "r", max_nodes=2, agent="h:2")
    keeper = SpareKeeper(Inner([_info(1, 2), RendezvousClosedError()]), member)  # type: ignore[arg-type]
    keeper.next_rendezvous()
    node0 = SpareKeeper(Inner([_info(0, 2)]), AgentRegistry(store, "r", max_nodes=2, agent="h:1"))  # type: ignore[arg-type]
    node0.next_rendezvous()
    node0.shutdown()
    with pytest.raises(RendezvousClosedError):
        keeper.next_rendezvous()  # its group failed: it rejoins, the job is closed
    assert not keeper.left_waiting


def test_a_timeout_without_a_full_round_leaves_the_agents_entry() -> None:
    store = _store()
    keeper = SpareKeeper(
        Inner([RendezvousTimeoutError("join")]),  # type: ignore[arg-type]
        AgentRegistry(store, "r", max_nodes=2, agent="h:1"),
    )
    with pytest.raises(RendezvousTimeoutError):
        keeper.next_rendezvous()
    assert read_agents(store, "r")[0]["state"] == "left"


def test_a_store_host_never_numbered_waits_for_no_monitor_that_never_ran(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The job ended before its first round (the rendezvous closed below --nnodes MIN):
    no node 0 ever started a monitor, so the store's host lets the store go at once; once
    a monitor started, the host waits for it to say it finished."""
    from rankguard.launcher.run import _keep_store_for_monitor
    from rankguard.launcher.services import NodeServices
    from rankguard.schema.layout import StoreKeys

    store = _store()
    services = NodeServices.__new__(NodeServices)
    services.store, services.run_id, services.node_rank = store, "r", None
    t0 = time.monotonic()
    _keep_store_for_monitor(services)
    assert time.monotonic() - t0 < 1.0
    assert "keeping the rendezvous store" not in capsys.readouterr().err
    store.set(StoreKeys("r").monitor_started, b"1")
    done = threading.Timer(0.5, lambda: store.set(StoreKeys("r").monitor_done, b"1"))
    done.start()
    t0 = time.monotonic()
    _keep_store_for_monitor(services)
    done.join()
    assert 0.5 <= time.monotonic() - t0 < 5.0
    err = capsys.readouterr().err
    assert "keeping the rendezvous store" in err and "did not say" not in err


def test_keep_alive_settings_from_rdzv_conf() -> None:
    assert keep_alive_settings({}) == {}
    assert keep_alive_settings({"keep_alive_interval": "0.5", "keep_alive_max_attempt": "2"}) == {
        "keep_alive_interval": 0.5,
        "keep_alive_max_attempt": 2,
    }
    with pytest.raises(ValueError, match="keep_alive_interval: seconds in"):
        keep_alive_settings({"keep_alive_interval": "soon"})
    with pytest.raises(ValueError, match="keep_alive_max_attempt: a whole number >= 1"):
        keep_alive_settings({"keep_alive_max_attempt": "0"})


def test_a_waiting_agent_beats_and_stops_once_it_joins_a_round() -> None:
    store = _store()
    reg = AgentRegistry(store, "r", max_nodes=2, agent="h:1", keepalive_s=0.05)
    reg.waiting()
    deadline = time.monotonic() + 10
    while read_agents(store, "r")[0].get("beat", 0) < 3:
        assert time.monotonic() < deadline, read_agents(store, "r")
        time.sleep(0.02)
    assert read_agents(store, "r")[0]["keepalive_s"] == 0.05
    reg.joined(0, 2, "R1")
    time.sleep(0.2)  # the beat thread sees the round and ends
    beat = read_agents(store, "r")[0]["beat"]
    time.sleep(0.3)
    (entry,) = read_agents(store, "r")
    assert entry["state"] == "training" and entry["beat"] == beat
    assert reg._beater is None
    reg.waiting()  # its round ended: it waits (and beats) again
    deadline = time.monotonic() + 10
    while read_agents(store, "r")[0]["beat"] == beat:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    reg.close()


def test_node0_finds_a_spare_whose_beat_stopped_gone_on_its_own_clock() -> None:
    watch = SpareWatch(slack_s=1.0)

    def entry(name: str, beat: int, since: float = 100.0, state: str = "waiting") -> dict:
        return {"agent": name, "state": state, "beat": beat, "since": since, "keepalive_s": 5.0}

    # the spares' own clocks (``since``) say nothing here: only whether the beat moved
    assert watch.gone([entry("a", 0), entry("b", 0)], now=0.0) == set()
    assert watch.gone([entry("a", 3), entry("b", 0)], now=15.0) == set()  # 15 < 3*5+1
    assert watch.gone([entry("a", 4), entry("b", 0)], now=16.5) == {"b"}
    assert watch.gone([entry("a", 4), entry("b", 0)], now=40.0) == {"a", "b"}
    # b comes back to a new wait (a restarted agent re-enters: a new ``since``)
    assert watch.gone([entry("a", 9), entry("b", 0, since=200.0)], now=41.0) == set()
    # an agent that joined a round is not a spare; the watch forgets it
    assert watch.gone([entry("a", 9, state="training")], now=99.0) == set()
    assert "a" not in watch._seen


def test_a_spare_gone_is_listed_apart_not_counted_and_not_waited_for() -> None:
    store = _store()
    a, b = (AgentRegistry(store, "r", max_nodes=2, agent=n) for n in ("h:1", "h:2"))
    live, dead = (
        AgentRegistry(store, "r", max_nodes=2, agent=n, keepalive_s=0.05) for n in ("h:3", "h:4")
    )
    for reg in (a, b, live, dead):
        reg.waiting()
    a.joined(0, 2, "R1")
    b.joined(1, 2, "R1")
    dead.close()  # as a SIGKILL would: its beat stops, its entry stays "waiting"
    watch = SpareWatch(slack_s=0.1)
    t0 = time.monotonic()
    gone: set[str] = set()
    while not gone:
        assert time.monotonic() - t0 < 10
        time.sleep(0.05)
        gone = watch.gone(read_agents(store, "r"), time.monotonic())
    assert gone == {"h:4"}  # the live spare beats on
    status = elastic_status(
        read_agents(store, "r"),
        round_tag="R1",
        nodes=2,
        min_nodes=2,
        max_nodes=2,
        history=[],
        gone=gone,
    )
    assert [s.agent for s in status.spares_waiting] == ["h:3"]
    assert status.spares_gone == ("h:4",)
    text = "\n".join(elastic_lines(status))
    assert "Nodes: 2 of 2:2, 1 spare(s) waiting" in text
    assert "gone     h:4 (spare(s) whose keep-alive stopped while waiting" in text
    assert waiting_agents(store, "r") == 2 and waiting_agents(store, "r", gone) == 1
    live.close()


def test_a_store_host_that_is_not_node0_sees_a_dead_spare_itself_and_waits_for_a_live_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from types import SimpleNamespace

    from rankguard.launcher.membership import keep_store_for_spares
    from rankguard.launcher.run import _say

    store = _store()
    live, dead = (
        AgentRegistry(store, "r", max_nodes=2, agent=n, keepalive_s=0.1) for n in ("h:3", "h:4")
    )
    live.waiting()
    dead.waiting()
    dead.close()  # as a SIGKILL would: its beat stops, its entry stays "waiting"
    # node 1's services: node 0 computes spares_gone, here it is empty
    services = SimpleNamespace(store=store, run_id="r", spares_gone=set())
    t0 = time.monotonic()
    leaving = threading.Timer(1.0, live.left)  # the live spare sees the store closed
    leaving.start()
    keep_store_for_spares(services.store, services.run_id, services.spares_gone, _say, wait_s=5.0)
    took = time.monotonic() - t0
    leaving.join()
    live.close()
    assert 1.0 <= took < 4.0, took  # the live one waited for; the dead one found, not waited
    assert "spares still waiting" not in capsys.readouterr().err
    t0 = time.monotonic()
    keep_store_for_spares(
        services.store, services.run_id, services.spares_gone, _say, wait_s=0.1
    )  # nobody waits now: at once
    assert time.monotonic() - t0 < 1.0


def test_a_spare_that_never_leaves_is_waited_for_as_long_as_its_beat_may_take(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from types import SimpleNamespace

    from rankguard.launcher.membership import keep_store_for_spares
    from rankguard.launcher.run import _say

    store = _store()
    stuck = AgentRegistry(store, "r", max_nodes=2, agent="h:5", keepalive_s=0.3)
    stuck.waiting()  # beats on, never leaves
    services = SimpleNamespace(store=store, run_id="r", spares_gone=set())
    t0 = time.monotonic()
    keep_store_for_spares(services.store, services.run_id, services.spares_gone, _say, wait_s=0.2)
    took = time.monotonic() - t0
    stuck.close()
    assert 3 * 0.3 <= took < 5.0, took  # three beats' time at least, then it goes
    assert "spares still waiting in the rendezvous" in capsys.readouterr().err


def test_the_agents_a_round_lost_are_those_still_training_in_it() -> None:
    # node 0 (h:1) was lost; node 1 (h:2, this agent) and the spare (h:3) formed round
    # "b"; an agent of an older round and one that re-entered the rendezvous are not lost
    agents: list[dict[str, Any]] = [
        {"agent": "h:1", "state": "training", "round": "a", "node": 0},
        {"agent": "h:2", "state": "training", "round": "b", "node": 0},
        {"agent": "h:3", "state": "waiting"},
        {"agent": "h:4", "state": "training", "round": "z", "node": 1},
        {"agent": "h:5", "state": "waiting", "round": "a", "node": 1},
    ]
    assert [a["agent"] for a in lost_in_round(agents, "a", "h:2")] == ["h:1"]
    # this agent's own entry, not rewritten yet, is never lost
    agents[1] = {"agent": "h:2", "state": "training", "round": "a", "node": 1}
    assert [a["agent"] for a in lost_in_round(agents, "a", "h:2")] == ["h:1"]


class _Monitor:
    def __init__(self) -> None:
        self.lost: list[LostNode] = []

    def note_lost_node(self, lost: LostNode) -> None:
        self.lost.append(lost)


def _renumbered_0(reason: str) -> tuple[_Monitor, list[str]]:
    """Node 1 (h:2) of round h:7 restarts its group (``reason``); node 0 (h:1) never
    comes back; round h:8 numbers h:2 node 0 and its services move."""
    store = _store()
    lost = AgentRegistry(store, "r", max_nodes=2, agent="h:1")
    lost.waiting()
    lost.joined(0, 2, "h:7")
    spares = SpareService()
    spares._nproc_per_node = 2
    keeper = spares._keeper = SpareKeeper(
        Inner([_info(1, 2, port=7), _info(0, 2, port=8)]),  # type: ignore[arg-type]
        AgentRegistry(store, "r", max_nodes=2, agent="h:2"),
    )
    keeper.next_rendezvous()
    keeper.next_rendezvous()
    assert keeper.previous_round == "h:7"
    monitor, said = _Monitor(), []
    restart = RestartEntry(restart=1, cause="worker_failed", rank=3, reason=reason)
    node = SimpleNamespace(
        node_rank=0,
        monitor=monitor,
        store=store,
        run_id="r",
        services=SimpleNamespace(restarts=[restart]),
        say=said.append,
    )
    spares.move(node)  # type: ignore[arg-type]
    return monitor, said


def test_a_node_renumbered_0_names_the_agent_of_its_previous_round_that_did_not_come_back() -> None:
    monitor, said = _renumbered_0("peer_failure")
    [lost] = monitor.lost
    assert (lost.node, lost.agent, lost.ranks, lost.victim) == (0, "h:1", (0, 1), 3)
    assert lost.restart == "restart 1: worker_failed"
    assert said == [
        "node 0 of the previous round (agent h:1) did not come back: its agent left the "
        "rendezvous, its rank(s) 0-1 were lost with it; rank 3's failure was its echo"
    ]


def test_a_restart_not_for_a_peer_gone_names_no_lost_node() -> None:
    monitor, said = _renumbered_0("exception")
    assert monitor.lost == [] and said == []


def _stays_node_0(excluded: list[str]) -> tuple[_Monitor, list[str]]:
    """Node 0 (h:1) of round h:7 restarts its group (its peer went away); node 1 (h:2)
    never comes back, a spare (h:3) takes its place in round h:8 and h:1 stays node 0:
    its services go on (no move). ``excluded``: the nodes bad-node exclusion published."""
    from rankguard.launcher.exclusion import Exclusion, NodeExclusion
    from rankguard.launcher.membership import ExclusionService

    store = _store()
    exclusion = ExclusionService()
    exclusion.exclusion = NodeExclusion(
        FaultToleranceConfig(), run_id="r", run_dir=Path("."), min_nodes=1, max_nodes=3, store=store
    )
    for agent in excluded:
        host, _, pid = agent.partition(":")
        entry = Exclusion(trigger="restarts", hostname=host, pid=int(pid), node_rank=1, gpu=None)
        exclusion.exclusion._publish(entry)
    lost = AgentRegistry(store, "r", max_nodes=2, agent="h:2")
    lost.waiting()
    lost.joined(1, 2, "h:7")
    spare = AgentRegistry(store, "r", max_nodes=2, agent="h:3")
    spare.waiting()
    spares = SpareService()
    spares._nproc_per_node = 2
    keeper = spares._keeper = SpareKeeper(
        Inner([_info(0, 2, port=7), _info(0, 2, port=8)]),  # type: ignore[arg-type]
        AgentRegistry(store, "r", max_nodes=2, agent="h:1"),
    )
    keeper.next_rendezvous()
    keeper.next_rendezvous()
    spare.joined(1, 2, "h:8")
    assert keeper.previous_round == "h:7"
    monitor, said = _Monitor(), []
    restart = RestartEntry(restart=1, cause="worker_failed", rank=0, reason="peer_failure")
    node = SimpleNamespace(
        node_rank=0,
        monitor=monitor,
        store=store,
        run_id="r",
        services=SimpleNamespace(restarts=[restart], services=[spares, exclusion]),
        say=said.append,
    )
    spares.regrouped(node)  # type: ignore[arg-type]
    return monitor, said


def test_node_0_that_stays_node_0_names_the_agent_that_did_not_come_back() -> None:
    """The rendezvous, not a heartbeat timeout, says that node 1's ranks were lost."""
    monitor, said = _stays_node_0([])
    [gone] = monitor.lost
    assert (gone.node, gone.agent, gone.ranks, gone.victim) == (1, "h:2", (2, 3), 0)
    assert said == [
        "node 1 of the previous round (agent h:2) did not come back: its agent left the "
        "rendezvous, its rank(s) 2-3 were lost with it; rank 0's failure was its echo"
    ]


def test_a_node_excluded_from_the_job_is_not_named_lost() -> None:
    """Node 1 left on purpose (bad-node exclusion, published in the store): its
    exclusion is its finding; it is not a node lost."""
    monitor, said = _stays_node_0(["h:2"])
    assert monitor.lost == [] and said == []
