"""A relay reads one counter per push, not every request key: node 0 bumps it after
each request it writes (stop step, traces, kill), and the relay looks for the requests
themselves only when it moved (at 100,000 ranks, 12,500 relays' three checks a push
were most of the operations node 0's store served)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rankguard.ft.frremote import RemoteTraces
from rankguard.ft.kill import DumpPolicy, OwnedWorkers
from rankguard.relay.relay import StoreRelay, publish_control, request_kill
from rankguard.schema.layout import CONTROL_FILE, StoreKeys
from tests.factories import DictStore

RUN = "run-requests"


class OpStore(DictStore):
    """A store with ``add``, counting each operation by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.fail_gets = 0  # the next gets that raise (a lost connection)

    def set(self, key: str, value: Any) -> None:
        self.ops["set"] += 1
        super().set(key, value)

    def get(self, key: str) -> Any:
        self.ops["get"] += 1
        if self.fail_gets:
            self.fail_gets -= 1
            raise RuntimeError("connection reset")
        return super().get(key)

    def check(self, keys: list[str]) -> bool:
        self.ops["check"] += 1
        return super().check(keys)

    def delete_key(self, key: str) -> bool:
        self.ops["delete_key"] += 1
        return super().delete_key(key)

    def add(self, key: str, value: int) -> int:
        self.ops["add"] += 1
        self.data[key] = int(self.data.get(key, 0)) + value
        return int(self.data[key])

    def reads(self) -> int:
        return self.ops["add"] + self.ops["check"] + self.ops["get"]


def _relay(tmp_path: Path, store: OpStore) -> StoreRelay:
    return StoreRelay(
        store,
        tmp_path,
        RUN,
        node_rank=1,
        interval_s=60,
        dump_policy=DumpPolicy(method="faulthandler", timeout_s=1.0),
        workers=OwnedWorkers(),
    )


def test_a_push_without_a_request_reads_one_counter(tmp_path: Path) -> None:
    store = OpStore()
    relay = _relay(tmp_path, store)
    relay.push_once()  # the first push looks for requests written before it started
    assert relay.request_polls == 1
    store.ops.clear()
    for _ in range(5):
        relay.push_once()
    assert store.ops["add"] == 5 and store.reads() == 5  # one read a push, no check
    assert relay.request_polls == 1


def test_a_kill_request_is_still_served_at_the_next_push(tmp_path: Path) -> None:
    store = OpStore()
    relay = _relay(tmp_path, store)
    relay.push_once()
    relay.push_once()
    key = StoreKeys(RUN).kill(1)
    request_kill(store, RUN, 1, [{"rank": 0, "pid": -1, "kill": True}])
    relay.push_once()
    assert not store.check([key])  # taken off the store (and refused: not a worker)
    assert relay.request_polls == 2
    relay.push_once()
    assert relay.request_polls == 2  # nothing new: not looked for again


def test_the_stop_step_and_a_trace_request_move_the_counter(tmp_path: Path) -> None:
    store = OpStore()
    relay = _relay(tmp_path, store)
    relay.push_once()
    publish_control(store, RUN, 120, "preempted")
    relay.push_once()
    control = json.loads((tmp_path / CONTROL_FILE).read_text(encoding="utf-8"))
    assert control["stop_at_step"] == 120
    RemoteTraces(store, RUN, timeout_s=0.0).ask({1: [8]})
    assert store.check([StoreKeys(RUN).traces_request(1)])
    relay.push_once()
    assert not store.check([StoreKeys(RUN).traces_request(1)])  # answered
    assert store.check([StoreKeys(RUN).traces(1)])
    assert relay.request_polls == 3


def test_a_look_that_failed_is_made_again(tmp_path: Path) -> None:
    """A request the relay could not read (the store's connection dropped) is looked
    for again at the next push, though the counter did not move since."""
    store = OpStore()
    relay = _relay(tmp_path, store)
    relay.push_once()
    key = StoreKeys(RUN).kill(1)
    request_kill(store, RUN, 1, [{"rank": 0, "pid": -1, "kill": True}])
    store.fail_gets = 1
    relay.push_once()  # logged, not raised
    assert store.check([key])  # still waiting
    relay.push_once()
    assert not store.check([key])
    assert relay.request_polls == 3
