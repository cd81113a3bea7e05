"""``bench/goodput.py``: its seeded fault schedule, the ledger it builds from a
launcher's console, and its smoke run (``test_bench_smoke.py`` leaves it to this test,
which asserts more of it)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rankguard.goodput import Interruption, Ledger, Part
from tests.bench import forked

pytestmark = [pytest.mark.bench, pytest.mark.timeout(400)]  # minutes on a loaded machine

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("goodput_bench", ROOT / "bench" / "goodput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_schedule_is_seeded_and_mixes_every_kind() -> None:
    bench = _bench()
    faults = bench.schedule(0, 10, 60)
    assert faults == bench.schedule(0, 10, 60) and faults != bench.schedule(1, 10, 60)
    assert len(faults) == 9  # one a minute, none in the last half minute
    for k, (t, _) in enumerate(faults, 1):
        assert 60 * k - 12 <= t <= 60 * k + 12
    kinds = [kind for _, kind in faults]
    every = ["exception", "sigkill", "hang", "sigstop"]
    assert sorted(kinds[:8]) == sorted(every * 2) and kinds[8] in every  # rounds of all four


def test_live_preload_is_live_recovery_with_forked_ranks(tmp_path: Path) -> None:
    """``--modes live-preload``: the live mode's standby and in-process settings and
    ``--preload torch``; the default set stays the five modes."""
    bench = _bench()

    def cmd(mode: str) -> list[str]:
        return bench.build_cmd(bench.Job(mode, tmp_path, "r", []), 50, 2)

    live, both = cmd("live"), cmd("live-preload")
    assert "--preload" not in live and both[both.index("--preload") + 1] == "torch"
    assert [w for w in both if w not in ("--preload", "torch")] == live
    assert "live-preload" not in bench.MODES and "live-preload" in bench.CHOICES


def test_the_console_ledger_of_a_crash_and_a_restart() -> None:
    bench = _bench()
    job = bench.Job("torchrun", Path("/nonexistent"), "r", [(8.0, "exception")])
    job.start, job.end, job.rc = 100.0, 130.0, 0
    agent = "I1206 [default] "
    job.lines = [
        (101.0, agent + "Starting worker group"),  # the first attempt's: the launch counts
        *[(105.0 + 0.5 * i, f"[demo] step {i + 1}/100 loss 1.0") for i in range(8)],
        (108.6, "[goodput-job rank 1] injecting exception (fault 0) at step 8"),
        (110.0, agent + "Worker group FAILED. 3/3 attempts left; will restart worker group"),
        (111.0, agent + "Starting worker group"),
        (115.0, "[demo] resumed from step 4 (persistent) (restart 1)"),
        *[(116.0 + 0.5 * i, f"[demo] step {i + 5}/100 loss 1.0") for i in range(20)],
        (126.0, "[goodput-job] end of the job at step 20"),
    ]
    ledger = bench.console_ledger(job)
    assert ledger.attempts == 2 and ledger.wall_s == 30.0
    want = {
        Part.STARTUP: 5.0 + 5.0,  # launch -> first step, restart -> its first step
        Part.PRODUCTIVE: 1.5 + 9.5,  # steps 2-4, then 6-24
        Part.RECOMPUTED: 2.0,  # steps 5-8, done again
        Part.DETECTION_WAIT: 1.5,  # last step -> the agent's decision
        Part.RECOVERY: 1.0,
        Part.UNKNOWN: 4.5,  # the last step -> the launcher's exit
    }
    for part in Part:
        assert ledger.parts[part] == pytest.approx(want.get(part, 0.0), abs=1e-6), part
    assert bench.injected(job) == ["exception"]


def test_the_console_ledger_of_a_restart_that_failed_in_its_start_up() -> None:
    """torchrun's restarts that fail in gloo's connectFullMesh: the attempt resumed
    nothing; the work lost is that after the checkpoint the next one resumed from, not
    every step since the launch."""
    bench = _bench()
    job = bench.Job("torchrun", Path("/nonexistent"), "r", [(8.0, "sigkill")])
    job.start, job.end, job.rc = 100.0, 140.0, 0
    agent = "I1206 [default] "
    job.lines = [
        (101.0, agent + "Starting worker group"),
        *[(105.0 + 0.5 * i, f"[demo] step {i + 1}/100 loss 1.0") for i in range(8)],
        (110.0, agent + "Worker group FAILED. 3/3 attempts left; will restart worker group"),
        (111.0, agent + "Starting worker group"),
        (118.0, "RuntimeError: Gloo connectFullMesh failed with ... Connection refused"),
        (119.0, agent + "Worker group FAILED. 2/3 attempts left; will restart worker group"),
        (120.0, agent + "Starting worker group"),
        (125.0, "[demo] resumed from step 4 (persistent) (restart 2)"),
        *[(126.0 + 0.5 * i, f"[demo] step {i + 5}/100 loss 1.0") for i in range(20)],
    ]
    ledger = bench.console_ledger(job)
    assert ledger.attempts == 3
    assert ledger.parts[Part.PRODUCTIVE] == pytest.approx(1.5 + 9.5)  # steps 2-4, 6-24
    assert ledger.parts[Part.RECOMPUTED] == pytest.approx(2.0)  # steps 5-8, done again


def test_the_console_ledger_of_a_live_recovery_and_a_re_entry() -> None:
    """rankguard with a standby: a SIGKILL taken over live, then a hang that ends in an
    in-process re-entry (rank 0's collective timed out 2 s after its last step), one
    worker group throughout."""
    bench = _bench()
    job = bench.Job("live", Path("/nonexistent"), "r", [(8.0, "sigkill"), (20.0, "hang")])
    job.start, job.end, job.rc = 100.0, 140.0, 0
    job.lines = [
        (101.0, "I1206 [default] Starting worker group"),
        *[(105.0 + 0.5 * i, f"[demo] step {i + 1}/100 loss 1.0") for i in range(8)],  # to 108.5
        (108.6, "[goodput-job rank 1] injecting sigkill (fault 0) at step 8"),
        (108.7, "rankguard: rank 0: round 0 failed: Traceback (most recent call last):"),
        (108.9, "[rankguard] live recovery: rank 1 (pid 7, SIGKILL) is taken over by standby"),
        (109.2, "[demo] in-process restart 1: resuming at step 9"),
        *[(109.5 + 0.5 * i, f"[demo] step {i + 9}/100 loss 1.0") for i in range(20)],  # to 119
        (119.1, "[goodput-job rank 1] injecting hang (fault 1) at step 28"),
        (121.0, "rankguard: rank 0: round 1 failed: Traceback (most recent call last):"),
        (121.3, "[demo] in-process restart 2: resuming at step 29"),
        *[(121.5 + 0.5 * i, f"[demo] step {i + 29}/100 loss 1.0") for i in range(30)],  # to 136
        (136.1, "[goodput-job] end of the job at step 58"),
    ]
    ledger = bench.console_ledger(job)
    assert ledger.attempts == 1
    assert [(i.kind, i.iteration, i.resumed_from) for i in ledger.interruptions] == [
        ("live_recovery", 8, 8),
        ("inprocess", 28, 28),
    ]
    live, reentry = ledger.interruptions
    assert live.parts == {
        Part.DETECTION_WAIT: pytest.approx(0.4),
        Part.RECOVERY: pytest.approx(0.6),
    }
    assert reentry.parts == {
        Part.DETECTION_WAIT: pytest.approx(2.0),  # step 28's end -> rank 0's failure
        Part.RECOVERY: pytest.approx(0.3),
    }
    assert ledger.parts[Part.UNKNOWN] == pytest.approx(4.0)  # the last step -> the exit
    assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s)
    assert bench.injected(job) == ["sigkill", "hang"]


def test_each_interruption_is_put_down_to_the_fault_nearest_it() -> None:
    """The per-fault account: an interruption takes the injection nearest its last
    completed step, each injection once, the costlier interruptions first; one with none
    near it is ``-``."""
    bench = _bench()

    def cut(at: float) -> Interruption:
        return Interruption(0, None, at, None, None, None, {Part.DETECTION_WAIT: 1.0})

    ledger = Ledger(0.0, 100.0, {}, 1, [cut(10.0), cut(10.5), cut(40.0), cut(70.0)])
    fired = [(10.2, "sigkill"), (10.4, "hang"), (38.0, "exception"), (90.0, "sigstop")]
    got = [(kind, c.at) for kind, c in bench.by_fault(ledger, fired)]
    assert got == [("sigkill", 10.0), ("hang", 10.5), ("exception", 40.0), ("-", 70.0)]
    # a re-entry with no time of its own beside the restart it ended in: the restart's
    free = Interruption(0, None, 50.0, None, None, None, {}, kind="inprocess")
    ledger = Ledger(0.0, 100.0, {}, 1, [free, cut(50.0)])
    got = [(kind, c.kind) for kind, c in bench.by_fault(ledger, [(50.2, "sigstop")])]
    assert got == [("-", "inprocess"), ("sigstop", "restart")]


def test_the_smoke_run_accounts_for_rankguards_fault_in_both_ledgers(tmp_path: Path) -> None:
    """One exception on rankguard's job with ``--preload torch`` (the smoke runs no
    torchrun job: the console's ledger of a torchrun crash and restart, the same rule, is
    the test above): its console ledger and its run directory's own, side by side."""
    res = forked.run(
        "goodput.py",
        "--smoke",
        timeout=380,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path)},
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "preload: exit 0, 2 attempt(s), faults fired: exception;" in res.stdout, out
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if "%" in line}
    assert {"preload", "(its"} <= set(rows), res.stdout
    assert rows["preload"][-1] == "1/1"
    assert not list(tmp_path.glob("rg-goodput-*"))  # the jobs' directories are removed
