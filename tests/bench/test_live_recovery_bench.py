"""``bench/live_recovery.py --smoke`` and ``bench/soak.py --smoke``: the SIGKILLed rank's
job recovers and trains on with the uninterrupted run's losses, by live recovery where
``rankguard run`` has ``--standby-ranks`` (else by the group restart, said in one line);
the soak's job finishes with no process left and every file parsing (these benches' smoke
runs: ``test_bench_smoke.py`` leaves them to this test, which asserts more of them)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def _smoke(name: str, tmp_path: Path) -> str:
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), "--smoke"],
        capture_output=True,
        text=True,
        timeout=380,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT / "src"),
            "TMPDIR": str(tmp_path),
        },
        cwd=ROOT,
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
    rows = [line.split() for line in out.splitlines() if line.startswith(mode + " ")]
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
