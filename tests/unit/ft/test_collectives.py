"""The rank's collective sampler: positions from the flight recorder's group status, its
waiting share, the block it publishes, and bad status dumps refused."""

from __future__ import annotations

import json
import time

import pytest

from rankguard.ft.collectives import CollectiveSampler, parse_status, stuck_in
from rankguard.schema.blocks import read_block
from rankguard.schema.collectives import CollectivesBlock, GroupPosition, StuckCollective
from rankguard.schema.records import HeartbeatRecord
from tests.factories import heartbeat_record


def _status(**groups: tuple[int, int]) -> bytes:
    return json.dumps(
        {
            "pg_status": {
                name: {
                    "last_enqueued_collective": str(enq),
                    "last_completed_collective": str(done),
                    "last_started_collective": "-1",
                }
                for name, (enq, done) in groups.items()
            }
        }
    ).encode()


def test_positions_and_waiting_share_from_the_status() -> None:
    looks = iter([_status(g0=(4, 4)), _status(g0=(5, 4)), _status(g0=(5, 5), g1=(2, 1))])
    sampler = CollectiveSampler(status=lambda: next(looks))
    assert sampler.block() is None  # before the first look
    for _ in range(3):
        sampler.sample()
    block = sampler.block()
    assert block is not None
    assert block.samples == 3 and block.waiting == 2
    assert block.group("g0") == GroupPosition("g0", 5, 5)
    assert block.group("g1") == GroupPosition("g1", 2, 1) and block.inside


def test_the_block_round_trips_through_a_record() -> None:
    block = CollectivesBlock(groups=(GroupPosition("0", 13, 12),), samples=20, waiting=7)
    rec = HeartbeatRecord.from_dict(heartbeat_record(0, collectives=block.to_dict()))
    assert read_block(rec, CollectivesBlock) == block


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"groups": []}, "collectives.groups"),
        ({"groups": {"0": [1]}}, "expected [enqueued, completed]"),
        ({"groups": {"0": [1, "2"]}}, "expected an integer"),
        ({"groups": {"0": [-5, 1]}}, "expected an integer >= -1"),
        ({"groups": {str(i): [1, 1] for i in range(17)}}, "more than 16 groups"),
        ({"groups": {"x" * 65: [1, 1]}}, "more than 64 characters"),
        ({"samples": 1, "waiting": 2}, "more than samples"),
        ({"samples": -1}, "collectives.samples"),
    ],
)
def test_a_bad_block_is_refused_naming_the_field(bad: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        CollectivesBlock.from_dict(bad)
    assert says in str(err.value)


def test_a_status_that_does_not_read_is_left_out() -> None:
    assert parse_status(b'{"pg_status": {"0": {"last_enqueued_collective": "x"}}}') == ()
    assert parse_status(b'{"pg_status": []}') == ()
    assert parse_status(b"[]") == ()
    assert parse_status(b" " * (2 << 20)) == ()  # larger than any status: not parsed


def test_the_thread_samples_and_a_failing_dump_is_counted_not_raised() -> None:
    calls = {"n": 0}

    def status() -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("no recorder")
        return _status(g0=(1, 1))

    sampler = CollectiveSampler(period_s=0.01, status=status)
    sampler.start()
    try:
        deadline = time.monotonic() + 5
        while sampler.block() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sampler.stop()
    assert sampler.errors == 1 and sampler.block() is not None


def test_a_real_status_dump_is_read() -> None:
    pytest.importorskip("torch")
    sampler = CollectiveSampler.start_if_available()
    if sampler is None:
        pytest.skip("this torch has no JSON flight-recorder dump")
    sampler.stop()
    sampler.sample()  # no process group here: no groups, no block
    assert sampler.errors == 0


def _entries(*entries: tuple[int, str]) -> bytes:
    return json.dumps(
        {
            "entries": [
                {
                    "collective_seq_id": seq,
                    "is_p2p": False,
                    "process_group": ["g0", "default_pg"],
                    "profiling_name": f"gloo:{op}",
                    "input_sizes": [[4160]],
                }
                for seq, op in entries
            ]
        }
    ).encode()


def test_a_rank_waiting_at_one_position_names_its_collective_once() -> None:
    clock = {"t": 0.0}
    dumps = {"n": 0}

    def entries() -> bytes:
        dumps["n"] += 1
        return _entries((4, "broadcast"), (5, "all_reduce"))

    sampler = CollectiveSampler(
        status=lambda: _status(g0=(5, 4)), entries=entries, clock=lambda: clock["t"]
    )
    for t in (0.0, 1.0, 1.9):
        clock["t"] = t
        sampler.sample()
        block = sampler.block()
        assert block is not None and block.stuck is None  # not yet waited long enough
    for t in (2.1, 3.0, 9.0):
        clock["t"] = t
        sampler.sample()
    block = sampler.block()
    assert block is not None and block.stuck == StuckCollective("g0", 5, "all_reduce", "[[4160]]")
    # one full dump per position, and one when the group's id first appeared (to name it)
    assert dumps["n"] == 2 and sampler.full_dumps == 1 and sampler.name_dumps == 1
    again = CollectivesBlock.from_dict(json.loads(json.dumps(block.to_dict())))
    assert again == block


def test_a_rank_that_moves_on_is_not_stuck() -> None:
    clock = {"t": 0.0}
    looks = iter([_status(g0=(5, 4)), _status(g0=(6, 5)), _status(g0=(7, 6)), _status(g0=(7, 7))])
    sampler = CollectiveSampler(
        status=lambda: next(looks), entries=lambda: b"{}", clock=lambda: clock["t"]
    )
    for t in (0.0, 3.0, 6.0, 9.0):
        clock["t"] = t
        sampler.sample()
        block = sampler.block()
        assert block is not None and block.stuck is None
    assert sampler.full_dumps == 0


def test_stuck_in_reads_only_the_matching_entry() -> None:
    data = _entries((5, "all_gather"))
    assert stuck_in(data, GroupPosition("g0", 6, 5)) is None
    assert stuck_in(data, GroupPosition("g1", 5, 4)) is None
    assert stuck_in(b'{"entries": "x"}', GroupPosition("g0", 5, 4)) is None
