"""When a peer missing at a re-entry barrier is gone: on evidence (its process exited, or
its store heartbeat silent past the bound with no rank on its host to see it), never
because a live rank is slow. Pure decisions on a fake clock, then the barrier itself
(``_Call._join``) on a real TCPStore (port 0, loopback) with real processes as peers."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.peers import Life, PeerWatch, ProcessId, silence_bound
from rankguard.inprocess.wrapper import InProcessRestartError, _Call
from rankguard.rank.runenv import RunEnv
from rankguard.util.procs import process_start_time

pytestmark = pytest.mark.timeout(60)

# the test script's timeouts: a heartbeat every 0.2 s, a peer silent 3 s was lost
SCRIPT_CFG = InProcessRestartConfig(
    enabled=True,
    soft_timeout=4,
    hard_timeout=20,
    monitor_thread_interval=0.1,
    heartbeat_interval=0.2,
    heartbeat_timeout=3.0,
    barrier_timeout=30,
)
# the barrier tests' (short, so that a test takes seconds)
CFG = InProcessRestartConfig(
    enabled=True,
    soft_timeout=1,
    hard_timeout=2.5,
    monitor_thread_interval=0.1,
    heartbeat_interval=0.05,
    heartbeat_timeout=0.4,
    barrier_timeout=10,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_silence_bound_is_the_hard_timeout_at_least_the_heartbeat_timeout() -> None:
    assert silence_bound(SCRIPT_CFG) == (20.0, "hard_timeout")
    cfg = replace(SCRIPT_CFG, heartbeat_timeout=30.0, heartbeat_interval=1.0)
    assert silence_bound(cfg) == (30.0, "heartbeat_timeout")


def test_a_heartbeat_late_past_heartbeat_timeout_is_no_evidence_of_a_death() -> None:
    """The CI failure: rank 0's heartbeat stood still 3+ s (its process held up while
    its main thread was stuck, short of its soft timeout) and its peer declared it lost
    with heartbeat_timeout=3; it came back a moment later."""
    clock = Clock()
    watch = PeerWatch(*silence_bound(SCRIPT_CFG), clock=clock)
    assert watch.verdict(0, 41, Life.UNKNOWN) is None
    clock.t += 8.0  # past heartbeat_timeout (3 s), within hard_timeout (20 s)
    assert watch.verdict(0, 41, Life.UNKNOWN) is None
    clock.t += 0.2
    assert watch.verdict(0, 42, Life.UNKNOWN) is None  # it beats again: the count moved
    clock.t += 19.9
    assert watch.verdict(0, 42, Life.UNKNOWN) is None
    clock.t += 0.2
    why = watch.verdict(0, 42, Life.UNKNOWN)
    assert why is not None
    assert why.startswith("store heartbeat stopped: silent 20.1s > hard_timeout 20s")


def test_a_live_process_is_never_gone_a_dead_one_at_once_one_never_seen_is_starting() -> None:
    clock = Clock()
    watch = PeerWatch(*silence_bound(SCRIPT_CFG), clock=clock)
    assert watch.verdict(1, 7, Life.ALIVE) is None
    clock.t += 3600.0  # stopped, starved, stuck: alive (barrier_timeout ends the wait)
    assert watch.verdict(1, 7, Life.ALIVE) is None
    assert watch.verdict(2, 0, Life.UNKNOWN) is None
    clock.t += 3600.0
    assert watch.verdict(2, 0, Life.UNKNOWN) is None  # never beat: still starting
    why = "its process (pid 9 on h) exited"
    assert watch.verdict(3, 5, Life.DEAD, why) == why  # no wait at all


def test_with_standbys_an_exited_peer_is_given_up_after_the_launchers_grace() -> None:
    """The launcher sees the exit too and says within heartbeat_timeout that a standby
    takes its place; until then the survivors do not give up on the rank."""
    clock = Clock()
    watch = PeerWatch(*silence_bound(SCRIPT_CFG), dead_grace=3.0, clock=clock)
    assert watch.verdict(1, 5, Life.DEAD, "exited") is None
    clock.t += 2.9
    assert watch.verdict(1, 5, Life.DEAD, "exited") is None
    clock.t += 0.2
    assert watch.verdict(1, 5, Life.DEAD, "exited") == "exited"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(10)


def _id_of(pid: int) -> ProcessId:
    me = ProcessId.own()
    assert me is not None
    start = process_start_time(pid)
    assert start is not None
    return ProcessId(me.host, me.machine, pid, start)


def _exited() -> ProcessId:
    proc = subprocess.Popen(["sleep", "0"])
    peer = _id_of(proc.pid)
    proc.wait(10)
    return peer


def test_a_process_is_checked_where_its_pid_means_something(
    sleeper: subprocess.Popen[bytes],
) -> None:
    me = ProcessId.own()
    assert me is not None
    alive = _id_of(sleeper.pid)
    assert ProcessId.from_json(alive.to_json()) == alive
    assert alive.check(me)[0] is Life.ALIVE
    life, why = _exited().check(me)
    assert life is Life.DEAD and "exited" in why
    reused = replace(alive, start=alive.start + 1)  # the pid now names another process
    assert reused.check(me)[0] is Life.DEAD
    assert alive.check(replace(me, machine="other-boot:1"))[0] is Life.UNKNOWN
    assert alive.check(replace(me, host="other-host"))[0] is Life.UNKNOWN
    assert alive.check(None)[0] is Life.UNKNOWN


@pytest.mark.parametrize(
    "text",
    [
        b"x" * 2000,
        b"[1]",
        b"{",
        b'{"host": "h", "machine": "m", "pid": "1", "start": 1}',
        b'{"host": "h", "machine": "m", "pid": -4, "start": 1}',
        b'{"host": 1}',
    ],
)
def test_an_identity_from_the_store_is_bounded_and_typed(text: bytes) -> None:
    assert ProcessId.from_json(text) is None


# ---- the barrier ----------------------------------------------------------------------


@pytest.fixture
def store() -> Any:
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


def _call(store: Any, rank: int, world: int) -> _Call:
    env = RunEnv(run_id="r", rank=rank, world_size=world, restart_count=0)
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    call = _Call(lambda: None, CFG, store_factory=None, session=None, on_hard_timeout=None, env=env)
    call._store = client
    call.prefix = "rankguard/inprocess/r/0/1/"
    return call


def _arrives_after(store: Any, rank: int, delay: float) -> threading.Thread:
    def peer() -> None:
        time.sleep(delay)
        _call(store, rank, 2)._join(1)

    t = threading.Thread(target=peer, daemon=True)
    t.start()
    return t


def _silent_peer(store: Any, call: _Call, rank: int, process: ProcessId | None) -> None:
    """A peer that beat (its count moved) and then stood still; its process published."""
    store.add(call._hb_key(rank), 3)
    if process is not None:
        store.set(call._proc_key(rank), process.to_json())


def test_a_live_peer_silent_past_every_bound_is_waited_for(
    store: Any, sleeper: subprocess.Popen[bytes]
) -> None:
    call = _call(store, 0, 2)
    _silent_peer(store, call, 1, _id_of(sleeper.pid))
    late = _arrives_after(store, 1, CFG.hard_timeout + 1.0)  # stopped or starved that long
    call._join(1)  # returns once it arrived
    late.join(10)


def test_a_peer_on_another_host_late_past_heartbeat_timeout_is_waited_for(
    store: Any, sleeper: subprocess.Popen[bytes]
) -> None:
    call = _call(store, 0, 2)
    _silent_peer(store, call, 1, replace(_id_of(sleeper.pid), host="elsewhere"))
    late = _arrives_after(store, 1, CFG.heartbeat_timeout * 3)  # within hard_timeout
    call._join(1)
    late.join(10)


def test_a_dead_peer_is_lost_at_once_and_ranks_of_other_hosts_learn_it(store: Any) -> None:
    call = _call(store, 0, 3)
    dead = _exited()
    _silent_peer(store, call, 1, dead)
    t0 = time.monotonic()
    with pytest.raises(InProcessRestartError) as err:
        call._join(1)
    took = time.monotonic() - t0
    assert took < CFG.heartbeat_timeout  # before any heartbeat bound: it exited
    assert f"rank(s) [1] cannot re-enter (rank 1: its process (pid {dead.pid} on " in str(err)
    assert "exited" in str(err)
    # a rank of another host cannot see the process: it reads what rank 0 saw
    remote = _call(store, 2, 3)
    assert remote.process is not None
    remote.process = replace(remote.process, host="elsewhere")
    assert remote._peer_life(1, 1) == (
        Life.DEAD,
        f"its process (pid {dead.pid} on {dead.host}) exited (seen by rank 0)",
    )


def test_a_peer_nobody_can_see_is_lost_when_its_heartbeat_stood_still_past_the_bound(
    store: Any,
) -> None:
    call = _call(store, 0, 2)
    _silent_peer(store, call, 1, None)  # no identity: its host is another, silent one
    t0 = time.monotonic()
    with pytest.raises(InProcessRestartError, match="store heartbeat stopped") as err:
        call._join(1)
    assert CFG.hard_timeout <= time.monotonic() - t0 < CFG.hard_timeout + 3
    assert "> hard_timeout 2.5s, no rank on its host to see its process" in str(err)
