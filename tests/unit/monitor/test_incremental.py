"""Incremental rules (``heartbeat.incremental_rules``) give the verdicts of evaluating
every rank at every scan, on random job histories."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rankguard.monitor.rules import HeartbeatRules, RankState
from rankguard.schema.records import HeartbeatRecord
from rankguard.util.disk import DiskState
from tests.factories import heartbeat_config, heartbeat_record

RUN = "run-incremental"
WORLD = 12
PER_NODE = 4


def _rules(incremental: bool, sections: bool) -> HeartbeatRules:
    cfg = heartbeat_config(incremental_rules=incremental)
    return HeartbeatRules(
        cfg,
        RUN,
        expected_world_size=WORLD,
        started_at=0.0,
        section_timeouts={"eval": 15.0, "setup": 40.0} if sections else None,
        out_of_section_timeout=25.0 if sections else None,
    )


def _state(s: RankState) -> tuple[Any, ...]:
    return (
        s.rank,
        s.pid,
        s.record,
        s.seen_at,
        s.liveness,
        s.progress,
        s.heartbeat_age_s,
        s.progress_age_s,
        s.gpu_health,
        sorted(t.value for t in s.active),
        list(s.blocked_by),
        s.stall,
        s.culprits_gone_at,
        s.late,
        s.resumed_at,
    )


class _History:
    """One random job: ranks publish (or stop, or pause and go on), progress (or stall),
    change phase, checkpoint, end, restart; GPUs turn unhealthy; disks fill; the launcher stops."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seq = dict.fromkeys(range(WORLD), 0)
        self.pid = {r: 1000 + r for r in range(WORLD)}
        self.progress = dict.fromkeys(range(WORLD), 0)
        self.last_progress = dict.fromkeys(range(WORLD), 0.0)
        self.phase = dict.fromkeys(range(WORLD), "train")
        self.phase_since = dict.fromkeys(range(WORLD), 0.0)
        self.ckpt = dict.fromkeys(range(WORLD), False)
        self.ended: set[int] = set()
        self.hung: set[int] = set()  # no more records
        self.stalled: set[int] = set()  # records, no progress
        self.health: dict[int, str] = {}  # node -> verdict

    def record(self, rank: int, now: float) -> dict[str, Any]:
        rng = self.rng
        self.seq[rank] += 1
        roll = rng.random()
        event = "heartbeat"
        extra: dict[str, Any] = {}
        if roll < 0.02:
            event = "process_end"
            clean = rng.random() < 0.5
            extra["exit"] = {"clean": clean, "exit_code": 0 if clean else 1, "error": None}
            if not clean and rng.random() < 0.5:
                extra["exit"]["error"] = "Connection closed by peer"
            self.ended.add(rank)
        elif roll < 0.06:
            self.phase[rank] = rng.choice(["train", "eval", "data", "step"])
            self.phase_since[rank] = now
        elif roll < 0.08:
            self.ckpt[rank] = not self.ckpt[rank]
        if rank not in self.stalled and rng.random() < 0.8:
            self.progress[rank] += 1
            self.last_progress[rank] = now
        frame = "distributed_c10d.py:10 in all_reduce" if rng.random() < 0.3 else "train.py:1 in f"
        return heartbeat_record(
            rank,
            self.seq[rank],
            self.pid[rank],
            run_id=RUN,
            event=event,
            t=now,
            node_rank=rank // PER_NODE,
            ranks_per_node=PER_NODE,
            hostname=f"node{rank // PER_NODE}",
            world_size=WORLD,
            progress_seq=self.progress[rank],
            since=round(now - self.last_progress[rank], 3),
            phase=self.phase[rank],
            phase_elapsed=round(now - self.phase_since[rank], 3),
            checkpoint_active=self.ckpt[rank],
            main_frame=frame,
            monotonic_ns=int(now * 1e9),  # the publisher's clock: a pause shows as a gap
            **extra,
        )

    def restart(self, rank: int) -> None:
        self.pid[rank] += 100
        self.seq[rank] = -1
        self.ended.discard(rank)
        self.hung.discard(rank)
        self.stalled.discard(rank)


def _run(seed: int, sections: bool) -> int:
    rng = random.Random(seed)
    full, inc = _rules(False, sections), _rules(True, sections)
    both = (full, inc)
    history = _History(rng)
    now = 0.0
    fired = 0

    def health_for(rec: HeartbeatRecord) -> dict[str, Any] | None:
        verdict = history.health.get(rec.node_rank or 0)
        return {"health": verdict, "stale": False, "problems": []} if verdict else None

    late = set(rng.sample(range(WORLD), 2))  # first seen after a while, or never
    paused: dict[int, float] = {}  # rank -> when it continues
    for step in range(400):
        now += rng.choice([0.25, 0.5, 1.0, 1.0, 2.0, 5.0])
        roll = rng.random()
        if roll < 0.03:
            history.hung.add(rng.randrange(WORLD))
        elif roll < 0.06:
            history.stalled.add(rng.randrange(WORLD))
        elif roll < 0.08:
            history.stalled.clear()
        elif roll < 0.10:
            history.restart(rng.randrange(WORLD))
            for r in both:
                r.note_restart("test restart")
        elif roll < 0.12:
            node = rng.randrange(WORLD // PER_NODE)
            history.health[node] = rng.choice(["healthy", "warning", "unhealthy"])
            for r in both:
                r.mark_node(node)
        elif roll < 0.14:
            disk = DiskState(full=rng.random() < 0.5, free_bytes=1, total_bytes=2)
            node = rng.choice([None, 0, 1, 2])
            for r in both:
                r.note_disk(node, disk, now)
        elif roll < 0.15:
            rank = rng.randrange(WORLD)
            for r in both:
                r.note_root_cause(rank, history.pid[rank])
        elif roll < 0.155:
            for r in both:
                r.note_shutdown("SIGTERM")
        elif roll < 0.18:  # stopped (SIGSTOP), continued later
            paused[rng.randrange(WORLD)] = now + rng.choice([4.0, 8.0, 15.0])
        for rank in range(WORLD):
            if rank in history.ended or rank in history.hung:
                continue
            if paused.get(rank, 0.0) > now:
                continue
            if rank in late and step < 30:
                continue
            if rng.random() < 0.7:
                raw = history.record(rank, now)
                arrived = now - rng.choice([0.0, 0.0, 0.3, 1.5])
                assert full.ingest(raw, arrived) == inc.ingest(raw, arrived)
        got_full = [f.to_dict() for f in full.evaluate(now, health_for)]
        got_inc = [f.to_dict() for f in inc.evaluate(now, health_for)]
        assert got_inc == got_full, (seed, step)
        assert sorted(full.ranks) == sorted(inc.ranks)
        for rank, s in full.ranks.items():
            assert _state(inc.ranks[rank]) == _state(s), (seed, step, rank)
        assert (full.first_failure, full.findings_total, full.rank_errors) == (
            inc.first_failure,
            inc.findings_total,
            inc.rank_errors,
        )
        fired += len(got_full)
    return fired


@pytest.mark.parametrize("seed", range(12))
def test_incremental_verdicts_equal_full_evaluation(seed: int) -> None:
    assert _run(seed, sections=seed % 2 == 1) > 0  # the history did produce findings


def test_a_quiet_rank_is_not_evaluated_until_its_timeout_is_due() -> None:
    rules = HeartbeatRules(heartbeat_config(), RUN, expected_world_size=1, started_at=0.0)
    evaluated: list[int] = []
    original = rules._evaluate_rank

    def spy(s: RankState, now: float) -> list[Any]:
        evaluated.append(s.rank)
        return original(s, now)

    rules._evaluate_rank = spy  # type: ignore[method-assign]
    rec = heartbeat_record(0, 1, run_id=RUN, world_size=1, since=0.0)
    rules.ingest(rec, 0.0)
    rules.evaluate(0.0)  # first scan: every rank
    evaluated.clear()
    for t in (1.0, 2.0):  # no new record, its heartbeats still fresh (3 s)
        rules.evaluate(t)
    assert evaluated == []
    assert rules.ranks[0].heartbeat_age_s == 2.0  # its age moved on all the same
    rules.evaluate(3.5)  # late now: evaluated once (no longer judged on progress)
    assert evaluated == [0] and rules.ranks[0].late
    for t in (5.0, 9.0):  # process timeout 10 s not due yet
        rules.evaluate(t)
    assert evaluated == [0]
    assert rules.ranks[0].heartbeat_age_s == 9.0
    findings = rules.evaluate(10.5)
    assert evaluated == [0, 0]
    assert [f.finding_type.value for f in findings] == ["rank_process_heartbeat_timeout"]


def test_the_monitor_wakes_when_a_timeout_runs_out(tmp_path: Any) -> None:
    import time

    from rankguard.monitor.monitor import JobMonitor

    mon = JobMonitor(heartbeat_config(), tmp_path, RUN, expected_world_size=1, check_pids=False)
    now = time.monotonic()
    mon.rules.ingest(heartbeat_record(0, 1, run_id=RUN, world_size=1, since=0.0), now - 9.5)
    assert mon.scan_once() == []
    due = mon.rules.next_due()
    assert due is not None and abs(due - (now + 0.5)) < 1e-3  # process timeout 10 s
    assert abs(mon._wake_at(now + 100.0) - (now + 0.5)) < 0.01  # not the next interval
    assert mon._wake_at(now + 0.2) == now + 0.2  # the interval comes first


def test_the_ranks_of_a_host_are_indexed_for_the_pid_checks() -> None:
    """Node 0 checks the pids of its own host's ranks at every scan: it finds them
    without a pass over every rank's state; a rank that moved to another host stays
    listed (the check reads its latest record's host)."""
    from tests.factories import heartbeat_rules

    rules = heartbeat_rules(world=6)
    for rank in range(6):
        host = "node-a" if rank in (1, 4) else "node-b"
        rules.ingest(heartbeat_record(rank, hostname=host, world_size=6), 0.0)
    assert [s.rank for s in rules.ranks_on("node-a")] == [1, 4]
    assert [s.rank for s in rules.ranks_on("node-b")] == [0, 2, 3, 5]
    assert rules.ranks_on("node-c") == []
    moved = heartbeat_record(4, 1, pid=77, hostname="node-b", world_size=6, event="process_start")
    assert rules.ingest(moved, 1.0)
    assert [s.rank for s in rules.ranks_on("node-b")] == [0, 2, 3, 5, 4]
    assert [s.rank for s in rules.ranks_on("node-a")] == [1, 4]
    assert rules.ranks[4].record is not None and rules.ranks[4].record.hostname == "node-b"
