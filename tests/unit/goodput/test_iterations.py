"""Each interruption names the iteration it happened at and the one training resumed
after, from where the events happen: the rank's step clock (rank 0's heartbeats and
perf windows) and the launcher's ``restarts.jsonl``. The run directories are written as
a real run writes them: heartbeats seconds apart, the script numbering its steps, an
in-process re-entry that marks the rank recovered without a step, saves that count as
progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.cli.goodput import render
from rankguard.goodput import Attempt, LiveRecovery, Part, build_ledger, read_ledger
from rankguard.goodput.status import goodput_block
from rankguard.report.goodput import goodput_html
from tests.unit.goodput.synthetic import T0, Rank0, append, iso, run_dir, train


def _live_line(**over: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "kind": "live_recovery",
        "restart": 1,
        "rank": 2,
        "lost_rank": 2,
        "lost_pid": 9002,
        "standby_pid": 9100,
        "cause": "rank_process_exited",
        "recovery_s": None,
        **over,
    }


def test_a_live_recovery_as_the_demo_records_it(tmp_path: Path) -> None:
    """4 ranks and a standby, rank 2 killed after step 10: rank 0's step 11 times out in
    its collective, it re-enters in process (marked recovered: its last progress moves,
    no step), the standby's first step is step 11 (``resumed_step`` 11, nothing redone).
    Rank 0's heartbeats come 5 s apart; one at the re-entry still counts 10 steps. The
    ledger said "at iteration 1 ... resumed after iteration 1"."""
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=101, start=T0, interval=5.0, iteration_source="script")
    rank.step(T0 + 5.0)
    step10 = train(rank, T0 + 5.0, 9, 0.35, {})  # iterations 2-10
    assert rank.iteration == 10
    rank.reenter(T0 + 9.2, T0 + 10.1)  # the collective's timeout, then back
    fault, resumed = T0 + 9.3, T0 + 11.0
    step20 = train(rank, resumed - 0.35, 10, 0.35, {})  # iterations 11-20
    rank.end(step20 + 0.3, clean=True)
    rank.write()
    append(
        d / "restarts.jsonl",
        _live_line(
            fault_t=round(fault, 3),
            resumed_t=round(resumed, 3),
            steps_redone=0,
            resumed_step=11,
            wall_time=iso(resumed + 0.4),
        ),
    )
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert (cut.kind, cut.iteration, cut.resumed_from) == ("live_recovery", 10, 10)
    assert cut.at == pytest.approx(step10, abs=0.01)
    assert cut.first_evidence_s == pytest.approx(fault - step10, abs=0.01)
    assert cut.parts[Part.DETECTION_WAIT] == pytest.approx(fault - step10, abs=0.01)
    assert cut.parts[Part.RECOVERY] == pytest.approx(resumed - fault, abs=0.01)
    text = render(ledger, d.name)
    assert "at iteration 10:" in text and "resumed after iteration 10" in text
    # the report's timeline and table, and status.json's block, read the same ledger
    html = goodput_html(read_ledger(d))
    assert "rank_process_exited at iteration 10," in html
    assert '<td class="num">10</td><td class="num">10</td>' in html
    block = goodput_block(ledger, final=True).to_dict()  # as status.json holds it
    assert block["ettr"] == round(ledger.ettr or 0, 3)
    assert block["parts_s"]["detection_wait"] == pytest.approx(fault - step10, abs=0.01)


def test_a_live_recovery_names_the_step_every_rank_ran_next() -> None:
    """The fault came 5 steps after the last sampled step: ``resumed_step`` 16 and 5 steps
    redone say it was at iteration 20 and training went on after 15 (the sample said 13
    and 8)."""
    steps = [(1, 5.0), (10, 9.5), (13, 11.0)]  # samples: the last one before the fault
    steps += [(16, 15.0), (30, 22.0)]
    live = LiveRecovery(fault=13.0, resumed=15.0, steps_redone=5, resumed_step=16)
    ledger = build_ledger([Attempt(start=0.0, end=22.5, steps=steps, live=[live])])
    (cut,) = ledger.interruptions
    assert (cut.iteration, cut.resumed_from) == (20, 15)
    assert cut.at == pytest.approx(11.0)  # the last step seen at or before iteration 20
    assert sum(ledger.parts.values()) == pytest.approx(22.5)


def test_the_launcher_line_s_resumed_step_reaches_the_ledger(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=101, start=T0, interval=5.0, iteration_source="script")
    rank.step(T0 + 2.0)
    train(rank, T0 + 2.0, 29, 0.5, {})  # iterations 2-30, to T0 + 16.5
    rank.end(T0 + 17.0, clean=True)
    rank.write()
    line = _live_line(fault_t=T0 + 9.2, resumed_t=T0 + 10.0, steps_redone=2, resumed_step=14)
    append(d / "restarts.jsonl", line)
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert (cut.iteration, cut.resumed_from) == (15, 13)


def test_a_restart_resumes_where_the_first_records_say_saves_left_out(tmp_path: Path) -> None:
    """Attempt 1 numbers its steps (resumed at 10 from its checkpoint) and its first
    record comes after 6 steps and a save: 7 progress steps, 1 of them a save. It
    resumed after iteration 10, not 9."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=11, start=T0, interval=0.5, iteration_source="script")
    a0.step(T0 + 3.0)
    t = train(a0, T0 + 3.0, 15, 0.5, {})  # iterations 2-16
    a0.end(t + 0.1, clean=False)
    a0.write()
    append(
        d / "restarts.jsonl",
        {"kind": "process", "restart": 1, "cause": "worker_failed", "wall_time": iso(t + 1.0)},
    )
    start = t + 3.0
    a1 = Rank0(d, pid=12, start=start, interval=30.0, iteration_source="script")
    first = start + 3.0
    # no record until then: 6 steps (11-16) and a save after 15
    a1.progress, a1.checkpoint_count, a1.iteration = 7, 1, 16
    a1.last_progress, a1.phase, a1.phase_since = first + 3.0, "train", first
    a1.record("heartbeat", first + 3.2)
    a1.step(first + 3.5)  # 17
    a1.end(first + 3.6, clean=True)
    a1.write()
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert (cut.iteration, cut.resumed_from) == (16, 10)


def test_a_job_retry_after_a_re_entry_keeps_the_last_step_s_time(tmp_path: Path) -> None:
    """Attempt 0 re-entered in process after iteration 12 and then failed for good; a
    second launch into the same directory (no decision line) resumed from iteration 10.
    The re-entry's recovered mark is no step: the interruption is at iteration 12's
    end, not at the mark."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=21, start=T0, interval=5.0, iteration_source="script")
    a0.step(T0 + 3.0)
    step12 = train(a0, T0 + 3.0, 11, 0.5, {})  # iterations 2-12
    a0.reenter(step12 + 1.0, step12 + 2.0)
    a0.end(step12 + 2.5, clean=False)
    a0.write()
    start = step12 + 10.0
    a1 = Rank0(d, pid=22, start=start, interval=5.0, iteration=10)
    a1.record("heartbeat", start + 0.2, iteration_source="checkpoint")  # restored: 10
    a1.iteration_source = "script"
    a1.step(start + 3.0)  # 11
    t = train(a1, start + 3.0, 9, 0.5, {})  # 12-20
    a1.end(t + 0.1, clean=True)
    a1.write()
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 2
    reentry, cut = ledger.interruptions
    assert (reentry.kind, reentry.iteration, reentry.resumed_from) == ("inprocess", 12, None)
    assert (cut.kind, cut.iteration, cut.resumed_from) == ("restart", 12, 10)
    assert cut.at == pytest.approx(step12, abs=0.01)
    # iterations 11 and 12 of attempt 0 were done again
    assert cut.parts[Part.RECOMPUTED] == pytest.approx(1.0, abs=0.01)


def test_a_run_directory_given_as_a_relative_path(tmp_path: Path, monkeypatch: Any) -> None:
    """``rankguard goodput .`` in the run directory: the perf windows (beside it, two
    levels up) are read as with its full path, and the ledger is named after it."""
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=31, start=T0, interval=5.0, iteration_source="script")
    rank.step(T0 + 4.0)  # only perf's first window sees this step's end
    t = train(rank, T0 + 4.0, 19, 0.5, {})
    rank.end(t + 0.2, clean=True)
    rank.write()
    full = read_ledger(d)
    monkeypatch.chdir(d)
    here = read_ledger(".")
    assert full is not None and here is not None
    assert here.parts[Part.STARTUP] == pytest.approx(4.0, abs=0.01)
    assert here.to_dict() == full.to_dict()
    from rankguard.cli.goodput import _main

    class Args:
        run_dir = Path(".")
        json = False

    import io
    import sys

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert _main(Args()) == 0  # type: ignore[arg-type]
    assert out.getvalue().startswith(f"goodput of {d.name}:")


def test_an_in_process_re_entry_is_an_interruption(tmp_path: Path) -> None:
    """Every rank re-entered its training function after iteration 12 (a rank raised);
    the script rolled back to its in-memory state of iteration 10 and went on with 11.
    The re-entry's own interruption: at 12, resumed after 10; its parts: the wait from
    iteration 12's end to the re-entry, its phase, and iterations 11-12 done again."""
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=41, start=T0, interval=5.0, iteration_source="script")
    rank.step(T0 + 3.0)
    step12 = train(rank, T0 + 3.0, 11, 0.5, {})  # iterations 2-12
    rank.reenter(step12 + 0.4, step12 + 1.6, iteration=10)
    t = train(rank, step12 + 1.6, 10, 0.5, {})  # 11-20
    rank.end(t + 0.2, clean=True)
    rank.write()
    ledger = read_ledger(d)
    assert ledger is not None
    (cut,) = ledger.interruptions
    assert (cut.kind, cut.iteration, cut.resumed_from) == ("inprocess", 12, 10)
    assert cut.at == pytest.approx(step12, abs=0.01)
    want = {Part.DETECTION_WAIT: 0.4, Part.RECOVERY: 1.2, Part.RECOMPUTED: 1.0}
    assert cut.parts == {p: pytest.approx(v, abs=0.01) for p, v in want.items()}
    for part, seconds in want.items():
        assert ledger.parts[part] == pytest.approx(seconds, abs=0.01), part
    assert cut.first_evidence_s == pytest.approx(0.4, abs=0.01)
    assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s)
    assert "in-process re-entry in attempt 0 (in-process re-entry) at iteration 12" in render(
        ledger, d.name
    )
