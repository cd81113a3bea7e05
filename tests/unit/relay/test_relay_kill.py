"""The relay serves kill requests from the store for its own node's workers only: a
forged ``kill/node/<k>`` naming any other pid is refused and logged."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from rankguard.ft.kill import DumpPolicy, OwnedWorkers
from rankguard.relay.relay import StoreRelay, request_kill
from rankguard.schema.layout import StoreKeys
from tests.factories import (
    STORE_CONNECT_TIMEOUT,
    Children,
    DictStore,
    alive,
    resolver_settings,
)

RUN = "run-forged"


def _relay(tmp_path: Path, store: DictStore, workers: OwnedWorkers | None) -> StoreRelay:
    return StoreRelay(
        store,
        tmp_path,
        RUN,
        node_rank=1,
        interval_s=60,
        dump_policy=DumpPolicy(method="faulthandler", timeout_s=1.0),
        workers=workers,
    )


def test_relay_refuses_forged_kill_requests(
    tmp_path: Path, children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    worker, stranger = children.start(), children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    store = DictStore()
    relay = _relay(tmp_path, store, workers)
    forged = [
        {"rank": 0, "pid": -1, "kill": True},
        {"rank": 1, "pid": 0, "kill": True},
        {"rank": 2, "pid": os.getpid(), "kill": True},  # the launcher (relay) itself
        {"rank": 3, "pid": stranger.pid, "kill": True},  # a child, not a worker
    ]
    caplog.set_level(logging.WARNING)
    for target in forged:
        request_kill(store, RUN, 1, [target])
        relay.push_once()
        assert not store.check([StoreKeys(RUN).kill(1)])  # consumed
    assert alive(stranger) and alive(worker)
    refused = [r.getMessage() for r in caplog.records if "refused to kill" in r.getMessage()]
    assert len(refused) == 4
    assert f"rank 3 (pid {stranger.pid})" in refused[3]
    assert not (tmp_path / "stacks").exists()  # nothing was even dumped
    assert not any("killed rank" in r.getMessage() for r in caplog.records)


def test_relay_without_the_agent_registry_kills_nothing(tmp_path: Path, children: Children) -> None:
    child = children.start()
    store = DictStore()
    relay = _relay(tmp_path, store, None)
    request_kill(store, RUN, 1, [{"rank": 0, "pid": child.pid, "kill": True}])
    relay.push_once()
    assert alive(child)


def test_relay_still_kills_its_worker(tmp_path: Path, children: Children) -> None:
    worker, stranger = children.start(), children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    store = DictStore()
    relay = _relay(tmp_path, store, workers)
    request_kill(
        store,
        RUN,
        1,
        [{"rank": 0, "pid": worker.pid, "kill": True}, {"rank": 1, "pid": stranger.pid}],
    )
    relay.push_once()
    # signalled (the dump signal alone ends this child: it has no dump handler)
    assert worker.wait(timeout=5) < 0
    assert alive(stranger)  # listed for a dump only, and not ours: no signal at all


def test_malformed_request_is_dropped(tmp_path: Path) -> None:
    store = DictStore()
    relay = _relay(tmp_path, store, OwnedWorkers())
    store.set(StoreKeys(RUN).kill(1), b"not json")
    relay.push_once()  # logged, not raised
    assert not store.check([StoreKeys(RUN).kill(1)])


def test_a_forged_request_set_by_another_client_of_a_real_store_is_refused(
    tmp_path: Path, children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    """What a client of the rendezvous store can do: set node 1's kill key (JSON text) for
    a process that is not one of node 1's workers. The relay, on its own client of a real
    ``TCPStore``, takes the request off the store, refuses it and keeps relaying."""
    from torch.distributed import TCPStore

    worker, stranger = children.start(), children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    host = TCPStore("127.0.0.1", 0, is_master=True, timeout=STORE_CONNECT_TIMEOUT)
    relay = _relay(
        tmp_path, TCPStore("127.0.0.1", host.port, timeout=STORE_CONNECT_TIMEOUT), workers
    )
    forger = TCPStore("127.0.0.1", host.port, timeout=STORE_CONNECT_TIMEOUT)
    key = StoreKeys(RUN).kill(1)
    forged = [
        {"rank": 1, "pid": stranger.pid, "kill": True},
        {"rank": 1, "pid": -1, "kill": True},
    ]
    caplog.set_level(logging.WARNING)
    forger.set(key, json.dumps(forged))
    relay.push_once()
    assert not forger.check([key])  # served
    assert alive(stranger) and alive(worker)
    refused = [r.getMessage() for r in caplog.records if "refused to kill" in r.getMessage()]
    assert refused[0].startswith(f"rankguard relay: refused to kill rank 1 (pid {stranger.pid})")
    assert refused[1].startswith("rankguard relay: refused to kill rank 1 (pid -1)")
    assert not any("killed rank" in r.getMessage() for r in caplog.records)
    relay.push_once()  # the next push goes on as before


def test_a_store_client_of_these_tests_outlasts_a_lost_dns_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's ``TCPStore`` client asks DNS for the name of ``::ffff:127.0.0.1`` before
    it connects; a lost answer costs glibc's resolver timeout per attempt. The clients
    above wait longer than all the attempts this machine's resolver makes, and longer
    than the most any ``resolv.conf`` can ask for one attempt."""
    timeout, attempts = resolver_settings()
    assert STORE_CONNECT_TIMEOUT.total_seconds() > timeout * attempts
    monkeypatch.delenv("RES_OPTIONS", raising=False)
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 10.0.0.1\noptions timeout:3 attempts:4 rotate\n")
    assert resolver_settings(conf) == (3.0, 4)
    conf.write_text("nameserver 10.0.0.1\noptions timeout:90 attempts:9\n")
    assert resolver_settings(conf) == (30.0, 5)  # glibc's caps
    assert resolver_settings(tmp_path / "none") == (5.0, 2)
    assert STORE_CONNECT_TIMEOUT.total_seconds() >= 30.0  # one attempt at glibc's cap
