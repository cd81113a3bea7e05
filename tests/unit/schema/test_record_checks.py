"""``HeartbeatRecord.from_dict`` tests every field in one expression and, for a record
that fails it, field by field: the expression accepts exactly what the field-by-field
checks accept, and a record with several bad fields names the first in their order."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rankguard.schema.records import (
    MAX_RANKS,
    SCHEMA_VERSION,
    Event,
    HeartbeatRecord,
    RecordError,
    _check_fields,
)

BASE: dict[str, Any] = {
    "event": "heartbeat",
    "run_id": "run-checks",
    "rank": 3,
    "pid": 4242,
    "seq": 9,
}
INTS = [0, 7, -1, 1.0, True, "1", None, [1]]
NUMBERS = [0, 0.0, 2.5, -0.5, math.inf, math.nan, True, "1", None]
TEXTS = ["", "x", "x" * 4096, "x" * 4097, 3, b"x", None]
BOOLS = [True, False, 0, 1, "true", None]
OBJECTS = [{}, {"a": 1}, [], "x", 1, None]
# every field the one expression tests, with values it must accept or refuse
VALUES: dict[str, list[Any]] = {
    **{k: INTS for k in ("seq", "schema_version", "node_rank", "local_rank", "wall_time_ns")},
    **{k: INTS for k in ("progress_seq", "monotonic_ns", "iteration")},
    "last_progress_monotonic_ns": INTS,
    **{k: NUMBERS for k in ("phase_elapsed_s", "since_progress_s", "relayed_age_s")},
    **{k: TEXTS for k in ("hostname", "phase", "progress_source", "iteration_source")},
    "main_frame": TEXTS,
    "checkpoint_active": BOOLS,
    "synthesized": BOOLS,
    **{k: OBJECTS for k in ("perf", "straggler", "ft_stats")},
    "world_size": [1, 8, 0, -1, MAX_RANKS, MAX_RANKS + 1, 2.0, "8", None],
}


def _message(d: dict[str, Any]) -> str | None:
    try:
        _check_fields(d)
    except RecordError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("field", sorted(VALUES))
def test_the_one_expression_accepts_what_the_field_checks_accept(field: str) -> None:
    for value in VALUES[field]:
        d = {**BASE, field: value}
        want = _message(d)
        if want is None:
            rec = HeartbeatRecord.from_dict(d)
            got = getattr(rec, field)
            if value is not None:
                assert got == value and type(got) is type(value), (field, value)
        else:
            with pytest.raises(RecordError) as err:
                HeartbeatRecord.from_dict(d)
            assert str(err.value) == want, (field, value)
            assert field in want


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"perf": [1], "seq": -1}, "seq"),  # the integers before the objects
        ({"hostname": 3, "iteration": 1.5}, "iteration"),
        ({"world_size": 0, "ft_stats": 1}, "ft_stats"),  # the objects before the world size
        ({"gpu": "GPU-0", "phase": 1}, "phase"),  # every type before the blocks
        ({"checkpoint_id": [1], "gpu": {"ordinal": "0"}}, "gpu"),
        ({"exit": "x", "checkpoint_id": 1.5}, "checkpoint_id"),
        ({"rerun": 1, "exit": {"clean": "no"}}, "exit"),
        ({"inprocess": {"restarts": "1"}, "rerun": "x"}, "rerun"),
        ({"inprocess": []}, "inprocess"),
    ],
)
def test_a_record_with_several_bad_fields_names_the_first(bad: dict[str, Any], named: str) -> None:
    with pytest.raises(RecordError, match=f"^{named}"):
        HeartbeatRecord.from_dict({**BASE, **bad})


def test_every_field_lands_in_its_slot() -> None:
    d = {
        **BASE,
        "schema_version": 1,
        "hostname": "h",
        "node_rank": 1,
        "local_rank": 2,
        "world_size": 16,
        "wall_time_ns": 5,
        "monotonic_ns": -6,
        "gpu": {"ordinal": 2, "token": "GPU-t", "uuid": "GPU-u"},
        "progress_seq": 7,
        "iteration": -8,
        "phase": "train",
        "phase_elapsed_s": 9,
        "checkpoint_active": True,
        "checkpoint_id": 10,
        "since_progress_s": 11.5,
        "last_progress_monotonic_ns": 12,
        "progress_source": "api",
        "iteration_source": "script",
        "main_frame": "train.py:1 in step",
        "exit": {"clean": False, "exit_code": -9},
        "synthesized": True,
        "relayed_age_s": 0.25,
        "perf": {"p": 1},
        "straggler": {"s": 2},
        "ft_stats": {"f": 3},
        "rerun": {"mode": "validate", "reruns": 1},
        "inprocess": {"restarts": 1},
        "unknown_key": [1, 2],
    }
    rec = HeartbeatRecord.from_dict(d)
    for key, value in d.items():
        if key == "unknown_key":
            assert rec.extra == {"unknown_key": [1, 2]}
            continue
        got = getattr(rec, key)
        got = got.value if isinstance(got, Event) else got
        assert got == value and type(got) is type(value), key


def test_absent_and_null_fields_keep_their_defaults() -> None:
    rec = HeartbeatRecord.from_dict({**BASE, "seq": None, "checkpoint_active": None})
    assert (rec.seq, rec.schema_version, rec.wall_time_ns, rec.progress_seq) == (
        0,
        SCHEMA_VERSION,
        0,
        0,
    )
    assert rec.checkpoint_active is False and rec.synthesized is False and rec.extra == {}
    assert HeartbeatRecord.from_dict({**BASE, "schema_version": None}).schema_version is None
