"""Live recovery across nodes, pure logic and the store: which node is lost
(:func:`lost_nodes`), whose standbys take its ranks (:func:`decide_takeover`), the
records on the way in, node 0's keys (:class:`NodeWatch`) and a survivor's wait said in
the store (:meth:`LiveLink.replacing`)."""

from __future__ import annotations

import json

import pytest

from rankguard.live.keys import REPLACING, LiveKeys
from rankguard.live.link import LiveLink
from rankguard.live.nodes import NodeWatch
from rankguard.live.plan import (
    Claim,
    NodeView,
    claims_from_json,
    claims_to_json,
    decide_takeover,
    lost_nodes,
)
from tests.factories import DictStore

KEYS = LiveKeys("r1", 0)
NOW = 1000.0


def _views(*waiting: int, silent: int = 2, t_silent: float = NOW - 5) -> dict[int, NodeView]:
    """One view per node (one rank each: rank = node), node ``silent`` last seen at
    ``t_silent``, the others now."""
    return {
        n: NodeView(n, t_silent if n == silent else NOW, w, {n: 100 + n}, f"h{n}")
        for n, w in enumerate(waiting)
    }


def test_a_silent_node_whose_ranks_the_survivors_await_is_lost() -> None:
    views = _views(1, 1, 1)
    awaited = {2: NOW - 0.5}
    assert lost_nodes(views, awaited, now=NOW, silent_s=1.5, awaited_s=2.0) == [2]
    # its ranks still train (nobody waits for them), or the wait is old: not lost
    assert lost_nodes(views, {}, now=NOW, silent_s=1.5, awaited_s=2.0) == []
    stale = {2: NOW - 3}
    assert lost_nodes(views, stale, now=NOW, silent_s=1.5, awaited_s=2.0) == []
    # a launcher heard from within silent_s is not lost, whatever the survivors wait for
    fresh = _views(1, 1, 1, t_silent=NOW - 1)
    assert lost_nodes(fresh, awaited, now=NOW, silent_s=1.5, awaited_s=2.0) == []


def test_the_lost_nodes_ranks_go_to_the_other_nodes_waiting_standbys_in_order() -> None:
    views = {
        0: NodeView(0, NOW, 1, {0: 100}),
        1: NodeView(1, NOW, 2, {1: 101}),
        2: NodeView(2, NOW - 5, 1, {2: 102, 3: 103, 4: 104}, "h2"),
    }
    got = decide_takeover(views[2], views, now=NOW, silent_s=1.5, declared=True)
    assert got.refused is None
    assert {n: [c.rank for c in cs] for n, cs in got.claims.items()} == {0: [2], 1: [3, 4]}
    assert got.claims[1][0] == Claim(3, 103, 2, NOW - 5, "h2")  # its last view: the fault


def test_too_few_standbys_or_no_declared_state_refuse_with_one_reason() -> None:
    views = _views(1, 0, 1)  # node 2 lost; one standby waits on node 0
    views[2] = NodeView(2, NOW - 5, 1, {2: 102, 3: 103})
    got = decide_takeover(views[2], views, now=NOW, silent_s=1.5, declared=True)
    assert got.claims == {}
    assert got.refused == "node 2's rank(s) 2, 3 lost and 1 standby(s) waiting on the other nodes"
    # a node silent too does not count its standbys
    views = _views(1, 1, 1)
    views[1] = NodeView(1, NOW - 5, 1, {1: 101})
    got = decide_takeover(views[2], views, now=NOW, silent_s=1.5, declared=True)
    assert got.claims == {0: [Claim(2, 102, 2, NOW - 5, "h2")]}
    got = decide_takeover(views[2], _views(1, 1, 1), now=NOW, silent_s=1.5, declared=False)
    assert got.claims == {} and "declares no live state" in (got.refused or "")


def test_the_records_round_trip_and_bad_ones_are_refused() -> None:
    view = NodeView(1, NOW, 2, {3: 33, 4: 44}, "h1")
    assert NodeView.from_json(view.to_json()) == view
    claims = [Claim(3, 33, 1, NOW, "h1")]
    assert claims_from_json(claims_to_json(claims)) == claims
    for bad in ("[]", '{"node": 1}', json.dumps({**json.loads(view.to_json()), "waiting": -1})):
        with pytest.raises(ValueError):
            NodeView.from_json(bad)
    for bad in ("{}", '[{"rank": -1, "lost_pid": 1, "lost_node": 0, "fault_t": 0}]', "x" * 70000):
        with pytest.raises(ValueError):
            claims_from_json(bad)


def _watch(node: int, store: DictStore, clock: list[float], nnodes: int = 3) -> NodeWatch:
    return NodeWatch(KEYS, node, nnodes, hostname=f"h{node}", clock=lambda: clock[0])


def test_node_0_takes_a_lost_node_over_through_the_store() -> None:
    store, clock = DictStore(), [NOW]
    watches = [_watch(n, store, clock) for n in range(3)]
    for n, w in enumerate(watches):
        w.publish(store, waiting=1, ranks={n: 100 + n})
    clock[0] = NOW + 2.0  # node 2 silent 2 s; nodes 0 and 1 go on
    for w in watches[:2]:
        w.publish(store, waiting=1, ranks={w.node: 100 + w.node})
    assert watches[0].decide(store, declared=lambda: True, stopping=None) == []  # nobody waits
    store.set(KEYS.awaited(2), f"{NOW + 1.9:.3f}")
    clock[0] += 0.3
    (line,) = watches[0].decide(store, declared=lambda: True, stopping=None)
    assert line.startswith("live recovery: node 2 lost (its launcher silent 2.3 s")
    assert "(node 0: rank(s) 2); no group restart" in line
    assert store.get(KEYS.lost(2)) == REPLACING
    assert json.loads(store.get(KEYS.taken(2))) == [2]
    assert watches[0].taken_over(store, 2) and not watches[1].taken_over(store)
    assert watches[1].claims(store) == []
    (claim,) = watches[0].claims(store)
    assert (claim.rank, claim.lost_pid, claim.lost_node, claim.hostname) == (2, 102, 2, "h2")
    assert watches[0].claims(store) == []  # handed out once
    clock[0] += 1.0  # decided once
    assert watches[0].decide(store, declared=lambda: True, stopping=None) == []


def test_not_enough_standbys_writes_nothing_and_says_so_once() -> None:
    store, clock = DictStore(), [NOW]
    watches = [_watch(n, store, clock, nnodes=2) for n in range(2)]
    watches[0].publish(store, waiting=0, ranks={0: 100})
    watches[1].publish(store, waiting=1, ranks={1: 101})
    clock[0] = NOW + 2.0
    watches[0].publish(store, waiting=0, ranks={0: 100})
    store.set(KEYS.awaited(1), f"{NOW + 1.9:.3f}")
    before = dict(store.data)
    (line,) = watches[0].decide(store, declared=lambda: True, stopping=None)
    assert line == (
        "live recovery cannot apply: node 1's rank(s) 1 lost and 0 standby(s) waiting on "
        "the other nodes: today's path (the group restart, a hot spare or shrink)"
    )
    assert store.data == before  # nothing written: the survivors give up, today's path
    clock[0] += 1.0
    assert watches[0].decide(store, declared=lambda: True, stopping=None) == []


def test_another_nodes_recoveries_reach_node_0_in_order() -> None:
    store, clock = DictStore(), [NOW]
    node0, node1 = _watch(0, store, clock, 2), _watch(1, store, clock, 2)
    node1.publish_entry(store, {"lost_rank": 1, "standby_pid": 7})
    node1.publish_entry(store, {"lost_rank": 1, "standby_pid": 8})
    node0.publish_entry(store, {"lost_rank": 0})  # node 0 writes its own
    assert [e["standby_pid"] for e in node0.collect(store)] == [7, 8]
    node1.publish_entry(store, {"lost_rank": 1, "standby_pid": 9})
    assert node0.collect(store) == []  # looked 0 s ago
    clock[0] += 0.5
    assert [e["standby_pid"] for e in node0.collect(store)] == [9]
    assert node1.collect(store) == []
    store.set(KEYS.entry(1, 3), "not json")  # not one of ours: skipped, said in the log
    store.set(KEYS.entry(1, 4), json.dumps({"lost_rank": 1, "standby_pid": 10}))
    clock[0] += 0.5
    assert [e["standby_pid"] for e in node0.collect(store)] == [10]


def test_a_survivor_says_in_the_store_that_it_waits_for_a_missing_rank() -> None:
    store = DictStore()
    link = LiveLink(KEYS, standby=False, pid=5)
    assert link.replacing(store, 3) is False
    assert not store.check([KEYS.awaited(3)])  # the first round: rank 3 may be starting
    link.current_round = 1
    assert link.replacing(store, 3) is False
    first = float(store.get(KEYS.awaited(3)))
    store.set(KEYS.lost(3), REPLACING.encode())  # a TCPStore's get: bytes
    assert link.replacing(store, 3) is True
    assert float(store.get(KEYS.awaited(3))) == first  # at most every AWAITED_EVERY_S
