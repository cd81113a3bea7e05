"""The interruption at the step the ranks really reached: rank 0, stopped by the agent
while it waited in a collective on its failed peer, wrote its last heartbeat steps
before that; the failed peer's own exit record (written before the agent could see it
gone) has the step count every rank had completed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankguard.goodput import Part, read_ledger
from tests.unit.goodput.synthetic import T0, Rank0, append, iso, run_dir, train


def _crash_at_step_9(d: Path, *, peer_end: bool = True) -> tuple[float, float]:
    """Attempt 0: both ranks complete steps 1-8 (1 s each from T0 + 3), rank 1 raises
    in step 9 and writes its exit record (``peer_end``; else it is stopped too, its
    last heartbeat the last word), rank 0 is stopped without one. Attempt 1 runs 5
    steps from iteration 0. The times of step 1 and step 8."""
    a0 = Rank0(d, pid=7, start=T0, interval=2.0)
    p0 = Rank0(d, pid=8, start=T0, rank=1, interval=0.5)
    for rank in (a0, p0):
        rank.step(T0 + 3.0)
        train(rank, T0 + 3.0, 7, 1.0, {})
    last = T0 + 10.0
    # rank 0's last record (stopped 0.3 s after step 8 without another): before step 7
    assert a0.iteration == 8 and a0.records[-1]["iteration"] == 6
    if peer_end:
        p0.end(last + 0.2, clean=False)
    else:
        p0.idle_to(last + 0.3)
    for rank in (a0, p0):
        rank.write()
    append(
        d / "restarts.jsonl",
        {"kind": "process", "restart": 1, "cause": "worker_failed", "wall_time": iso(last + 1.0)},
    )
    start = last + 3.0
    a1 = Rank0(d, pid=17, start=start, interval=2.0)
    p1 = Rank0(d, pid=18, start=start, rank=1, interval=0.5)
    for rank in (a1, p1):
        rank.step(start + 2.0)
        train(rank, start + 2.0, 4, 1.0, {})
        rank.end(start + 6.5, clean=True)
        rank.write()
    return T0 + 3.0, last


def test_a_peer_s_exit_record_gives_the_step_rank_0_reached_after_its_last_record(
    tmp_path: Path,
) -> None:
    d = run_dir(tmp_path)
    first, last = _crash_at_step_9(d)
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert cut.iteration == 8 and cut.at == pytest.approx(last, abs=1e-3)
    assert cut.resumed_from == 0
    # rank 1's exit on its error, 0.2 s after step 8, is the first evidence
    assert cut.first_evidence_s == pytest.approx(0.2, abs=1e-3)
    # steps 1-8 are done again; step 8 -> the restart decision is the detection wait
    assert cut.parts[Part.RECOMPUTED] == pytest.approx(last - first, abs=1e-3)
    assert cut.parts[Part.DETECTION_WAIT] == pytest.approx(1.0, abs=1e-3)
    assert ledger.parts[Part.PRODUCTIVE] == pytest.approx(4.0, abs=1e-3)
    assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s)


def test_a_peer_stopped_too_gives_its_last_heartbeat(tmp_path: Path) -> None:
    """Every rank stopped by a signal: the freshest heartbeat of any rank (rank 1's,
    0.5 s apart, has step 8) is what the run directory knows."""
    d = run_dir(tmp_path)
    _, last = _crash_at_step_9(d, peer_end=False)
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert cut.iteration == 8 and cut.at == pytest.approx(last, abs=1e-3)
    assert cut.first_evidence_s is None  # no rank said it failed


def test_a_peer_s_last_record_is_read_from_the_end_of_a_long_file(tmp_path: Path) -> None:
    """A peer's file far longer than its end that is read first, its last record longer
    too, and its last line still being written: the last whole record counts."""
    d = run_dir(tmp_path)
    _, last = _crash_at_step_9(d)
    path = d / "rank_1_pid_8.heartbeat.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[-1]["pad"] = "x" * 20_000  # a big block in the exit record
    pad = [{"event": "heartbeat", "pad": "x" * 1000}] * 100
    lines = [json.dumps(r) + "\n" for r in [records[0], *pad, *records[1:]]]
    path.write_text("".join(lines) + '{"event": "heartb')
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert cut.iteration == 8 and cut.at == pytest.approx(last, abs=1e-3)
    assert cut.first_evidence_s == pytest.approx(0.2, abs=1e-3)


def test_a_peer_s_count_from_before_rank_0_went_back_is_not_taken(tmp_path: Path) -> None:
    """Rank 1's last record has iteration 8, written before rank 0's last steps: rank 0
    re-entered in-process and went back to iteration 5, then reached 7. The attempt ended
    at 7 (a peer's step counts only after rank 0's last one)."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=7, start=T0, interval=0.5)
    p0 = Rank0(d, pid=8, start=T0, rank=1, interval=0.5)
    for rank in (a0, p0):
        rank.step(T0 + 3.0)
        train(rank, T0 + 3.0, 7, 1.0, {})
    p0.end(T0 + 10.2, clean=False)
    a0.reenter(T0 + 10.5, T0 + 12.0, iteration=5)
    train(a0, T0 + 12.0, 2, 1.0, {})
    a0.end(T0 + 14.5, clean=False)
    for rank in (a0, p0):
        rank.write()
    append(
        d / "restarts.jsonl",
        {"kind": "stop", "restart": None, "cause": "worker_failed", "wall_time": iso(T0 + 15.0)},
    )
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = [c for c in ledger.interruptions if c.kind == "restart"]
    assert cut.iteration == 7 and cut.at == pytest.approx(T0 + 14.0, abs=1e-3)
    assert cut.first_evidence_s == pytest.approx(0.5, abs=1e-3)  # rank 0's own exit
