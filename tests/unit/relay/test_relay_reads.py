"""What node 0's remote source asks of the store server per scan: round trips of
bounded size (TCPStore's server spends time quadratic in one request's size), and
only the ticks whose push may have come, every one after a push off schedule."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.relay.relay import MULTI_GET_KEYS, StoreRelay, StoreRemoteSource
from rankguard.schema.records import HeartbeatRecord
from tests.factories import DictStore, heartbeat_record

RUN = "run-reads"


class SizedStore(DictStore):
    """Records the number of keys of each ``multi_get``."""

    def __init__(self) -> None:
        super().__init__()
        self.multi_gets: list[int] = []

    def multi_get(self, keys: list[str]) -> list[Any]:
        self.multi_gets.append(len(keys))
        return [self.data[k] for k in keys]


def test_ticks_are_read_in_small_chunks(tmp_path: Path) -> None:
    """A job of 1,000 nodes: every tick is read, in multi_gets of at most 128 keys
    (in chunks of 4,096, a 100,000-rank job's reads cost the server ~0.4 s a scan)."""
    store = SizedStore()
    nnodes = 1000
    relays = [StoreRelay(store, tmp_path, RUN, node, 60.0) for node in range(1, nnodes)]
    for relay in relays:
        relay.push_once()
    source = StoreRemoteSource(store, RUN, nnodes)
    source.fetch_changed()  # every tick, then every node's full records
    assert sum(store.multi_gets) == 2 * (nnodes - 1)
    for relay in relays:
        relay.push_once()
    store.multi_gets.clear()
    source.fetch_changed()  # the ticks only
    assert MULTI_GET_KEYS <= 128
    assert store.multi_gets  # read with multi_get, not key by key
    assert max(store.multi_gets) <= MULTI_GET_KEYS
    assert sum(store.multi_gets) == nnodes - 1  # every node's tick, once
    assert len(store.multi_gets) == -(-(nnodes - 1) // MULTI_GET_KEYS)


class AddStore(SizedStore):
    """With ``add`` (the counters) and a record of the keys each ``multi_get`` read."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []

    def add(self, key: str, value: int) -> int:
        self.data[key] = int(self.data.get(key, 0)) + value
        return int(self.data[key])

    def multi_get(self, keys: list[str]) -> list[Any]:
        self.read.extend(keys)
        return super().multi_get(keys)


ME = os.getpid()  # a running pid: never synthesized as vanished
rec = partial(
    heartbeat_record,
    run_id=RUN,
    seq_step_ns=1_000_000_000,
    world_size=64,
    pid=ME,
    publisher_fields=True,
)


class FedRelay(StoreRelay):
    """A relay of one rank whose records are handed to it (instead of read from files)."""

    def __init__(self, store: Any, tmp: Path, node: int) -> None:
        super().__init__(store, tmp, RUN, node, INTERVAL)
        self.rank = node
        self.seq = 0

    def collect(self) -> None:
        self.offer(rec(self.rank, self.seq, node_rank=self.node_rank, hostname=f"n{self.rank}"))
        self.seq += 1


INTERVAL = 5.0


def _job(
    tmp_path: Path, nnodes: int
) -> tuple[AddStore, list[FedRelay], StoreRemoteSource, list[float]]:
    store = AddStore()
    relays = [FedRelay(store, tmp_path, n) for n in range(1, nnodes)]
    now = [0.0]
    source = StoreRemoteSource(store, RUN, nnodes, clock=lambda: now[0], push_interval_s=INTERVAL)
    return store, relays, source, now


def test_only_the_ticks_whose_push_is_due_are_read(tmp_path: Path) -> None:
    """Relays push every 5 s, each at its own phase; node 0 scans every second. Each
    push is seen at the first scan after it, and node 0 reads each tick about twice an
    interval, not at every scan."""
    store, relays, source, now = _job(tmp_path, 9)
    phase = {r.node_rank: 0.3 + 0.55 * r.node_rank for r in relays}  # in (0, 5)
    next_push = dict(phase)
    latest: dict[int, int] = {}
    scans = 60
    for scan in range(1, scans + 1):
        for relay in relays:  # the pushes since the last scan, at their phase
            while next_push[relay.node_rank] <= scan:
                relay.push_once()
                next_push[relay.node_rank] += INTERVAL
        now[0] = float(scan)
        reads_before = len(store.read)
        for record in source.fetch_changed()[0]:
            assert isinstance(record, HeartbeatRecord)
            latest[record.rank] = record.seq
        assert latest == {r.rank: r.seq - 1 for r in relays if r.seq}, scan  # seen at once
        if scan > 2 * INTERVAL:
            assert len(store.read) - reads_before < len(relays)  # never every tick
    steady = source.ticks_read / (len(relays) * scans / INTERVAL)
    assert steady < 2.7  # reads per node per push (every tick at every scan: 5)
    assert all(r.errors == 0 for r in relays)


def test_an_early_push_is_read_at_the_next_scan(tmp_path: Path) -> None:
    """A push off the relay's schedule (its launcher stops the workers; its last, at
    stop) bumps the early-push counter: node 0 reads every tick at the next scan."""
    store, relays, source, now = _job(tmp_path, 4)
    for at, push in ((1.0, True), (2.0, False), (3.0, True)):
        if push:
            for relay in relays:
                relay.push_once()
        now[0] = at  # first sight; a read that dates the next push; that push
        source.fetch_changed()
    now[0] = 4.0
    store.read.clear()
    assert source.fetch_changed()[0] == []
    assert store.read == []  # no push due before 6.5 s: nothing read
    relays[1].note_shutdown("SIGTERM")
    relays[1].push_once()  # what the woken relay thread does
    now[0] = 5.0
    source.fetch_changed()
    assert source.shutdowns() == {2: "SIGTERM"}
    assert len(store.read) >= len(relays)  # every tick
    relays[2].stop()  # the last push, off the schedule
    now[0] = 6.0
    got = [r for r in source.fetch_changed()[0] if isinstance(r, HeartbeatRecord)]
    assert [(r.rank, r.seq) for r in got] == [(3, relays[2].seq - 1)]


def test_without_an_interval_or_add_every_tick_is_read_at_every_scan(tmp_path: Path) -> None:
    store = SizedStore()  # no add
    relays = [StoreRelay(store, tmp_path, RUN, n, INTERVAL) for n in range(1, 4)]
    for relay in relays:
        relay.push_once()
    now = [0.0]
    source = StoreRemoteSource(store, RUN, 4, clock=lambda: now[0], push_interval_s=INTERVAL)
    for scan in range(1, 6):
        now[0] = float(scan)
        source.fetch_changed()
    assert source.ticks_read == 5 * 3
    with pytest.raises(ValueError, match="push_interval_s"):
        StoreRemoteSource(store, RUN, 4, push_interval_s=0.0)
