"""What node 0's remote source asks of the store server per scan: round trips of
bounded size (TCPStore's server spends time quadratic in one request's size)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankguard.relay.relay import MULTI_GET_KEYS, StoreRelay, StoreRemoteSource
from tests.factories import DictStore

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
