"""Node 0 builds a tick's records as it parses the tick (its rows freed at once) and
hands them on in the order of the scan: the full records read first, then each
node's patched rows; a bad row is counted in that order too."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from rankguard.relay.delta import VOLATILE_FIELDS, RecordPatcher, patch_rows, tick_row
from rankguard.relay.relay import StoreRemoteSource
from rankguard.schema.layout import StoreKeys
from rankguard.schema.records import HeartbeatRecord
from tests.factories import DictStore, heartbeat_record

RUN = "run-patch"
KEYS = StoreKeys(RUN)


def _full(rank: int, node: int, seq: int = 3, **kw: Any) -> HeartbeatRecord:
    return HeartbeatRecord.from_dict(
        heartbeat_record(
            rank,
            seq,
            run_id=RUN,
            node_rank=node,
            publisher_fields=True,
            main_frame="train.py:1 in step",
            **kw,
        )
    )


def test_a_patched_record_is_every_field_of_the_base_or_the_row() -> None:
    base = _full(
        5,
        1,
        exit={"clean": False},
        perf={"p": 1},
        straggler={"s": 1},
        ft_stats={"f": 1},
        rerun={"mode": "validate"},
        inprocess={"restarts": 1},
        iteration_source="script",
        checkpoint_id=4,
        custom_key={"kept": True},
    )
    row = [5, base.pid, 9, 10**18, -3, 11, None, 0.5, None, 7, "f.py:2 in g", 1.25]
    rec = RecordPatcher(base).apply(row)
    assert rec is not None and rec is not base
    for f in fields(HeartbeatRecord):
        want = row[2 + VOLATILE_FIELDS.index(f.name)] if f.name in VOLATILE_FIELDS else None
        if f.name not in VOLATILE_FIELDS:
            want = getattr(base, f.name)
        got = getattr(rec, f.name)
        assert got == want and type(got) is type(want), f.name
    assert rec == HeartbeatRecord(**{f.name: getattr(rec, f.name) for f in fields(HeartbeatRecord)})
    assert tick_row(rec, 1.25) == row


def test_patch_rows_gives_each_rows_record_or_why_not() -> None:
    patchers = {5: RecordPatcher(_full(5, 1)), 6: RecordPatcher(_full(6, 1))}
    good = tick_row(_full(5, 1, seq_step_ns=1), 0.5)
    rows: list[Any] = [
        good,
        good[:-1],  # too short
        [[5], *good[1:]],  # an unhashable rank
        [7, *good[1:]],  # a rank without full records
        [6, 1, *good[2:]],  # another process of rank 6
        "row",
        [],
        [5, good[1], "seven", *good[3:]],
    ]
    built = patch_rows(patchers, rows)
    assert isinstance(built[0], HeartbeatRecord) and built[0].rank == 5
    assert built[1:] == [
        "tick row: expected a list of 12 values",
        "unhashable type: 'list'",
        "tick row of a rank without a record",
        "tick row of a rank without a record",
        "tick row of a rank without a record",
        "tick row of a rank without a record",
        "tick row seq: expected an integer, got 'seven'",
    ]


def _base(node: int, gen: int, records: list[HeartbeatRecord]) -> str:
    return json.dumps(
        {"epoch": "e", "gen": gen, "records": [r.to_dict() for r in records], "disk": None}
    )


def _tick(node: int, gen: int, rows: list[Any], seq: int) -> str:
    return json.dumps({"epoch": "e", "gen": gen, "seq": seq, "ranks": rows})


def test_full_records_come_first_then_each_nodes_rows_in_order() -> None:
    """Rank 2 moved from node 1 to node 2 (a standby took it over) while node 1 still
    relays it: node 2's new full records are read first, then the rows node by node,
    each compared with the record before it, as when every row was patched after the
    full records."""
    store = DictStore()
    source = StoreRemoteSource(store, RUN, nnodes=3)
    one = [_full(1, 1), _full(2, 1)]
    two = [_full(3, 2)]
    store.set(KEYS.heartbeats(1), _base(1, 1, one))
    store.set(KEYS.heartbeats(2), _base(2, 1, two))
    store.set(KEYS.tick(1), _tick(1, 1, [tick_row(r, None) for r in one], 1))
    store.set(KEYS.tick(2), _tick(2, 1, [tick_row(r, None) for r in two], 1))
    first, _ = source.fetch_changed()
    assert [(r.rank, r.node_rank) for r in first] == [(1, 1), (2, 1), (3, 2)]
    # node 1: the same generation, new rows (and one bad); node 2: new full records
    # with rank 2 in them, and a tick with a bad row
    moved = _full(2, 2, pid=9000, seq=7)
    store.set(KEYS.heartbeats(2), _base(2, 2, [*two, moved]))
    rows1 = [tick_row(_full(1, 1, seq=4), None), tick_row(_full(2, 1, seq=8), None)]
    store.set(KEYS.tick(1), _tick(1, 1, [*rows1, [1, 2, "x"]], 2))
    rows2 = [tick_row(two[0], None), tick_row(moved, None), [3]]
    store.set(KEYS.tick(2), _tick(2, 2, rows2, 2))
    out, _ = source.fetch_changed()
    assert [(r.rank, r.node_rank, r.seq) for r in out] == [
        (3, 2, 3),  # node 2's full records
        (2, 2, 7),
        (1, 1, 4),  # node 1's rows
        (2, 1, 8),  # rank 2's row from node 1 after node 2's full record of it
        (2, 2, 7),  # node 2's rows: rank 2's again (rank 3's has not moved)
    ]
    assert source._current[2].node_rank == 2
    count, last = source.ignored()
    assert count == 2 and last == "node 2: tick row: expected a list of 12 values"
