"""The relay's change-only protocol: ticks every push, full records on change; node 0
rebuilds exactly the relay's records whatever it missed."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.relay.delta import TICK_FIELDS, VOLATILE_FIELDS, RecordPatcher, tick_row
from rankguard.relay.relay import StoreRelay, StoreRemoteSource
from rankguard.schema.layout import StoreKeys
from rankguard.schema.records import HeartbeatRecord, RecordError
from tests.factories import DictStore, heartbeat_record

RUN = "run-delta"
ME = os.getpid()  # a running pid: never synthesized as vanished

rec = partial(
    heartbeat_record,
    run_id=RUN,
    seq_step_ns=1_000_000_000,
    hostname="node-b",
    node_rank=1,
    ranks_per_node=2,
    world_size=4,
    pid=ME,
    publisher_fields=True,
    main_frame="train.py:1 in step",
)


class SimRelay(StoreRelay):
    """A relay fed records directly (what ``collect`` would read from files)."""

    def __init__(self, store: Any, tmp: Path, node: int = 1) -> None:
        super().__init__(store, tmp, RUN, node_rank=node, interval_s=60.0)
        self.pending: list[dict[str, Any]] = []

    def collect(self) -> None:
        for raw in self.pending:
            self.offer(raw)
        self.pending = []

    def push(self, *records: dict[str, Any]) -> None:
        self.pending.extend(records)
        self.push_once()
        assert self.errors == 0


class CountingStore(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.sets: list[str] = []
        self.multi_gets = 0

    def set(self, key: str, value: Any) -> None:
        self.sets.append(key)
        super().set(key, value)

    def multi_get(self, keys: list[str]) -> list[Any]:
        self.multi_gets += 1
        return [self.data[k] for k in keys]


def _by_rank(records: list[Any]) -> dict[int, HeartbeatRecord]:
    return {r.rank: r for r in records if isinstance(r, HeartbeatRecord)}


def test_full_records_only_when_more_than_the_volatile_fields_changed(tmp_path: Path) -> None:
    store = CountingStore()
    relay = SimRelay(store, tmp_path)
    keys = StoreKeys(RUN)
    relay.push(rec(2, 0, event="process_start"), rec(3, 0, event="process_start"))
    relay.push(rec(2, 1), rec(3, 1))  # event changed: full records again
    assert relay.base_pushes == 2
    for seq in range(2, 6):  # steps, clocks, frames move: ticks only
        relay.push(
            rec(2, seq, progress_seq=seq, since=0.1 * seq, main_frame=f"train.py:{seq} in step"),
            rec(3, seq, progress_seq=seq),
        )
    assert relay.base_pushes == 2
    assert store.sets.count(keys.heartbeats(1)) == 2
    assert store.sets.count(keys.tick(1)) == 6
    relay.push(rec(2, 6, phase="eval"), rec(3, 6))  # a phase change: full records
    assert relay.base_pushes == 3
    tick = json.loads(store.data[keys.tick(1)])
    assert len(tick["ranks"][0]) == len(TICK_FIELDS)
    assert tick["gen"] == 3 and tick["epoch"] == relay.epoch


def test_node0_rebuilds_exactly_the_relays_records(tmp_path: Path) -> None:
    store = CountingStore()
    relay = SimRelay(store, tmp_path)
    source = StoreRemoteSource(store, RUN, nnodes=2)
    sent: dict[int, dict[str, Any]] = {}
    for seq in range(1, 9):  # (a monotonic_ns of 0 is written as absent)
        batch = [
            rec(r, seq, progress_seq=seq // 2, since=0.5 * (seq % 2), phase_elapsed=seq)
            for r in (2, 3)
        ]
        if seq == 5:
            batch[0]["perf"] = {"step_time_ms": 12.5}
        relay.push(*batch)
        sent = {r["rank"]: r for r in batch}
        got = _by_rank(source.fetch_changed()[0])
        for rank, raw in sent.items():
            want = HeartbeatRecord.from_dict(raw)
            have = got[rank]
            assert (have.relayed_age_s is not None) == bool(want.monotonic_ns)
            have.relayed_age_s = None  # the relay adds the age it measured
            assert have == want, (seq, rank)
    assert source.fetch_changed()[0] == []  # nothing new: nothing returned
    assert store.multi_gets >= 8


def test_missed_pushes_lose_nothing(tmp_path: Path) -> None:
    """Node 0 reads after several pushes it did not see, among them a full-record change
    (a process_end): the keys hold the latest state, not a diff against what it saw."""
    store = DictStore()
    relay = SimRelay(store, tmp_path)
    source = StoreRemoteSource(store, RUN, nnodes=2)
    relay.push(rec(2, 0, event="process_start"))
    assert _by_rank(source.fetch_changed()[0])[2].seq == 0
    relay.push(rec(2, 1))
    relay.push(rec(2, 2, progress_seq=9))
    end = {"clean": True, "exit_code": 0, "error": None}
    relay.push(rec(2, 3, progress_seq=9, event="process_end", exit=end))
    relay.push(rec(2, 4, progress_seq=9))  # a late line after the end: ignored by the relay
    got = _by_rank(source.fetch_changed()[0])[2]
    assert (got.event.value, got.seq, got.progress_seq, got.exit) == ("process_end", 3, 9, end)


def test_a_tick_older_than_the_full_records_is_not_laid_over_them(tmp_path: Path) -> None:
    """Node 0 read the tick of generation g, then the full records of generation g + 1
    (the relay pushed in between): it keeps the newer full records."""
    store = DictStore()
    relay = SimRelay(store, tmp_path)
    source = StoreRemoteSource(store, RUN, nnodes=2)
    keys = StoreKeys(RUN)
    relay.push(rec(2, 0, event="process_start"))
    source.fetch_changed()
    relay.push(rec(2, 1))
    stale_tick = store.data[keys.tick(1)]
    relay.push(rec(2, 2, phase="eval"))
    store.data[keys.tick(1)] = stale_tick  # as if read before the last push
    got = _by_rank(source.fetch_changed()[0])[2]
    assert (got.seq, got.phase) == (2, "eval")
    store.data[keys.tick(1)] = json.dumps(json.loads(stale_tick))  # bytes differ, same gen
    assert source.fetch_changed()[0] == []


def test_a_restarted_relay_starts_a_new_epoch(tmp_path: Path) -> None:
    """A relay that restarts counts its generations from 1 again: its new epoch keeps
    node 0 from laying its ticks over the old relay's records of the same generation."""
    store = DictStore()
    source = StoreRemoteSource(store, RUN, nnodes=2)
    old = SimRelay(store, tmp_path)
    old.push(rec(2, 0, event="process_start"))
    old.push(rec(2, 1, phase="old"))
    assert _by_rank(source.fetch_changed()[0])[2].phase == "old"
    new = SimRelay(store, tmp_path)
    new.epoch = old.epoch + "-restarted"
    new.push(rec(2, 0, pid=ME + 1, event="process_start", phase="setup"))
    new.push(rec(2, 1, pid=ME + 1, phase="setup"))  # generation 2, as the old one's
    got = _by_rank(source.fetch_changed()[0])[2]
    assert (got.pid, got.phase, got.seq) == (ME + 1, "setup", 1)


def test_a_node_that_drops_out_ages_on_node0(tmp_path: Path) -> None:
    """A node that stops pushing changes nothing in the store: node 0 gets no new
    record, so its ranks' heartbeats age into a process timeout as without the relay."""
    from rankguard.monitor.monitor import JobMonitor
    from tests.factories import FakeClock, heartbeat_config

    store = DictStore()
    relay = SimRelay(store, tmp_path / "n1")
    (tmp_path / "n0").mkdir()
    (tmp_path / "n1").mkdir()
    clock = FakeClock(100.0)
    mon = JobMonitor(
        heartbeat_config(),
        tmp_path / "n0",
        RUN,
        expected_world_size=4,
        remote=StoreRemoteSource(store, RUN, nnodes=2),
        clock=clock,
        check_pids=False,
    )
    live = partial(rec, publisher_fields=False)  # no monotonic_ns: no relayed age
    assert not mon.scan_once()
    relay.push(live(2, 0, event="process_start"), live(3, 0, event="process_start"))
    assert not mon.scan_once()
    for seq in range(1, 4):
        clock.t += 1.0
        relay.push(live(2, seq, progress_seq=seq), live(3, seq, progress_seq=seq))
        assert not mon.scan_once()
    assert mon.rules.ranks[2].record is not None and mon.rules.ranks[2].record.seq == 3
    found: list[Any] = []
    for _ in range(12):  # the node is gone: no more pushes
        clock.t += 1.0
        found += mon.scan_once()
    timeouts = {f.rank for f in found if f.finding_type.value == "rank_process_heartbeat_timeout"}
    assert {2, 3} <= timeouts


def test_bad_tick_rows_are_counted_not_raised(tmp_path: Path) -> None:
    store = DictStore()
    relay = SimRelay(store, tmp_path)
    source = StoreRemoteSource(store, RUN, nnodes=2)
    relay.push(rec(2, 0, event="process_start"))
    source.fetch_changed()
    keys = StoreKeys(RUN)
    tick = json.loads(store.data[keys.tick(1)])
    tick["ranks"][0][2] = "seven"  # seq
    store.data[keys.tick(1)] = json.dumps(tick)
    assert source.fetch_changed()[0] == []
    assert source.ignored()[0] == 1 and "seq" in (source.ignored()[1] or "")
    tick["ranks"] = [[9, ME, *[0] * len(VOLATILE_FIELDS)]]  # a rank without full records
    store.data[keys.tick(1)] = json.dumps(tick)
    assert source.fetch_changed()[0] == []
    assert source.ignored()[0] == 2


def test_patcher_rejects_rows_of_the_wrong_shape_or_process() -> None:
    base = HeartbeatRecord.from_dict(rec(2, 0))
    patcher = RecordPatcher(base)
    row = tick_row(base, 0.5)
    assert patcher.apply(row) == HeartbeatRecord.from_dict({**rec(2, 0), "relayed_age_s": 0.5})
    assert patcher.apply([2, ME + 1, *row[2:]]) is None  # another process of the rank
    with pytest.raises(RecordError):
        patcher.apply(row[:-1])
    with pytest.raises(RecordError):
        patcher.apply([*row[:7], -1.0, *row[8:]])  # since_progress_s < 0
