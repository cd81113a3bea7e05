"""The status counts kept up to date (:class:`~rankguard.monitor.tally.Tally`), the worst
ranks taken from them and the ages computed where read equal a full recount over every
rank after every scan, on random histories: records that advance, stall, change phase,
save, end (cleanly, with an error, a peer's error, vanished), silences, restarts, a
replaced process, a monitor held up, GPUs turning unhealthy, disks filling, the
launcher's shutdown and restarts, a smaller group (retired ranks) and the run's end."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rankguard.monitor.rules import HeartbeatRules, RankState
from rankguard.monitor.status import counts, n_ranks, worst_of, worst_ranks
from rankguard.monitor.tally import notable
from rankguard.schema.records import HeartbeatRecord
from rankguard.util.disk import DiskState
from tests.factories import heartbeat_config, heartbeat_record

RUN = "run-tally"
WORLD = 8
PER_NODE = 2

HISTORY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a failure shows as found
)

_KINDS = ["advance"] * 6 + ["stall"] * 4 + ["phase", "save", "end", "error", "peer", "vanish"]


def _history(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """``n`` random steps of a job, weighted so that ranks stall, go silent and end."""
    steps: list[tuple[Any, ...]] = []
    quiet: set[int] = set()  # ranks that stopped publishing for a while
    stuck: set[int] = set()  # ranks that publish without progress for a while
    for _ in range(n):
        roll = rng.random()
        if roll < 0.45:
            if rng.random() < 0.1:
                quiet ^= {rng.randrange(WORLD)}
            if rng.random() < 0.15:
                stuck ^= {rng.randrange(WORLD)}
            kind = rng.choice(_KINDS[:12])  # every rank at once: no ends
            steps += [
                ("beat", r, "stall" if r in stuck else kind) for r in range(WORLD) if r not in quiet
            ]
            steps.append(("scan", 0))
        elif roll < 0.60:
            steps.append(("beat", rng.randrange(WORLD), rng.choice(_KINDS)))
        elif roll < 0.75:
            steps.append(("wait", rng.choice([0.5, 1.0, 2.0, 4.0, 11.0, 25.0])))
        elif roll < 0.80:
            steps.append(("restart", rng.randrange(WORLD)))
        elif roll < 0.82:
            steps.append(("replaced", rng.randrange(WORLD)))
        elif roll < 0.85:
            steps.append(("held", rng.choice([2.0, 12.0])))
        elif roll < 0.88:
            steps.append(("health", rng.randrange(WORLD // PER_NODE)))
        elif roll < 0.90:
            steps.append(("disk", rng.random() < 0.5))
        elif roll < 0.905:
            steps.append(("shutdown", 0))
        elif roll < 0.92:
            steps.append(("group_restart", rng.random() < 0.5))
        elif roll < 0.93:
            steps.append(("retire", rng.randrange(WORLD // 2, WORLD)))
        elif roll < 0.935:
            steps.append(("end_run", 0))
        else:
            steps.append(("scan", 0))
    return steps


class _Job:
    def __init__(self) -> None:
        self.rules = HeartbeatRules(
            heartbeat_config(
                status_worst_ranks=3, progress_timeout_s=5.0, initial_progress_timeout_s=8.0
            ),
            RUN,
            expected_world_size=None,
            max_world_size=WORLD,
            started_at=0.0,
            section_timeouts={"data": 15.0},
        )
        self.now = 0.0
        self.seq = dict.fromkeys(range(WORLD), 0)
        self.pid = {r: 1000 + r for r in range(WORLD)}
        self.step = dict.fromkeys(range(WORLD), 0)
        self.last_step = dict.fromkeys(range(WORLD), 0.0)
        self.ended: set[int] = set()
        self.unhealthy: set[int] = set()

    def health_for(self, rec: HeartbeatRecord) -> dict[str, Any] | None:
        if (rec.node_rank or 0) in self.unhealthy:
            return {"health": "unhealthy", "stale": False, "problems": []}
        return None

    def beat(self, rank: int, kind: str) -> None:
        if rank in self.ended:
            return
        self.seq[rank] += 1
        extra: dict[str, Any] = {}
        phase, event = "train", "heartbeat"
        if kind == "advance":
            self.step[rank] += 1
            self.last_step[rank] = self.now
        elif kind == "phase":
            phase = "data" if self.seq[rank] % 2 else "eval"
        elif kind in ("end", "error", "peer", "vanish"):
            event, clean = "process_end", kind == "end"
            error = {"error": "RuntimeError: boom", "peer": "Connection closed by peer"}
            extra["exit"] = {
                "clean": clean,
                "exit_code": 0 if clean else 1,
                "error": error.get(kind),
            }
            if kind == "vanish":
                extra["exit"]["vanished"] = True
            self.ended.add(rank)
        self.rules.ingest(
            heartbeat_record(
                rank,
                self.seq[rank],
                self.pid[rank],
                run_id=RUN,
                event=event,
                t=self.now,
                node_rank=rank // PER_NODE,
                ranks_per_node=PER_NODE,
                hostname=f"node{rank // PER_NODE}",
                world_size=WORLD,
                progress_seq=self.step[rank],
                since=round(self.now - self.last_step[rank], 3),
                phase=phase,
                phase_elapsed=0.5,
                checkpoint_active=kind == "save",
                monotonic_ns=int(self.now * 1e9),
                **extra,
            ),
            self.now,
        )

    def apply(self, step: tuple[Any, ...]) -> None:
        rules, what = self.rules, step[0]
        if what == "beat":
            self.beat(step[1], step[2])
        elif what == "wait":
            self.now += step[1]
        elif what == "scan":
            self.scan()
        elif what == "restart":
            rank = step[1]
            self.pid[rank] += 100
            self.seq[rank] = -1
            self.ended.discard(rank)
            self.beat(rank, "advance")
        elif what == "replaced":
            rules.note_replaced(step[1], self.pid[step[1]])
        elif what == "held":
            rules.observer_held(self.now - step[1], self.now)
        elif what == "health":
            self.unhealthy ^= {step[1]}
            rules.mark_node(step[1])
        elif what == "disk":
            rules.note_disk(None, DiskState(full=step[1], free_bytes=1, total_bytes=2), self.now)
        elif what == "shutdown":
            rules.note_shutdown("SIGTERM")
        elif what == "group_restart":
            rules.note_restart("test restart", cause_pending=step[1], now=self.now)
        elif what == "retire":
            rules.retire_ranks(step[1], self.now)
        elif what == "end_run":
            rules.end_run()

    def scan(self) -> None:
        self.now += 1.0
        self.rules.evaluate(self.now, self.health_for)
        check(self.rules, self.now)


def _recount(states: list[RankState]) -> tuple[Any, ...]:
    return (
        Counter(s.liveness for s in states),
        Counter(s.progress for s in states),
        sum(len(s.reported) for s in states if s.active),
        sum(1 for s in states if s.record is not None),
        {s.rank for s in states if notable(s)},
    )


def check(rules: HeartbeatRules, now: float) -> None:
    """The tally, the worst ranks and the ages against a full pass over every rank."""
    states = list(rules.ranks.values())
    tally = rules.tally
    tally.update(rules.ranks)
    kept = (
        +tally.liveness,  # (without the zero counts of a state left)
        +tally.progress,
        tally.findings,
        tally.observed,
        tally.notable,
    )
    assert kept == _recount(states)
    for n in (1, 3, WORLD):
        assert [s.rank for s in worst_of(rules, n)] == [s.rank for s in worst_ranks(states, n)]
    _, summary, _ = counts(rules, 0, 3)  # a large job's counts: the tally's
    assert summary.findings_active == tally.findings
    assert summary.ranks_observed == tally.observed
    assert sum(summary.process_liveness.values()) == n_ranks(rules)
    for s in states:
        if s.seen_at is None or s.record is None:
            continue
        assert s.heartbeat_age_s == now - s.seen_at
        since = s.record.since_progress_s
        assert s.progress_age_s == (None if since is None else now - s.seen_at + since)


@HISTORY
@given(st.integers(0, 2**32))
def test_the_counts_kept_equal_a_full_recount_after_every_scan(seed: int) -> None:
    job = _Job()
    for step in _history(random.Random(seed), 150):
        job.apply(step)
    job.scan()


def test_a_long_steady_job_keeps_its_counts_and_worst_ranks() -> None:
    """Many scans of mostly advancing ranks (the fast path), a rank going silent, one
    stalling, one ending in error: the kept counts and the anchors' order hold."""
    job = _Job()
    for i in range(120):
        for rank in range(WORLD):
            if rank == 3 and i > 40:
                continue  # silent: stale, then its timeout
            job.beat(rank, "stall" if rank == 5 and i > 60 else "advance")
        if i == 90:
            job.beat(6, "error")
        job.now += 0.5
        job.scan()
    assert job.rules.tally.notable  # the silent, the stalled and the failed rank


def test_a_monitor_hold_moves_the_progress_anchors_on() -> None:
    """The monitor held from 1 s to 9 s: each rank's silence is counted without the
    hold, so the rank longest without progress changes; the kept anchors follow."""
    cfg = heartbeat_config(publish_interval_s=5.0, process_timeout_s=30.0, progress_timeout_s=90.0)
    rules = HeartbeatRules(cfg, RUN, expected_world_size=2, started_at=0.0)
    for rank, seen, since in ((0, 0.0, 3.0), (1, 8.0, 10.0)):
        rec = heartbeat_record(rank, 1, run_id=RUN, t=seen, progress_seq=4, since=since)
        assert rules.ingest(rec, seen)
    rules.evaluate(8.0)
    assert [s.rank for s in worst_of(rules, 1)] == [0]  # 11 s without progress, rank 1 10 s
    rules.observer_held(1.0, 9.0)
    rules.evaluate(9.0)
    assert [s.rank for s in worst_ranks(list(rules.ranks.values()), 1)] == [1]  # 4 s vs 10 s
    assert [s.rank for s in worst_of(rules, 1)] == [1]
