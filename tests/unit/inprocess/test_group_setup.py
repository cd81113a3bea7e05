"""A round whose process group cannot be formed, with a real TCPStore (port 0, loopback)
and a stand-in for torch.distributed's group set-up: a timed-out rendezvous is a failed
round and the next round runs; an argument the group refuses, set-ups failing past
``hard_timeout`` and a store nobody can reach each end the call with one line."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from rankguard.inprocess import wrapper
from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.wrapper import InProcessRestartError, _Call, _default_store
from rankguard.rank.runenv import RunEnv

CFG = InProcessRestartConfig(
    enabled=True,
    soft_timeout=0.3,
    hard_timeout=0.8,
    monitor_thread_interval=0.1,
    heartbeat_interval=0.05,
    heartbeat_timeout=0.4,
    barrier_timeout=10,
    max_restarts_per_window=1000,
    backend="gloo",
)
TIMEOUT = "wait timeout after 2700ms, keys: /rankguard/inprocess/r/0/1/0/pg//0//cpu//0/1"


@pytest.fixture
def store() -> Any:
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


class FakeGroups:
    """torch.distributed as the wrapper uses it, with ``init_process_group`` answering
    from ``outcomes`` (an exception to raise, or None: formed), the last one repeated."""

    def __init__(self, *outcomes: BaseException | None, delay: float = 0.0) -> None:
        self.outcomes = list(outcomes)
        self.delay = delay
        self.calls = 0
        self.initialized = False

    def init_process_group(self, backend: str, **kwargs: Any) -> None:
        self.calls += 1
        time.sleep(self.delay)
        outcome = self.outcomes[min(self.calls, len(self.outcomes)) - 1]
        if outcome is not None:
            raise outcome
        self.initialized = True

    def is_initialized(self) -> bool:
        return self.initialized

    def destroy_process_group(self) -> None:
        self.initialized = False

    def namespace(self) -> SimpleNamespace:
        return SimpleNamespace(
            init_process_group=self.init_process_group,
            is_initialized=self.is_initialized,
            destroy_process_group=self.destroy_process_group,
            PrefixStore=lambda prefix, inner: (prefix, inner),
        )


def _run(
    store: Any,
    groups: FakeGroups,
    fn: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch,
    session: Any = None,
) -> tuple[_Call, Any]:
    """One wrapped call of ``fn`` by the only rank of a world of 1."""
    monkeypatch.setattr(wrapper, "_torch_dist", groups.namespace)

    def client() -> Any:
        return dist.TCPStore(
            "127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10)
        )

    env = RunEnv(run_id="r", rank=0, world_size=1, restart_count=0)
    call = _Call(fn, CFG, store_factory=client, session=session, on_hard_timeout=None, env=env)
    call.prefix = "rankguard/inprocess/r/0/1/"
    return call, call.run((), {})


def test_a_timed_out_group_rendezvous_is_a_failed_round_and_the_next_round_runs(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = FakeGroups(dist.DistStoreError(TIMEOUT), None)
    call, result = _run(store, groups, wrapper.restart_count, monkeypatch)
    assert result == 1 and groups.calls == 2  # fn ran once, in round 1
    info = call.info
    assert info.cause == "collective_error" and info.culprit == 0
    assert info.message is not None
    assert info.message.startswith("rank 0 could not form the process group of round 0: ")
    assert "DistStoreError: wait timeout after 2700ms" in info.message
    assert store.check(["rankguard/inprocess/r/0/1/0/failed"])  # a peer formed: it leaves


class PublishingSession:
    """The rank session as the wrapper drives it: what each heartbeat written on demand
    held, in order with the training function's rounds."""

    enabled = True
    current_phase = "train"

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.source: Callable[[], Any] | None = None

    def add_heartbeat_block(self, source: Callable[[], Any]) -> None:
        self.source = source

    def set_phase(self, name: str) -> None:
        pass

    def mark_recovered(self) -> None:
        pass

    def publish_heartbeat(self, timeout_s: float = 2.0) -> bool:
        assert self.source is not None
        last = self.source().last
        self.events.append(("published", None if last is None else (last.round, last.cause)))
        return True


def test_a_reentry_is_on_disk_before_the_round_runs(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed in the first moments of the round it re-entered (a lost rank a
    standby replaces) has written the re-entry in a heartbeat record: not left to the
    heartbeat thread's next beat."""
    session = PublishingSession()

    def fn() -> int:
        session.events.append(("round", wrapper.restart_count()))
        if wrapper.restart_count() == 0:
            raise RuntimeError("boom")
        return 1

    _, result = _run(store, FakeGroups(None), fn, monkeypatch, session)
    assert result == 1
    assert session.events == [("round", 0), ("published", (0, "exception")), ("round", 1)]


def test_set_ups_failing_past_hard_timeout_end_the_call_and_tell_the_others(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = RuntimeError("Gloo connectFullMesh failed with ... Connect timeout")
    groups = FakeGroups(refused, delay=0.1)
    ran: list[int] = []
    started = time.monotonic()
    with pytest.raises(InProcessRestartError) as raised:
        _run(store, groups, lambda: ran.append(1), monkeypatch)
    assert time.monotonic() - started < 5
    assert ran == [] and groups.calls >= 2
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "in-process restart abandoned: rank 0: the process group failed to form in every round for "
    )
    assert "> hard_timeout 0.8s; last: RuntimeError: Gloo connectFullMesh failed" in message
    last = groups.calls - 1
    assert store.get(f"rankguard/inprocess/r/0/1/{last + 1}/abandon").decode() in message


def test_an_argument_the_group_refuses_ends_the_call_at_once(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = FakeGroups(ValueError("Invalid rank -1"))
    with pytest.raises(
        InProcessRestartError,
        match=r"^in-process restart: the gloo process group cannot be set up: "
        r"ValueError: Invalid rank -1$",
    ):
        _run(store, groups, lambda: None, monkeypatch)
    assert groups.calls == 1


def test_a_store_nobody_listens_on_is_one_line_naming_the_address() -> None:
    with socket.socket() as sock:  # a port of this host that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = RunEnv(run_id="r", rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
    with pytest.raises(InProcessRestartError) as raised:
        _default_store(0.3, env)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"in-process restart: cannot reach the job's store at 127.0.0.1:{port} "
        "(MASTER_ADDR, MASTER_PORT) within 0.3s: DistNetworkError: "
    )


class GlooGroups:
    """torch.distributed's group set-up as the wrapper calls it, building a real gloo
    group (not the process's default one: two ranks of one test process)."""

    def __init__(self) -> None:
        self.group: Any = None
        self.sub_store: Any = None

    def init_process_group(self, backend: str, **kw: Any) -> None:
        self.group = dist.ProcessGroupGloo(kw["store"], kw["rank"], kw["world_size"], kw["timeout"])
        # as torch keeps the default group's store: on the C++ side only
        self.sub_store = dist.PrefixStore("new_group/", kw["store"])

    def namespace(self) -> SimpleNamespace:
        return SimpleNamespace(
            init_process_group=self.init_process_group, PrefixStore=dist.PrefixStore
        )


def _rank_of_two(store: Any, rank: int) -> _Call:
    env = RunEnv(run_id="r", rank=rank, world_size=2, restart_count=0)
    call = _Call(lambda: None, CFG, store_factory=None, session=None, on_hard_timeout=None, env=env)
    call.prefix = "rankguard/inprocess/r/0/1/"
    call._store = dist.TCPStore(
        "127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10)
    )
    return call


def test_a_rank_late_to_a_given_up_set_up_reads_no_address_and_fails_at_once(
    store: Any,
) -> None:
    """Rank 0's wait for rank 1's address timed out (rank 1 held up past the barrier);
    rank 1, going on, fails the round as it publishes its own: it reads no address of a
    rank that left, so it neither connects to nor waits for one (gloo's side of a pair
    that waits for the connection waits five times the group's timeout)."""
    first, late = _rank_of_two(store, 0), _rank_of_two(store, 1)
    assert first.pg_timeout == pytest.approx(1.0)
    given_up = first._form_group(GlooGroups().namespace())
    assert given_up is not None
    groups = GlooGroups()
    t0 = time.monotonic()
    report = late._form_group(groups.namespace())
    took = time.monotonic() - t0
    assert report is not None and groups.group is None
    assert report.message.startswith("rank 1 could not form the process group of round 0: ")
    assert "given up: rank 0 waited 1s" in report.message, report.message
    assert took < first.pg_timeout, took
    assert "given up: rank 0 waited 1s for the addresses of rank(s) [1]" in given_up.message


def test_ranks_on_time_form_the_group_through_the_decision(store: Any) -> None:
    import threading

    calls = [_rank_of_two(store, r) for r in range(2)]
    groups = [GlooGroups() for _ in calls]
    reports: list[Any] = [None, None]

    def form(r: int) -> None:
        reports[r] = calls[r]._form_group(groups[r].namespace())

    threads = [threading.Thread(target=form, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert reports == [None, None]
    assert store.get("rankguard/inprocess/r/0/1/0/setup/decision") == b"go"
    for g in groups:
        g.group = None


def test_a_new_group_on_the_rounds_store_forms_after_the_set_up(store: Any) -> None:
    """``dist.new_group`` (a checkpoint group, a data-parallel group) builds on the
    default group's store after the set-up returned: the set-up's store, written in
    Python, still answers (torch holds it on the C++ side only)."""
    import gc
    import threading

    calls = [_rank_of_two(store, r) for r in range(2)]
    groups = [GlooGroups() for _ in calls]
    formed: list[Any] = [None, None]

    def form(r: int) -> None:
        assert calls[r]._form_group(groups[r].namespace()) is None
        gc.collect()
        try:
            formed[r] = dist.ProcessGroupGloo(groups[r].sub_store, r, 2, timedelta(seconds=10))
        except Exception as exc:  # the assertion below names it
            formed[r] = exc

    threads = [threading.Thread(target=form, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(g, dist.ProcessGroupGloo) for g in formed), formed
    for g in groups:
        g.group = None
