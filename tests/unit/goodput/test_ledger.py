"""The goodput ledger: synthetic run directories whose true timeline is known (each
part within 0.5 s, the sum within 1 % of the wall time), and the pure ledger."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from rankguard.goodput import Attempt, Part, build_ledger, read_ledger
from rankguard.util.procs import process_started_unix_s
from tests.unit.goodput.synthetic import T0, Rank0, append, iso, run_dir, train


def check(got: dict[Part, float], want: dict[Part, float], wall: float) -> None:
    for part in Part:
        assert got[part] == pytest.approx(want.get(part, 0.0), abs=0.5), part
    assert sum(got.values()) == pytest.approx(wall, rel=0.01)


def test_a_crash_and_a_restart_from_a_checkpoint(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    # attempt 0: 5 s start-up, 0.5 s steps, a 2 s save after iteration 10, a crash
    # after iteration 16; the finding 0.8 s later, the decision 1.5 s after the last step
    a0 = Rank0(d, pid=101, start=T0)
    t = T0 + 5.0
    a0.step(t)
    t = train(a0, t, 15, 0.5, {10: ("checkpointing", 2.0)})
    assert (a0.iteration, t) == (16, T0 + 14.5)
    a0.end(t + 0.3, clean=False)
    a0.write()
    append(
        d / "findings.jsonl",
        {"finding_type": "rank_process_exited", "rank": 0, "detected_wall_time": iso(t + 0.8)},
    )
    append(
        d / "restarts.jsonl",
        {
            "kind": "process",
            "restart": 1,
            "cause": "worker_failed",
            "wall_time": iso(t + 1.5),
            "decision": "restart",
        },
    )
    # attempt 1: starts 4 s after the decision, restored at iteration 10, 4 s start-up,
    # an eval of 1 s after iteration 20, done at iteration 30, 0.3 s of closing
    start = t + 5.5
    a1 = Rank0(d, pid=202, start=start, iteration=10)
    a1.record("heartbeat", start + 0.5)  # restored: iteration 10 before any step
    t = start + 4.0
    a1.step(t)
    t = train(a1, t, 19, 0.5, {20: ("eval", 1.0)})
    a1.set_phase("closing", t)
    a1.end(t + 0.3, clean=True)
    a1.write()
    wall = t + 0.3 - T0
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 2
    want = {
        Part.STARTUP: 5.0 + 4.0,
        Part.CHECKPOINT_STALL: 2.0,
        Part.EVALUATION: 1.0,
        Part.RECOMPUTED: 3.0,  # iterations 11-16 (the save after 10 is a save)
        Part.PRODUCTIVE: 4.5 + 9.5,  # iterations 2-10, then 12-30
        Part.DETECTION_WAIT: 1.5,
        Part.RECOVERY: 4.0,
        Part.UNKNOWN: 0.3,
    }
    assert sum(want.values()) == pytest.approx(wall)
    check(ledger.parts, want, wall)
    assert ledger.ettr == pytest.approx(14.0 / wall, abs=0.02)
    (cut,) = ledger.interruptions
    assert (cut.cause, cut.iteration, cut.resumed_from) == ("worker_failed", 16, 10)
    assert cut.first_evidence_s == pytest.approx(0.8, abs=0.01)
    assert cut.cost_s == pytest.approx(3.0 + 1.5 + 4.0 + 4.0, abs=0.5)


def test_no_checkpoint_every_step_is_recomputed_and_a_stop_ends_the_job(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=7, start=T0, interval=2.0)
    t = T0 + 3.0
    a0.step(t)
    t = train(a0, t, 9, 1.0, {})
    a0.end(t + 0.2, clean=False)
    a0.write()
    append(
        d / "restarts.jsonl",
        {"kind": "process", "restart": 1, "cause": "worker_failed", "wall_time": iso(t + 1.0)},
    )
    start = t + 3.0
    a1 = Rank0(d, pid=8, start=start, interval=2.0)
    t1 = start + 3.0
    a1.step(t1)
    t1 = train(a1, t1, 4, 1.0, {})
    a1.end(t1 + 0.5, clean=False)
    a1.write()
    append(
        d / "restarts.jsonl",
        {"kind": "stop", "restart": None, "cause": "worker_failed", "wall_time": iso(t1 + 2.0)},
    )
    ledger = read_ledger(d)
    assert ledger is not None
    wall = t1 + 2.0 - T0  # the job ends with the stop decision, after the rank's end
    want = {
        Part.STARTUP: 6.0,
        Part.RECOMPUTED: 9.0,  # attempt 1 started again from iteration 1
        Part.PRODUCTIVE: 4.0,
        Part.DETECTION_WAIT: 1.0 + 2.0,
        Part.RECOVERY: 2.0,
    }
    check(ledger.parts, want, wall)
    assert len(ledger.interruptions) == 2
    assert ledger.interruptions[0].resumed_from == 0


def test_a_job_that_never_made_a_step_is_all_startup(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=9, start=T0)
    a0.end(T0 + 4.0, clean=False)
    a0.write()
    append(
        d / "restarts.jsonl", {"kind": "stop", "cause": "worker_failed", "wall_time": iso(T0 + 4.2)}
    )
    ledger = read_ledger(d)
    assert ledger is not None and ledger.ettr == 0.0
    assert ledger.parts[Part.STARTUP] == pytest.approx(4.0, abs=0.01)


def test_no_heartbeat_of_rank_0_is_no_ledger(tmp_path: Path) -> None:
    assert read_ledger(run_dir(tmp_path)) is None


def test_the_parts_always_sum_to_the_wall_time() -> None:
    """Out-of-order, overlapping and missing events never break the sum."""
    rng = random.Random(7)
    for _ in range(500):
        attempts = []
        t = 0.0
        for _ in range(rng.randint(1, 4)):
            start = t + rng.uniform(-2, 3)
            steps = sorted(
                ((i, start + rng.uniform(-1, 20)) for i in range(rng.randint(0, 6))),
                key=lambda s: s[1],
            )
            phases = [
                (
                    rng.choice(["checkpointing", "eval", "rerun", "preempt", "train"]),
                    a,
                    a + rng.uniform(-1, 5),
                )
                for a in (start + rng.uniform(0, 20) for _ in range(rng.randint(0, 3)))
            ]
            end = start + rng.uniform(0, 25)
            attempts.append(
                Attempt(
                    start=start,
                    end=end,
                    steps=steps,
                    phases=phases,
                    resumed_from=rng.choice([None, 0, 2, 10]),
                    failed=rng.random() < 0.5,
                    decision=rng.choice([None, end + rng.uniform(-3, 3)]),
                )
            )
            t = end
        ledger = build_ledger(attempts)
        assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s, abs=1e-6)
        assert all(v >= 0 for v in ledger.parts.values())
        # the timeline: consecutive spans from start to end, each part's total
        edges = [ledger.start] + [b for _, b, _ in ledger.spans]
        assert [a for a, _, _ in ledger.spans] == edges[:-1]
        assert edges[-1] == pytest.approx(ledger.end) or not ledger.spans
        for part in Part:
            total = sum(b - a for a, b, p in ledger.spans if p is part)
            assert total == pytest.approx(ledger.parts[part], abs=1e-6)


def test_build_ledger_needs_an_attempt() -> None:
    with pytest.raises(ValueError, match="attempts"):
        build_ledger([])


def test_a_hang_then_a_crash_then_completion(tmp_path: Path) -> None:
    """Attempt 0 hangs (the heartbeat thread goes on writing; the progress finding 4 s
    after the last step, the decision 0.5 s later, the process killed 0.5 s after that);
    attempt 1 resumes at 5 and crashes; attempt 2 resumes at 10 and completes."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=1, start=T0, interval=0.7)
    t = T0 + 2.0
    a0.step(t)
    t = train(a0, t, 7, 0.5, {5: ("checkpointing", 1.0)})  # iterations 2-8
    hang_at = t
    a0.idle_to(t + 5.0)  # hung: records without progress until the kill
    a0.write()
    append(
        d / "findings.jsonl",
        {
            "finding_type": "gpu_progress_timeout",
            "rank": 0,
            "detected_wall_time": iso(hang_at + 4.0),
        },
    )
    append(
        d / "restarts.jsonl",
        {
            "kind": "process",
            "restart": 1,
            "cause": "gpu_progress_timeout",
            "wall_time": iso(hang_at + 4.5),
        },
    )
    start1 = hang_at + 7.0
    a1 = Rank0(d, pid=2, start=start1, interval=0.7, iteration=5)
    a1.record("heartbeat", start1 + 0.2)
    t = start1 + 2.5
    a1.step(t)  # iteration 6
    t = train(a1, t, 6, 0.5, {10: ("checkpointing", 1.0)})  # 7-12
    a1.end(t + 0.1, clean=False)
    a1.write()
    crash_at = t
    append(
        d / "restarts.jsonl",
        {
            "kind": "process",
            "restart": 2,
            "cause": "worker_failed",
            "wall_time": iso(crash_at + 1.0),
        },
    )
    start2 = crash_at + 3.0
    a2 = Rank0(d, pid=3, start=start2, interval=0.7, iteration=10)
    a2.record("heartbeat", start2 + 0.2)
    t = start2 + 2.0
    a2.step(t)  # iteration 11
    t = train(a2, t, 9, 0.5, {})  # 12-20
    a2.end(t + 0.2, clean=True)
    a2.write()
    wall = t + 0.2 - T0
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 3
    want = {
        Part.STARTUP: 2.0 + 2.5 + 2.0,
        Part.CHECKPOINT_STALL: 1.0 + 1.0,
        # attempt 0: 6-8 redone (1.5 s); attempt 1: 11-12 redone (1.0 s)
        Part.RECOMPUTED: 1.5 + 1.0,
        # attempt 0: 2-5 (2.0 s); attempt 1: 7-10 (2.0 s); attempt 2: 12-20 (4.5 s)
        Part.PRODUCTIVE: 2.0 + 2.0 + 4.5,
        Part.DETECTION_WAIT: 4.5 + 1.0,
        Part.RECOVERY: 2.5 + 2.0,
        Part.UNKNOWN: 0.2,
    }
    assert sum(want.values()) == pytest.approx(wall)
    check(ledger.parts, want, wall)
    hang, crash = ledger.interruptions
    assert (hang.cause, hang.iteration, hang.resumed_from) == ("gpu_progress_timeout", 8, 5)
    assert hang.first_evidence_s == pytest.approx(4.0, abs=0.01)
    assert (crash.cause, crash.iteration, crash.resumed_from) == ("worker_failed", 12, 10)


def test_resumed_from_a_checkpoint_as_the_demo_records_it(tmp_path: Path) -> None:
    """As a real resumed rank records it: its first record after the first step still
    names the checkpoint's iteration (``iteration_source`` checkpoint, ``progress_seq`` 1)
    and perf's first window counts its own iterations from 1."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=11, start=T0, interval=5.0)
    t = T0 + 4.0
    a0.step(t)
    t = train(a0, t, 13, 0.5, {10: ("checkpointing", 0.5)})  # iterations 2-14
    a0.end(t + 0.1, clean=False)
    a0.write()
    append(
        d / "restarts.jsonl",
        {"kind": "process", "restart": 1, "cause": "worker_failed", "wall_time": iso(t + 1.0)},
    )
    start = t + 3.0
    a1 = Rank0(d, pid=12, start=start, interval=5.0)
    first = start + 4.0
    a1.progress, a1.last_progress, a1.iteration, a1.phase = 1, first, 10, "train"
    a1.perf.append({"iteration": 1, "step": 1, "timestamp": iso(first), "includes_startup": True})
    a1.record("heartbeat", first + 0.2, iteration_source="checkpoint")
    t1 = train(a1, first, 9, 0.5, {})  # iterations 11-19 (the script's own numbers)
    a1.end(t1 + 0.1, clean=True)
    a1.write()
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert cut.resumed_from == 10
    want = {
        Part.STARTUP: 4.0 + 4.0,
        Part.CHECKPOINT_STALL: 0.5,
        Part.RECOMPUTED: 2.0,  # iterations 11-14 of attempt 0
        Part.PRODUCTIVE: 4.5 + 4.5,
        Part.DETECTION_WAIT: 1.0,
        Part.RECOVERY: 2.0,
        Part.UNKNOWN: 0.1,
    }
    check(ledger.parts, want, t1 + 0.1 - T0)


def test_work_redone_after_a_restart_that_failed_in_its_start_up_is_recomputed() -> None:
    """The attempt after a crash fails in its start-up (a process group that does not
    form), before it restores anything; the one after it resumes from the checkpoint at
    step 5: steps 6-10 of the first attempt are done again."""
    steps = [(i, 10.0 + i) for i in range(1, 11)]  # step i ends at 10 + i s
    attempts = [
        Attempt(start=0.0, end=21.0, steps=steps, failed=True, decision=21.0),
        Attempt(start=22.0, end=30.0, failed=True, decision=30.0),  # no step, no restore
        Attempt(start=31.0, end=50.0, steps=[(i, 35.0 + i) for i in range(6, 16)], resumed_from=5),
    ]
    ledger = build_ledger(attempts)
    assert ledger.parts[Part.RECOMPUTED] == pytest.approx(5.0)  # 15 s -> 20 s (steps 6-10)
    assert ledger.parts[Part.PRODUCTIVE] == pytest.approx(4.0 + 9.0)  # 11 -> 15, 41 -> 50
    assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s)
    # an attempt that made steps without saying where it resumed: nothing is guessed
    attempts[1] = Attempt(start=22.0, end=30.0, steps=[(3, 25.0)], failed=True)
    assert build_ledger(attempts).parts[Part.RECOMPUTED] == 0.0


def test_the_wall_time_runs_from_the_launch(tmp_path: Path) -> None:
    """rank 0's first process starts after the launcher's own start, the rendezvous and
    its interpreter's imports: start-up, from the launcher's start in its file (a later
    launch into the same directory, a job retry, starts no earlier than it)."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=101, start=T0)
    a0.step(T0 + 2.0)
    t = train(a0, T0 + 2.0, 10, 0.5, {})
    a0.set_phase("closing", t)
    a0.end(t, clean=True)
    a0.write()
    launcher = d / "launcher_node_0.json"
    launcher.write_text(json.dumps({"node_rank": 0, "started_unix_s": T0 - 6.0}))
    ledger = read_ledger(d)
    assert ledger is not None and ledger.start == T0 - 6.0
    check(ledger.parts, {Part.STARTUP: 6.0 + 2.0, Part.PRODUCTIVE: 5.0}, 13.0)
    for later in (T0 + 30.0, "soon", None):  # a later launch, a bad value, none
        launcher.write_text(json.dumps({"node_rank": 0, "started_unix_s": later}))
        ledger = read_ledger(d)
        assert ledger is not None and ledger.start == T0 and ledger.wall_s == 7.0


def test_the_wall_time_runs_to_the_launchers_end(tmp_path: Path) -> None:
    """rank 0 writes its last record before its interpreter's exit (torch's teardown:
    seconds on a loaded machine), and the launcher sees the ranks gone after that: the
    job ends at the launcher's ``ended_unix_s``, the span after the last record is
    closing (unknown), for a failed last attempt detection wait; an earlier launch's end
    (a job retry's file not yet rewritten) or a bad value is not taken."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=101, start=T0)
    a0.step(T0 + 2.0)
    t = train(a0, T0 + 2.0, 10, 0.5, {})
    a0.set_phase("closing", t)
    a0.end(t + 0.2, clean=True)
    a0.write()
    launcher = d / "launcher_node_0.json"
    launched = {"node_rank": 0, "started_unix_s": T0 - 6.0}
    launcher.write_text(json.dumps({**launched, "ended_unix_s": t + 3.2}))
    ledger = read_ledger(d)
    assert ledger is not None and ledger.end == t + 3.2
    check(ledger.parts, {Part.STARTUP: 8.0, Part.PRODUCTIVE: 5.0, Part.UNKNOWN: 3.2}, 16.2)
    for stale in (T0 - 1.0, "soon", None):  # before the last attempt's start, bad, none
        launcher.write_text(json.dumps({**launched, "ended_unix_s": stale}))
        ledger = read_ledger(d)
        assert ledger is not None and ledger.end == t + 0.2
    d2 = run_dir(tmp_path / "failed")
    a1 = Rank0(d2, pid=102, start=T0)
    a1.step(T0 + 2.0)
    t = train(a1, T0 + 2.0, 4, 0.5, {})
    a1.end(t + 0.5, clean=False)
    a1.write()
    (d2 / "launcher_node_0.json").write_text(json.dumps({**launched, "ended_unix_s": t + 4.0}))
    ledger = read_ledger(d2)
    assert ledger is not None
    check(ledger.parts, {Part.STARTUP: 8.0, Part.PRODUCTIVE: 2.0, Part.DETECTION_WAIT: 4.0}, 14.0)


def test_a_process_start_in_epoch_seconds() -> None:
    started = process_started_unix_s(os.getpid())
    assert started is not None and started <= time.time()
    assert time.time() - started < 24 * 3600  # this test's interpreter, not the boot
    assert process_started_unix_s(-1) is None
