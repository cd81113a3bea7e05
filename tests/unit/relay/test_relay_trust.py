"""Node 0 reads only relayed data that parses: forged or malformed store values are
counted and skipped, per node, and never freeze or crash ingestion."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from rankguard.relay.relay import StoreRelay, StoreRemoteSource
from rankguard.schema.layout import StoreKeys
from rankguard.schema.payloads import MAX_KILL_TARGETS, PayloadError, parse_kill_request
from tests.factories import DictStore, heartbeat_record
from tests.factories import write_heartbeats as write

RUN = "run-trust"
KEYS = StoreKeys(RUN)
rec = partial(
    heartbeat_record, run_id=RUN, hostname="node-b", node_rank=1, world_size=4, gpu_token=None
)


def _relay(store: DictStore, run_dir: Path, node: int = 1) -> StoreRelay:
    run_dir.mkdir(parents=True, exist_ok=True)
    return StoreRelay(store, run_dir, RUN, node_rank=node, interval_s=0.05)


def test_bad_health_is_refused_and_the_nodes_generation_is_kept(tmp_path: Path) -> None:
    store, me = DictStore(), os.getpid()
    write(tmp_path, rec(2, 1, me))
    relay = _relay(store, tmp_path)
    relay.push_once()
    source = StoreRemoteSource(store, RUN, nnodes=2)
    records, _ = source.fetch_changed()
    assert [r.seq for r in records] == [1]  # type: ignore[union-attr]
    good = json.loads(store.data[KEYS.heartbeats(1)])
    forged = {**good, "gen": good["gen"] + 5, "health": {"gpus": 1}, "records": []}
    store.set(KEYS.heartbeats(1), json.dumps(forged))
    tick = json.loads(store.data[KEYS.tick(1)])
    store.set(KEYS.tick(1), json.dumps({**tick, "gen": forged["gen"], "seq": 99}))
    records, health = source.fetch_changed()
    assert records == [] and health == {}
    assert "health" in (source.last_ignored or "")
    # the relay's next real push still gets through: its generation was not frozen
    write(tmp_path, rec(2, 2, me, phase="eval"))
    relay.push_once()
    records, _ = source.fetch_changed()
    assert [r.seq for r in records] == [2]  # type: ignore[union-attr]


def test_deeply_nested_values_do_not_stop_other_nodes(tmp_path: Path) -> None:
    store, me = DictStore(), os.getpid()
    relay = _relay(store, tmp_path / "n2", node=2)
    write(tmp_path / "n2", rec(4, 1, me, node_rank=2))
    relay.push_once()
    store.set(KEYS.tick(1), "[" * 100_000)
    store.set(KEYS.heartbeats(1), '{"epoch": 1, "gen": 1, "records": ' + "[" * 100_000)
    source = StoreRemoteSource(store, RUN, nnodes=3)
    records, _ = source.fetch_changed()
    assert [r.rank for r in records] == [4]  # type: ignore[union-attr]
    assert source.ignored_rows >= 1
    store.set(KEYS.tick(1), json.dumps({"epoch": 1, "gen": 1, "ranks": []}))
    source.fetch_changed()  # the base is nested too deeply: skipped, no exception
    assert "nested too deeply" in (source.last_ignored or "")


def test_records_under_another_nodes_key_are_refused(tmp_path: Path) -> None:
    store, me = DictStore(), os.getpid()
    foreign = rec(0, 1, me, node_rank=0, event="process_end")
    write(tmp_path, foreign, rec(2, 1, me))
    _relay(store, tmp_path).push_once()
    sent = json.loads(store.data[KEYS.heartbeats(1)])
    tick = json.loads(store.data[KEYS.tick(1)])
    # the relay sends only its own node's records ...
    assert [r["rank"] for r in sent["records"]] == [2]
    assert [row[0] for row in tick["ranks"]] == [2]
    # ... but any client of the store can write node 1's keys: one adds node 0's rank 0
    forged = {**sent, "records": [foreign, *sent["records"]]}
    store.set(KEYS.heartbeats(1), json.dumps(forged))
    store.set(
        KEYS.tick(1), json.dumps({**tick, "ranks": [[0, *tick["ranks"][0][1:]], *tick["ranks"]]})
    )
    source = StoreRemoteSource(store, RUN, nnodes=2)
    records, _ = source.fetch_changed()
    assert [r.rank for r in records] == [2]  # type: ignore[union-attr]
    assert source.ignored_rows == 2  # the record, then its tick row
    assert 0 not in source._current


def test_kill_requests_are_deduplicated_and_capped() -> None:
    one = {"rank": 3, "pid": 4242}
    targets, dropped = parse_kill_request(json.dumps([one] * 3200 + [{**one, "kill": True}]))
    assert [(t.rank, t.pid, t.kill) for t in targets] == [(3, 4242, True)]
    assert dropped == 3200
    many = [{"rank": r, "pid": 10_000 + r} for r in range(MAX_KILL_TARGETS + 50)]
    targets, dropped = parse_kill_request(json.dumps([*many, {"rank": "x"}, 7]))
    assert len(targets) == MAX_KILL_TARGETS and dropped == 52
    for bad in ("{}", "[" * 100_000, "nope"):
        try:
            parse_kill_request(bad)
        except PayloadError:
            continue
        raise AssertionError(f"accepted {bad[:20]!r}")
