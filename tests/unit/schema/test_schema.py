"""The vocabulary: typed records validated on ingest, one supersedes rule, the finding
types as the only list (every consumer covers each type), the run layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.cli.status_render import _FINDING_ABBREV, _WARNING_FINDINGS
from rankguard.exporter.collector import FindingCounts
from rankguard.ft.config import FINDING_TYPES, FaultToleranceConfig
from rankguard.monitor.monitor import JobMonitor
from rankguard.relay.relay import StoreRelay
from rankguard.report.charts import FINDING_STYLE
from rankguard.schema import (
    Event,
    Finding,
    FindingType,
    HeartbeatRecord,
    Liveness,
    Progress,
    Reason,
    RecordError,
    RunLayout,
    StoreKeys,
    supersedes,
)
from rankguard.schema.layout import HEALTH_FILE_RE, HEARTBEAT_FILE_RE, heartbeat_file_name
from tests.factories import FakeClock, heartbeat_config

RUN = "run-schema"
BASE_NS = 1_700_000_000_000_000_000


def raw(rank: Any = 0, seq: Any = 0, **kw: Any) -> dict[str, Any]:
    """A valid record of ``rank``; ``kw`` replaces any field (with any value)."""
    rank_n = rank if isinstance(rank, int) else 0
    seq_n = seq if isinstance(seq, int) else 0
    r: dict[str, Any] = {
        "schema_version": 1,
        "event": "heartbeat",
        "run_id": RUN,
        "rank": rank,
        "local_rank": rank,
        "world_size": 2,
        "pid": 5000 + rank_n,
        "seq": seq,
        "hostname": "node-a",
        "node_rank": 0,
        "wall_time_ns": BASE_NS + seq_n,
        "monotonic_ns": seq_n,
        "progress_seq": seq_n,
        "iteration": seq_n,
        "phase": "train",
        "checkpoint_active": False,
        "since_progress_s": 0.1,
        "phase_elapsed_s": 1.0,
        "gpu": None,
    }
    r.update(kw)
    return r


# ---- records --------------------------------------------------------------------------


def test_record_round_trips_and_keeps_unknown_keys() -> None:
    d = raw(1, 3, custom={"a": 1}, perf={"step_time_ms": 5.0})
    rec = HeartbeatRecord.from_dict(d)
    assert rec.event is Event.HEARTBEAT and rec.rank == 1 and rec.seq == 3
    assert rec.perf == {"step_time_ms": 5.0}
    out = rec.to_dict()
    assert out["custom"] == {"a": 1}
    assert {k: v for k, v in out.items() if v is not None} == {
        k: v for k, v in d.items() if v is not None
    }


def test_every_field_is_read_from_its_own_key() -> None:
    """from_dict builds the record positionally (speed): each field must land in its
    own slot."""
    d = raw(
        2,
        7,
        schema_version=1,
        node_rank=11,
        local_rank=12,
        world_size=13,
        wall_time_ns=14,
        monotonic_ns=15,
        gpu={"ordinal": 1, "token": "GPU-a", "uuid": "GPU-a"},
        progress_seq=16,
        iteration=17,
        phase="eval",
        phase_elapsed_s=18.5,
        checkpoint_active=True,
        checkpoint_id="ck",
        since_progress_s=19.5,
        last_progress_monotonic_ns=20,
        progress_source="api",
        main_frame="f.py:1 in g",
        exit={"clean": True},
        synthesized=True,
        relayed_age_s=21.5,
        perf={"p": 1},
        straggler={"s": 1},
        ft_stats={"f": 1},
        hostname="host-x",
        run_id="run-x",
        pid=4242,
    )
    rec = HeartbeatRecord.from_dict(d)
    for key, value in d.items():
        got = getattr(rec, key)
        assert (got.value if isinstance(got, Event) else got) == value, key


# Each field with a value of the wrong type (or absurd): the record is rejected, naming it.
BAD_FIELDS: list[tuple[str, Any]] = [
    ("event", "started"),
    ("event", None),
    ("run_id", 7),
    ("rank", "0"),
    ("rank", -1),
    ("rank", 1.5),
    ("rank", True),
    ("rank", 100_000_000),
    ("pid", "x"),
    ("pid", 0),
    ("seq", "x"),
    ("seq", -2),
    ("world_size", 0),
    ("hostname", ["h"]),
    ("hostname", "h" * 5000),
    ("node_rank", "0"),
    ("local_rank", {}),
    ("wall_time_ns", "now"),
    ("monotonic_ns", 1.5),
    ("gpu", "GPU-0"),
    ("gpu", {"ordinal": "0"}),
    ("progress_seq", "3"),
    ("iteration", 2.0),
    ("phase", 1),
    ("phase_elapsed_s", "abc"),
    ("phase_elapsed_s", float("nan")),
    ("checkpoint_active", "yes"),
    ("checkpoint_id", ["c"]),
    ("since_progress_s", "abc"),
    ("since_progress_s", float("inf")),
    ("since_progress_s", -1.0),
    ("last_progress_monotonic_ns", "x"),
    ("progress_source", 3),
    ("main_frame", 3),
    ("exit", "x"),
    ("exit", {"clean": "no"}),
    ("exit", {"exit_code": "1"}),
    ("exit", {"error": 5}),
    ("synthesized", 1),
    ("relayed_age_s", "old"),
    ("perf", [1]),
    ("straggler", "slow"),
    ("ft_stats", 42),
]


@pytest.mark.parametrize(("key", "value"), BAD_FIELDS)
def test_wrong_typed_field_is_rejected_naming_it(key: str, value: Any) -> None:
    with pytest.raises(RecordError, match=key.split("_ns")[0] if key != "event" else "event"):
        HeartbeatRecord.from_dict(raw(**{key: value}))


def test_record_that_is_not_an_object_or_lacks_identity_is_rejected() -> None:
    for bad in ([], "x", 3, None):
        with pytest.raises(RecordError):
            HeartbeatRecord.from_dict(bad)
    for key in ("run_id", "rank", "pid"):
        d = raw()
        del d[key]
        with pytest.raises(RecordError):
            HeartbeatRecord.from_dict(d)


def test_rank_bound_is_the_jobs() -> None:
    assert HeartbeatRecord.from_dict(raw(3), max_ranks=4).rank == 3
    with pytest.raises(RecordError, match="outside the job"):
        HeartbeatRecord.from_dict(raw(4), max_ranks=4)


def test_every_wrong_typed_record_is_skipped_and_the_scan_still_writes(tmp_path: Path) -> None:
    """One bad record of each kind, in the files of both ranks, between good ones: every
    scan writes status.json, the bad ones are counted, and a real fault is still found."""
    clock = FakeClock(0.0)
    mon = JobMonitor(
        heartbeat_config(), tmp_path, RUN, expected_world_size=2, clock=clock, check_pids=False
    )
    layout = RunLayout(tmp_path)

    def append(rank: int, record: Any) -> None:
        with open(layout.heartbeat(rank, 5000 + rank), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    append(0, raw(0, 0))
    append(1, raw(1, 0))
    bad = 0
    for i, (key, value) in enumerate(BAD_FIELDS, start=1):
        clock.t += 0.6
        if key not in ("rank", "pid"):  # the file belongs to rank 0 / pid 5000
            append(0, {**raw(0, i), key: value})
            bad += 1
        append(1, raw(1, i, progress_seq=1, since_progress_s=clock.t))  # stuck at step 1
        append(0, raw(0, i, progress_seq=i))
        assert mon.scan_once() is not None
        status = json.loads(layout.status.read_text(encoding="utf-8"))
        assert status["monitor"]["scan_errors"] == 0
        assert status["monitor"]["ignored_records"] == bad
    assert mon.scan_count == len(BAD_FIELDS)
    assert status["monitor"]["last_ignored"].startswith("invalid record:")
    # Rank 1 stalled for > 20 s while rank 0 progressed: still found and written.
    findings = [json.loads(x) for x in layout.findings.read_text(encoding="utf-8").splitlines()]
    assert [(f["rank"], f["finding_type"]) for f in findings] == [(1, "gpu_progress_timeout")]


def test_one_rank_that_cannot_be_evaluated_does_not_hide_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon = JobMonitor(heartbeat_config(), tmp_path, RUN, expected_world_size=2, clock=FakeClock(0.0))
    mon.check_pids = False
    real = mon.rules._evaluate_rank

    def broken_for_rank_0(state: Any, now: float) -> Any:
        if state.rank == 0:
            raise RuntimeError("surprise")
        return real(state, now)

    monkeypatch.setattr(mon.rules, "_evaluate_rank", broken_for_rank_0)
    layout = RunLayout(tmp_path)
    for rank in (0, 1):
        layout.heartbeat(rank, 5000 + rank).write_text(
            json.dumps(raw(rank, 0, since_progress_s=30.0, progress_seq=1)) + "\n",
            encoding="utf-8",
        )
    found = mon.scan_once()
    assert [(f.rank, f.finding_type.value) for f in found] == [(1, "gpu_progress_timeout")]
    assert mon.status["monitor"]["rank_errors"] == 1 and mon.scan_errors == 0


def test_a_rank_outside_the_job_is_counted_not_shown(tmp_path: Path) -> None:
    mon = JobMonitor(
        heartbeat_config(),
        tmp_path,
        RUN,
        expected_world_size=2,
        clock=FakeClock(),
        check_pids=False,
    )
    path = tmp_path / heartbeat_file_name(100_000, 7)
    path.write_text(json.dumps(raw(100_000, pid=7)) + "\n", encoding="utf-8")
    mon.scan_once()
    assert mon.rules.ignored_records == 1
    assert len(mon.status["ranks"]) == 2


def test_supersedes_is_the_one_rule() -> None:
    def r(**kw: Any) -> HeartbeatRecord:
        return HeartbeatRecord.from_dict(raw(**kw))

    old = r(seq=5)
    assert supersedes(r(seq=6), old)
    assert not supersedes(r(seq=5), old)  # a duplicate
    assert not supersedes(r(seq=4), old)  # a rotated file's repeated start record
    assert supersedes(r(seq=0), None)
    synth = old.vanished(BASE_NS + 10)
    assert synth.synthesized and synth.ended and synth.seq == 6
    assert supersedes(synth, old)
    own_end = r(seq=6, event="process_end", exit={"clean": True})
    assert supersedes(own_end, synth)  # its own end replaces the synthesized one
    assert not supersedes(synth, own_end)  # an ended process stays ended
    assert not supersedes(old.vanished(BASE_NS + 20), synth)  # only its own end
    assert not supersedes(r(seq=9), synth)
    # another process of the rank: a restart started no earlier than the old one
    assert supersedes(r(seq=0, pid=6000, wall_time_ns=BASE_NS + 1), old, old_start_ns=BASE_NS)
    assert not supersedes(r(seq=99, pid=6000, wall_time_ns=BASE_NS - 1), old, old_start_ns=BASE_NS)
    assert supersedes(r(seq=0, pid=6000, hostname="node-b", wall_time_ns=0), old)


def test_relay_replaces_a_synthesized_end_only_with_the_processs_own(tmp_path: Path) -> None:
    relay = StoreRelay(store=None, run_dir=tmp_path, run_id=RUN, node_rank=1, interval_s=1.0)
    relay._offer(raw(0, 5, node_rank=1))  # a record of the relay's node
    relay._latest[0] = relay._latest[0].vanished(BASE_NS + 10)
    relay._offer(
        raw(0, 7, node_rank=1, event="process_end", synthesized=True, exit={"clean": False})
    )
    assert relay._latest[0].seq == 6  # a second synthesized end does not replace it
    relay._offer(raw(0, 6, node_rank=1, event="process_end", exit={"clean": True}))
    assert relay._latest[0].own_end and relay._latest[0].exit == {"clean": True}
    relay._offer({"rank": "zero"})
    assert relay.ignored_records == 1


# ---- findings -------------------------------------------------------------------------


def test_finding_round_trips() -> None:
    f = Finding(
        finding_type=FindingType.STRAGGLER,
        run_id=RUN,
        rank=3,
        reason=Reason.SLOW_COMPUTE,
        message="slow",
        process_liveness=Liveness.ALIVE,
        gpu_progress=Progress.PROGRESSING,
        detail={"relative_score": 0.5},
    )
    d = f.to_dict()
    assert d["finding_type"] == "straggler_detected" and d["relative_score"] == 0.5
    assert "action" not in d and "stack_dumps" not in d
    back = Finding.from_dict(json.loads(json.dumps(d)))
    assert back == f
    with pytest.raises(ValueError, match="finding_type"):
        Finding.from_dict({**d, "finding_type": "nope"})


def test_every_consumer_covers_every_finding_type() -> None:
    """The enum is the only list: a new type without its action, status name, report
    marker or exporter series fails here."""
    names = {t.value for t in FindingType}
    assert set(FINDING_TYPES) == names
    assert set(FaultToleranceConfig().actions) == names
    assert all(
        FaultToleranceConfig().actions[t.value] == t.info.default_action for t in FindingType
    )
    assert set(_FINDING_ABBREV) == names
    assert len(set(_FINDING_ABBREV.values())) == len(names)  # short names tell types apart
    assert names >= _WARNING_FINDINGS
    assert set(FINDING_STYLE) == names
    assert set(FindingCounts().snapshot()) == names
    for t in FindingType:
        assert t.info.severity in ("error", "warning")
        assert t.info.default_action in ("report", "restart", "abort")


def test_hang_types() -> None:
    hangs = {t for t in FindingType if t.info.hang}
    assert hangs == {
        FindingType.PROCESS_TIMEOUT,
        FindingType.PROGRESS_TIMEOUT,
        FindingType.SECTION_TIMEOUT,
    }


# ---- layout ---------------------------------------------------------------------------


def test_layout_names(tmp_path: Path) -> None:
    layout = RunLayout.of(tmp_path, "r1")
    assert layout.root == (tmp_path / "heartbeat" / "r1").resolve()
    assert layout.status.name == "status.json" and layout.findings.name == "findings.jsonl"
    assert layout.restarts.name == "restarts.jsonl"
    assert layout.heartbeat(3, 42).name == "rank_3_pid_42.heartbeat.jsonl"
    assert HEARTBEAT_FILE_RE.match(layout.heartbeat(3, 42).name)
    assert HEALTH_FILE_RE.match(layout.health(2).name).group(1) == "2"  # type: ignore[union-attr]
    assert layout.stack_dump(1, 9) == layout.root / "stacks" / "rank_1_pid_9.txt"
    keys = StoreKeys("r1")
    assert keys.heartbeats(2) == "rankguard/r1/hb/node/2"
    assert keys.kill(1) == "rankguard/r1/kill/node/1"
    assert keys.done(1) == "rankguard/r1/done/node/1" and keys.control == "rankguard/r1/control"


def test_a_restart_after_the_wall_clock_stepped_back_replaces_the_old_process() -> None:
    from rankguard.schema.records import HeartbeatRecord, supersedes

    def rec(pid: int, wall: int, mono: int | None) -> HeartbeatRecord:
        return HeartbeatRecord.from_dict(
            {
                "event": "heartbeat",
                "run_id": "r",
                "rank": 0,
                "pid": pid,
                "hostname": "h",
                "wall_time_ns": wall,
                "monotonic_ns": mono,
            }
        )

    s = 10**9
    old = rec(100, wall=5_000 * s, mono=900 * s)
    stepped_back = rec(200, wall=1_000 * s, mono=1_000 * s)  # NTP stepped back 4000 s
    assert supersedes(stepped_back, old, old_start_ns=5_000 * s, old_start_mono_ns=900 * s)
    late_line = rec(100, wall=1_010 * s, mono=950 * s)  # the replaced process's last line
    assert not supersedes(
        late_line, stepped_back, old_start_ns=1_000 * s, old_start_mono_ns=1_000 * s
    )
    rebooted = rec(300, wall=1_500 * s, mono=20 * s)  # the monotonic clock began again
    assert supersedes(rebooted, stepped_back, old_start_ns=1_000 * s, old_start_mono_ns=1_000 * s)
    assert not supersedes(rec(400, wall=10, mono=None), old, old_start_ns=5_000 * s)
