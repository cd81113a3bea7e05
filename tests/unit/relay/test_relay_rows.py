"""A tick row's check (one expression for a good row) refuses what the field-by-field
check refuses, and a patched record is the base with the row's fields."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rankguard.relay.delta import TICK_FIELDS, RecordPatcher, tick_row
from rankguard.schema.records import HeartbeatRecord, RecordError
from tests.factories import heartbeat_record

GOOD = [5, 105, 12, 1_764_000_000_000_000_000, 123_456, 40, 40, 0.5, 123_000, 85.2, "f", 1.25]
# per volatile field: values it may hold, values it may not
ALLOWED: dict[str, tuple[list[Any], list[Any]]] = {
    "seq": ([0, 7], [None, -1, 1.0, True, "1"]),
    "wall_time_ns": ([0, 9], [None, -1, 2.5, False]),
    "monotonic_ns": ([None, -5, 3], [1.5, "3", True]),
    "progress_seq": ([0, 2], [None, -2, 0.5]),
    "iteration": ([None, -1, 4], [0.5, "4", True]),
    "since_progress_s": ([None, 0, 0.0, 2.5], [-0.1, math.inf, math.nan, "1", True]),
    "last_progress_monotonic_ns": ([None, -3, 3], [3.5, "x"]),
    "phase_elapsed_s": ([None, 0, 7.5], [-1, math.inf, math.nan]),
    "main_frame": ([None, "", "x" * 4096], ["x" * 4097, 3, b"f"]),
    "relayed_age_s": ([None, 0, 0.25], [-0.25, math.inf, "0"]),
}


def _row(field: str, value: Any) -> list[Any]:
    row = list(GOOD)
    row[TICK_FIELDS.index(field)] = value
    return row


def _patcher() -> RecordPatcher:
    base = HeartbeatRecord.from_dict(heartbeat_record(rank=5, pid=105, seq=3, node_rank=1))
    return RecordPatcher(base)


@pytest.mark.parametrize("field", sorted(ALLOWED))
def test_each_field_is_checked(field: str) -> None:
    patcher = _patcher()
    good, bad = ALLOWED[field]
    for value in good:
        rec = patcher.apply(_row(field, value))
        assert rec is not None and getattr(rec, field) == value
    for value in bad:
        with pytest.raises(RecordError, match=field):
            patcher.apply(_row(field, value))


def test_a_patched_record_is_the_base_with_the_row() -> None:
    patcher = _patcher()
    rec = patcher.apply(GOOD)
    assert rec is not None
    assert tick_row(rec, GOOD[-1]) == GOOD
    base = patcher.base
    for name in ("hostname", "phase", "gpu", "world_size", "event", "extra", "run_id"):
        assert getattr(rec, name) == getattr(base, name)
    assert patcher.apply([*GOOD[:1], 999, *GOOD[2:]]) is None  # another process
    with pytest.raises(RecordError):
        patcher.apply(GOOD[:-1])
