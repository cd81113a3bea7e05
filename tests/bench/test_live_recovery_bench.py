"""``bench/live_recovery.py --smoke`` and ``bench/soak.py --smoke``: the SIGKILLed rank's
job recovers and trains on with the uninterrupted run's losses, by live recovery where
``rankguard run`` has ``--standby-ranks`` (else by the group restart, said in one line);
the soak's job finishes with no process left and every file parsing (these benches' smoke
runs: ``test_bench_smoke.py`` leaves them to this test, which asserts more of them)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench import forked

pytestmark = [pytest.mark.bench, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def _smoke(name: str, tmp_path: Path) -> str:
    """``python bench/<name> --smoke``, forked (``tests/bench/forked.py``); its output."""
    res = forked.run(
        name,
        "--smoke",
        timeout=380,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT / "src"),
            "TMPDIR": str(tmp_path),
        },
    )
    out = res.stdout + res.stderr
    # room for a failed job's console tail and error files the bench prints (tens of KB)
    assert res.returncode == 0, out[-40_000:]
    assert "Traceback (most recent call last)" not in out, out[-40_000:]
    return res.stdout


def test_the_live_recovery_smoke_run_recovers_with_the_uninterrupted_losses(
    tmp_path: Path,
) -> None:
    out = _smoke("live_recovery.py", tmp_path)
    skipped = "live: skipped: this rankguard run has no --standby-ranks" in out
    mode = "rankguard" if skipped else "live"
    rows = [
        line.split()
        for line in out.splitlines()
        if line.startswith(mode + " ") and " SIGKILL " in line
    ]
    assert rows, out
    # mode, SIGKILL, ok, median / max, redone median / max, losses equal, kept pids
    assert rows[-1][1:3] == ["SIGKILL", "1/1"], out
    assert "uninterrupted run (torchrun): exit 0" in out, out  # the job ran as it is
    line = next(x for x in out.splitlines() if x.strip().startswith(mode) and "kill rank" in x)
    equal = line.split("losses ")[1].split(" equal")[0]
    got, of = equal.split("/")
    assert got == of and int(of) > 0, line
    assert ("survivors kept their pids" in line) == (mode == "live"), line
    assert not list(tmp_path.glob("rg-live-*"))  # the runs' temp dirs are removed


def test_the_soak_smoke_run_finishes_clean(tmp_path: Path) -> None:
    out = _smoke("soak.py", tmp_path)
    assert "faults sent 1/1, recovered 1; no stall" in out, out
    assert "job exit 0" in out and "orphans (processes of the job left): 0" in out, out
    assert "invalid files: 0 of" in out and "MEETS" in out, out


def _live_recovery_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its own imports: restart.py
    spec = importlib.util.spec_from_file_location(
        "bench_live_recovery", ROOT / "bench" / "live_recovery.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_a_job_that_exits_non_zero_shows_its_console_tail_and_error_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed job's output is not thrown away with its directory: the bench prints the
    last lines of its console (bounded) and the per-rank error files torch elastic wrote."""
    lr = _live_recovery_bench(monkeypatch)
    error = tmp_path / "logs" / "run-x" / "attempt_0" / "1" / "error.json"
    error.parent.mkdir(parents=True)
    error.write_text(json.dumps({"message": {"message": "RuntimeError: rank 1 broke"}}))
    lines = [(1000.0 + i, f"line {i}") for i in range(200)]
    lines.append((1300.0, "x" * 5000))
    run = lr.Run("torchrun", "none", 0, 0, tmp_path, rc=1, lines=lines)
    lr.show_failure(run)
    out = capsys.readouterr().out
    assert "torchrun (uninterrupted): exit 1" in out
    assert "line 199" in out and "line 100" not in out  # the tail only
    assert "x" * 400 + " [...]" in out and "x" * 401 not in out  # each line bounded
    assert "attempt_0/1/error.json" in out and "rank 1 broke" in out
    assert len(out) < 60_000
    lr.show_failure(lr.Run("torchrun", "none", 0, 0, tmp_path, rc=0, lines=lines))
    assert capsys.readouterr().out == ""  # a job that exited 0 prints nothing


def _line(tag: str, **ev: Any) -> tuple[float, str]:
    return (float(ev["t"]), f"{tag} {json.dumps(ev)}")


def _steps(lr: ModuleType, steps: range, pids: dict[int, int], t0: float) -> list[Any]:
    return [
        _line("LRSTEP", s=s, r=r, loss=repr(1.0 / (s + r + 1)), t=t0 + s + r / 10, pid=pid)
        for s in steps
        for r, pid in pids.items()
    ]


def test_a_lost_node_takes_both_of_its_ranks_and_the_others_keep_their_pids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost agent of two: ranks 2 and 3 (node 1) are both new processes after the
    fault; the survivors are ranks 0 and 1 alone, and they kept their processes."""
    lr = _live_recovery_bench(monkeypatch)
    monkeypatch.setattr(lr, "STEPS", 6)
    before = {0: 100, 1: 101, 2: 102, 3: 103}
    after = {0: 100, 1: 101, 2: 200, 3: 201}
    lines = _steps(lr, range(1, 4), before, 0.0)
    lines.append(_line("LRFAULT", kind="node", r=3, s=4, t=3.95, pid=103))
    lines += _steps(lr, range(4, 7), after, 5.0)
    run = lr.Run("live", "node", 3, 4, tmp_path, rc=0, lines=lines)
    baseline = lr.losses(lr.Run("torchrun", "none", 0, 0, tmp_path, lines=lines))
    res = lr.analyse(run, baseline)
    assert res.ok, res.why
    assert res.survivors_kept_pids is True
    assert (res.redone, res.compared, res.equal) == (0, 12, 12)
    assert res.fault_to_step == pytest.approx(5.0 + 4 - 3.95)
    # a survivor of node 0 in a new process is not a kept pid
    moved = [*lines[:13], *_steps(lr, range(4, 7), {**after, 1: 300}, 5.0)]
    res = lr.analyse(lr.Run("live", "node", 3, 4, tmp_path, rc=0, lines=moved), baseline)
    assert res.ok, res.why
    assert res.survivors_kept_pids is False


def test_a_shrink_is_judged_by_its_second_fault_and_the_global_batchs_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No standby left: the second SIGKILL's figures; 3 renumbered ranks complete the
    last step; each step's mean loss against the 4-rank run's, within the tolerance."""
    lr = _live_recovery_bench(monkeypatch)
    monkeypatch.setattr(lr, "STEPS", 8)
    ref = {(s, r): repr(0.5 + s / 100 + (r - 1.5) / 1000) for s in range(1, 9) for r in range(4)}
    lines = []
    for s in range(1, 6):  # 4 ranks: the standby (pid 104) took rank 1 at step 3
        for r in range(4):
            pid = 104 if r == 1 and s >= 3 else 100 + r
            lines.append(_line("LRSTEP", s=s, r=r, loss=ref[(s, r)], t=float(s), pid=pid))
    lines.insert(8, _line("LRFAULT", kind="kill", r=1, s=3, t=2.5, pid=101, i=0))
    lines.append(_line("LRFAULT", kind="kill", r=2, s=6, t=5.5, pid=102, i=1))
    for s in range(6, 9):  # 3 ranks, renumbered: 0, 1 (pid 104), 2 (was 3, pid 103)
        mean = sum(float(ref[(s, r)]) for r in range(4)) / 4
        for r, pid in enumerate((100, 104, 103)):
            loss = repr(mean * (1 + 2e-6) + (r - 1) * 1e-4)  # the same mean, its own share
            lines.append(_line("LRSTEP", s=s, r=r, loss=loss, t=s + 0.2 + r / 10, pid=pid))
    run = lr.Run("live", "shrink", 1, 3, tmp_path, rc=0, lines=lines, rank2=2, step2=6)
    res = lr.analyse(run, ref)
    assert res.ok, res.why
    assert res.fault_to_step == pytest.approx(6.2 - 5.5)
    assert (res.redone, res.compared, res.equal) == (0, 3, 3)
    assert 1e-6 < res.max_diff < 1e-5
    assert res.survivors_kept_pids is True
    # a step's loss off by more than the tolerance is counted
    bad = [*lines[:-1], _line("LRSTEP", s=8, r=2, loss=repr(9.0), t=8.4, pid=103)]
    res = lr.analyse(lr.Run("live", "shrink", 1, 3, tmp_path, rc=0, lines=bad), ref)
    assert (res.compared, res.equal) == (3, 2)


def test_ending_a_node_ends_its_launcher_and_every_process_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch elastic starts each worker with ``start_new_session``: a kill of the agent's
    process group would miss them; the bench ends the whole tree."""
    lr = _live_recovery_bench(monkeypatch)
    spawn = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True) for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    node = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None
        kids = [int(x) for x in node.stdout.readline().split()]
        run = lr.Run("live", "node", 3, 4, tmp_path, launchers=[other.pid, node.pid])
        lr._end_node(run, kids[1])
        assert run.lost_launcher == node.pid
        assert node.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while any(lr._state(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [k for k in kids if lr._state(k)]
        assert other.poll() is None  # the other node is left alone
    finally:
        for proc in (other, node):
            proc.kill()
            proc.wait()
