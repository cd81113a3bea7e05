"""A record that moves only a rank's clocks (a rank waiting in a collective hang) is taken
in without a turn: its liveness is noted, its due time moved, its verdicts unchanged."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import FindingType, Liveness, Progress
from tests.factories import heartbeat_config, heartbeat_record

RUN = "run-ticked"
IN_COLLECTIVE = "distributed_c10d.py:2501 in all_reduce"
IN_MODEL = "model.py:88 in forward"


def _rules(world: int, incremental: bool = True) -> HeartbeatRules:
    cfg = heartbeat_config(incremental_rules=incremental)
    return HeartbeatRules(cfg, RUN, expected_world_size=world, started_at=0.0)


def _rec(rank: int, seq: int, t: float, **kw: Any) -> dict[str, Any]:
    """Rank ``rank``'s record at ``t`` (its own monotonic clock with it)."""
    fields: dict[str, Any] = {
        "progress_seq": 5,
        "since": 1.0,
        "main_frame": IN_COLLECTIVE,
        "phase_elapsed": 30.0 + t,
        "monotonic_ns": int(t * 1e9),
    }
    fields.update(kw)
    return heartbeat_record(rank, seq, run_id=RUN, t=t, world_size=2, node_rank=0, **fields)


def test_a_tick_that_moves_only_clocks_notes_liveness_without_a_turn() -> None:
    rules = _rules(2)
    for r in (0, 1):
        rules.ingest(_rec(r, 1, 0.0), 0.0)
    rules.evaluate(0.0)
    s = rules.ranks[0]
    assert (s.liveness, s.progress) == (Liveness.ALIVE, Progress.PROGRESSING)
    assert not rules.due_ranks.pending()
    assert rules.ingest(_rec(0, 2, 1.0, since=2.0), 1.0)
    assert rules.quiet_records == 1
    assert not rules.due_ranks.pending()  # no turn at the next scan for it
    assert s.record is not None and s.record.seq == 2 and s.seen_at == 1.0
    rules.evaluate(1.5)
    assert s.heartbeat_age_s == pytest.approx(0.5)  # its liveness from the new record
    assert s.progress_age_s == pytest.approx(2.5)
    assert (s.liveness, s.progress) == (Liveness.ALIVE, Progress.PROGRESSING)


@pytest.mark.parametrize(
    "change",
    [
        {"progress_seq": 6},
        {"main_frame": IN_MODEL},
        {"phase": "eval"},
        {"checkpoint_active": True},
        {"event": "process_end"},
        {"monotonic_ns": int(9.0 * 1e9)},  # a pause on its own clock (SIGSTOP, SIGCONT)
    ],
)
def test_a_tick_with_anything_else_new_takes_the_full_turn(change: dict[str, Any]) -> None:
    rules = _rules(2)
    for r in (0, 1):
        rules.ingest(_rec(r, 1, 0.0), 0.0)
    rules.evaluate(0.0)
    assert rules.ingest(_rec(0, 2, 1.0, since=2.0, **change), 1.0)
    assert rules.quiet_records == 0
    assert rules.due_ranks.pending()


def test_heartbeat_timeout_when_the_ticks_stop_is_found_at_the_same_time() -> None:
    """Ticks moving only clocks, then none: the heartbeat timeout at the same scan and
    with the same finding as when every record takes its turn."""
    got = []
    for incremental in (True, False):
        rules = _rules(2, incremental)
        found: list[tuple[float, int, str, str]] = []
        now = 0.0
        for step in range(60):
            now = step * 0.5
            if now <= 8.0 or step % 2:  # rank 1 publishes throughout
                for r in (0, 1) if now <= 8.0 else (1,):
                    if step % 2 == 0 or r == 1:
                        rules.ingest(_rec(r, step + 1, now, since=1.0 + now), now)
            for f in rules.evaluate(now):
                found.append((now, f.rank, f.finding_type.value, f.message))
        if incremental:
            assert rules.quiet_records > 10
        got.append(found)
    assert got[0] == got[1]
    timeouts = [f for f in got[0] if f[2] == FindingType.PROCESS_TIMEOUT.value]
    assert [(t, r) for t, r, _, _ in timeouts] == [(18.5, 0)]  # 8.0 + 10 s, next scan


def _hang_run(seed: int) -> tuple[int, list[tuple[float, int]]]:
    """A collective hang of 16 ranks at t=20 (the culprit outside the collective, the
    others waiting in it), records arriving late at random, some ranks paused a while
    before it, one rank's frame moving now and then; the fast path against every
    record's turn. How many records took no turn, and the progress timeouts named."""
    rng = random.Random(seed)
    world, culprit, hang_at, step_s = 16, 5, 20.0, 2.0
    fast, full = _rules(world), _rules(world, incremental=False)
    seq = dict.fromkeys(range(world), 0)
    paused: dict[int, float] = {}
    named: list[tuple[float, int]] = []
    now = 0.0
    while now < 60.0:
        now = round(now + rng.choice([0.1, 0.5, 1.0, 1.0]), 3)
        if now < 12.0 and rng.random() < 0.05:  # before the hang: a paused rank is its cause
            paused[rng.randrange(world)] = now + rng.choice([3.0, 12.0])
        for rank in range(world):
            if paused.get(rank, 0.0) > now or rng.random() < 0.1:
                continue
            at = now - rng.choice([0.0, 0.2, 0.7])
            done = int(min(at, hang_at) / step_s)
            frame = "train.py:212 in train_step"
            if at >= hang_at:
                frame = IN_MODEL if rank == culprit else IN_COLLECTIVE
                if rank == 9 and rng.random() < 0.2:
                    frame = "distributed_c10d.py:3100 in barrier"
            seq[rank] += 1
            raw = heartbeat_record(
                rank,
                seq[rank],
                run_id=RUN,
                t=at,
                world_size=world,
                node_rank=rank // 4,
                hostname=f"node{rank // 4}",
                progress_seq=done,
                since=round(at - done * step_s, 3),
                phase_elapsed=round(at + 5.0, 3),
                main_frame=frame,
                monotonic_ns=int(at * 1e9),
                relayed_age_s=round(now - at, 3),
            )
            seen = now - rng.choice([0.0, 0.3, 0.9])  # its progress age moves either way
            assert fast.ingest(raw, seen) == full.ingest(raw, seen)
        got_fast = [f.to_dict() for f in fast.evaluate(now)]
        got_full = [f.to_dict() for f in full.evaluate(now)]
        assert got_fast == got_full, (seed, now)
        for rank, s in full.ranks.items():
            t = fast.ranks[rank]
            assert (t.record, t.seen_at, t.liveness, t.progress, t.stall, t.blocked_by) == (
                s.record,
                s.seen_at,
                s.liveness,
                s.progress,
                s.stall,
                s.blocked_by,
            ), (seed, now, rank)
            assert (t.heartbeat_age_s, t.progress_age_s, t.active, t.late) == (
                s.heartbeat_age_s,
                s.progress_age_s,
                s.active,
                s.late,
            )
        named += [
            (now, f["rank"])
            for f in got_fast
            if f["finding_type"] == FindingType.PROGRESS_TIMEOUT.value
        ]
    return fast.quiet_records, named


@pytest.mark.parametrize("seed", range(8))
def test_a_collective_hang_is_judged_as_every_turn_judges_it(seed: int) -> None:
    quiet, named = _hang_run(seed)
    assert quiet > 100  # most ticks of the hang took no turn
    assert {r for _, r in named} <= {5}  # never a rank waiting on the culprit


def test_a_collective_hang_names_its_culprit() -> None:
    quiet, named = _hang_run(0)
    assert quiet > 100
    assert named and [r for _, r in named] == [5]
