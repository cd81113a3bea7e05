"""The wrapper's side of live recovery on a real TCPStore (port 0, loopback): a standby
takes its rank and joins the survivors' round, ending theirs first (on NCCL, that is
what aborts their communicators); survivors wait for a lost rank's replacement instead
of giving up on it."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.wrapper import InProcessRestartError, _Call
from rankguard.live.keys import REPLACING
from rankguard.live.plan import Assignment
from rankguard.live.roles import STANDBY_ENV, STANDBY_RANKS_ENV
from rankguard.rank.runenv import RunEnv

CFG = InProcessRestartConfig(
    enabled=True,
    soft_timeout=2,
    hard_timeout=5,
    monitor_thread_interval=0.1,
    heartbeat_interval=0.05,
    heartbeat_timeout=0.4,
    barrier_timeout=10,
)


@pytest.fixture
def store() -> Any:
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield master


def _client(store: Any) -> Any:
    return dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))


def _call(store: Any, rank: int, world: int) -> _Call:
    env = RunEnv(run_id="r", rank=rank, world_size=world, restart_count=0)
    call = _Call(
        lambda: None,
        CFG,
        store_factory=lambda: _client(store),
        session=None,
        on_hard_timeout=None,
        env=env,
    )
    call._store = _client(store)
    call.prefix = "rankguard/inprocess/r/0/1/"  # each process's first call, as in a job
    return call


@pytest.fixture(autouse=True)
def _worker_numbers_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper rewrites the worker's numbers in ``os.environ`` (a standby's, a
    promotion's): each test leaves them as it found them."""
    for name in (
        "RANK",
        "ROLE_RANK",
        "WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.setenv(name, "0")  # recorded (set or not) for the teardown
        monkeypatch.delenv(name)


def test_a_standby_takes_its_rank_and_ends_the_running_round(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.setenv(STANDBY_ENV, "1")
    monkeypatch.setenv("RANK", "4")
    call = _call(store, 4, 4)
    live = call.live
    assert live is not None and live.standby
    live.store = call._store
    survivors = _call(store, 0, 4)
    store.set(call.prefix + "round", "3")
    store.set(call._key(3, "ready"), "1")  # the survivors run round 3
    got = Assignment(
        rank=2, local_rank=2, lost_pid=11, standby_pid=live.pid, cause="x", fault_t=0.0
    )
    store.set(live.keys.assign(live.pid), got.to_json())
    assert call._take_rank(live)
    assert call.rank == 2 and os.environ["RANK"] == "2" and STANDBY_ENV not in os.environ
    assert store.get(call._key(3, "failed")) == b"2"  # their round ends (NCCL: aborted)
    assert call.round == 4
    assert survivors._newcomers(4) == [2]


def test_a_standby_not_needed_leaves(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.setenv(STANDBY_ENV, "1")
    call = _call(store, 4, 4)
    assert call.live is not None
    store.set(call.live.keys.finished, "1")
    assert not call._take_rank(call.live)


def _dead_peer(store: Any, call: _Call, rank: int) -> None:
    """A peer that was alive (its store heartbeat counted) and stopped."""
    store.add(call._hb_key(rank), 3)


def test_survivors_wait_for_a_replaced_rank(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.delenv(STANDBY_ENV, raising=False)
    call = _call(store, 0, 2)
    assert call.live is not None
    _dead_peer(store, call, 1)
    store.set(call.live.keys.lost(1), REPLACING)

    waiting: list[float | None] = []

    def newcomer() -> None:  # comes after the peer's heartbeat timeout
        time.sleep(CFG.heartbeat_timeout * 3)
        # meanwhile the survivor's heartbeats say it waits for a standby on its way (the
        # monitor then holds its re-entry to the barrier's bound, not the hard timeout)
        waiting.append(call.heartbeat_block().awaiting_standby_s)
        other = _call(store, 1, 2)
        other._join(1)

    assert call.heartbeat_block().awaiting_standby_s is None
    t = threading.Thread(target=newcomer)
    t.start()
    call._join(1)  # returns once the newcomer arrived
    t.join(timeout=10)
    assert waiting == [CFG.barrier_timeout]


def test_without_a_replacement_a_lost_peer_is_given_up(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.delenv(STANDBY_ENV, raising=False)
    call = _call(store, 0, 2)
    _dead_peer(store, call, 1)
    with pytest.raises(InProcessRestartError, match="store heartbeat stopped"):
        call._join(1)


def test_a_newcomer_without_the_state_yet_is_one_in_the_next_round_too(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round a standby joined failed before ``live_state`` (its group set-up, a
    peer's fault): in the next round it is still a newcomer, or the survivors would not
    bring it their state and it would train on from its own step."""
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.setenv(STANDBY_ENV, "1")
    monkeypatch.setenv("RANK", "2")
    call = _call(store, 2, 2)
    live = call.live
    assert live is not None
    live.store = call._store
    survivor = _call(store, 0, 2)
    store.set(call.prefix + "round", "3")
    got = Assignment(
        rank=1, local_rank=1, lost_pid=11, standby_pid=live.pid, cause="x", fault_t=0.0
    )
    store.set(live.keys.assign(live.pid), got.to_json())
    assert call._take_rank(live)
    assert call.round == 3 and survivor._newcomers(3) == [1]
    # round 3 fails before the state crossed; the survivor is at round 4's barrier
    store.set(call._key(4, "here/0"), "host")
    store.add(call._key(4, "arrived"), 1)
    call._join(4)
    assert survivor._newcomers(4) == [1]
    live.received = True  # round 4 brought it the state: a survivor from now on
    store.set(call._key(5, "here/0"), "host")
    store.add(call._key(5, "arrived"), 1)
    call._join(5)
    assert survivor._newcomers(5) == []


def test_survivors_go_on_without_a_dropped_rank_renumbered(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shrink_when_no_standby``: the launcher dropped rank 1 (no standby left); the
    survivors' barrier forms the round without it, ranks 0 and 2 as 0 and 1."""
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.delenv(STANDBY_ENV, raising=False)
    calls = [_call(store, r, 3) for r in (0, 2)]
    for call in calls:
        assert call.live is not None
        call.live.shrink = True
    _dead_peer(store, calls[0], 1)
    store.set(calls[0].live.keys.lost(1), "dropped 4242")  # type: ignore[union-attr]
    other = threading.Thread(target=calls[1]._join, args=(1,))
    other.start()
    calls[0]._join(1)
    other.join(timeout=10)
    assert [c.members for c in calls] == [[0, 2], [0, 2]]
    assert [c.group_rank for c in calls] == [0, 1]
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) in {("0", "2"), ("1", "2")}
    for call in calls:
        live = call.live
        assert live is not None
        assert (live.shrunk_round, live.dropped_pids) == (1, [4242])


def test_without_the_key_a_dropped_rank_is_not_left_behind(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STANDBY_RANKS_ENV, "1")
    monkeypatch.delenv(STANDBY_ENV, raising=False)
    call = _call(store, 0, 2)
    assert call.live is not None and not call.live.shrink
    _dead_peer(store, call, 1)
    store.set(call.live.keys.lost(1), "dropped 4242")
    with pytest.raises(InProcessRestartError, match=r"rank\(s\) \[1\] cannot re-enter"):
        call._join(1)
