"""Node 0 trusts a relayed disk state only while the relay keeps pushing."""

from __future__ import annotations

import json

from rankguard.relay.relay import StoreRemoteSource
from rankguard.schema.layout import StoreKeys
from tests.factories import DictStore, FakeClock

RUN = "run-relay-disk"
FULL = {"full": True, "free_bytes": 0, "total_bytes": 2 << 20, "error": None}


def _push(store: DictStore, seq: int, disk: dict[str, object]) -> None:
    # what a relay's push sets: its full records (unchanged here) and a tick with its
    # push count
    keys = StoreKeys(RUN)
    base = {"epoch": 1, "gen": 1, "records": [], "health": None, "disk": disk}
    store.set(keys.heartbeats(1), json.dumps(base))
    tick = {"epoch": 1, "gen": 1, "seq": seq, "disk": disk, "ranks": []}
    store.set(keys.tick(1), json.dumps(tick))


def test_a_full_disk_state_expires_when_its_relay_stops_pushing() -> None:
    store, clock = DictStore(), FakeClock(100.0)
    source = StoreRemoteSource(store, RUN, 2, disk_max_age_s=3.0, clock=clock)
    _push(store, 1, FULL)
    source.fetch()
    assert source.disks()[1].full
    clock.t += 2.0
    source.fetch()  # the same push again: the relay is quiet, not yet for too long
    assert source.disks()[1].full
    clock.t += 2.0
    source.fetch()
    stale = source.disks()[1]
    assert not stale.full
    assert stale.error == "no new push from node 1's relay for 4s"
    _push(store, 2, FULL)  # the relay pushes again: its word counts again
    source.fetch()
    assert source.disks()[1].full


def test_a_relay_that_keeps_pushing_keeps_its_disk_state() -> None:
    store, clock = DictStore(), FakeClock(100.0)
    source = StoreRemoteSource(store, RUN, 2, disk_max_age_s=3.0, clock=clock)
    for seq in range(10):
        _push(store, seq, FULL)
        source.fetch()
        clock.t += 1.0
    assert source.disks()[1].full
