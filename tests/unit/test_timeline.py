"""tests/timeline.py: the per-test timeline CI records and the tail it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.timeline import (
    Recorder,
    _remove_left,
    by_file,
    cgroup_clock,
    cpu_seconds,
    main,
    read,
    summary,
)


def _row(worker: str, nodeid: str, t0: float, t1: float) -> dict[str, object]:
    return {"w": worker, "id": nodeid, "t0": t0, "t1": t1, "o": "ok"}


def test_the_tail_names_the_tests_that_ran_after_the_next_to_last_worker_ended() -> None:
    rows = [
        _row("gw0", "a", 100.0, 150.0),
        _row("gw0", "b", 150.0, 160.0),
        _row("gw1", "late", 190.0, 195.0),
        _row("gw1", "c", 101.0, 130.0),
        _row("gw1", "long", 130.0, 190.0),
    ]
    lines = summary(rows)
    assert lines[0] == "timeline: gw0: 2 tests, 0 s -> 60 s, busy 60 s (100%)"
    assert lines[1] == "timeline: gw1: 3 tests, 1 s -> 95 s, busy 94 s (100%)"
    assert lines[2] == (
        "timeline: the last worker ended 95 s after the first test, 35 s after the next-to-last"
    )
    # longest part in the tail first: "long" ran 30 s of it, "late" 5 s
    assert [line.split(": ", 2)[2].split(" (")[0] for line in lines[3:]] == ["long", "late"]


def test_workers_ending_together_have_no_tail() -> None:
    rows = [_row("gw0", "a", 0.0, 10.0), _row("gw1", "b", 0.0, 10.4)]
    assert summary(rows)[-1].endswith("0 s after the next-to-last")
    assert summary([]) == ["timeline: no test recorded"]


def test_the_recorder_appends_one_line_per_test_and_a_corrupt_line_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    rec = Recorder(str(tmp_path / "tl"))
    rec.pytest_runtest_logstart("t::ok")
    rec.pytest_runtest_logreport(SimpleNamespace(failed=False, nodeid="t::ok"))
    rec.pytest_runtest_logfinish("t::ok")
    rec.pytest_runtest_logstart("t::bad")
    rec.pytest_runtest_logreport(SimpleNamespace(failed=True, nodeid="t::bad"))
    rec.pytest_runtest_logfinish("t::bad")
    rec.pytest_unconfigure()
    with (tmp_path / "tl" / "gw3.jsonl").open("a") as fh:
        fh.write('{"w": "gw3", "id": 5}\nnot json\n' + "x" * 5000 + "\n")
    rows = read(tmp_path / "tl")
    assert [(r["w"], r["id"], r["o"]) for r in rows] == [
        ("gw3", "t::ok", "ok"),
        ("gw3", "t::bad", "failed"),
    ]
    assert all(r["t1"] >= r["t0"] for r in rows)
    assert main([str(tmp_path / "tl")]) == 0
    assert main([str(tmp_path / "missing")]) == 2


def test_each_line_has_the_tests_cpu_and_the_summary_names_the_costliest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    rec = Recorder(str(tmp_path / "tl"))
    rec.pytest_runtest_logstart("t::busy")
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # 0.2 s of this process's CPU
        pass
    rec.pytest_runtest_logfinish("t::busy")
    rec.pytest_runtest_logstart("t::child")
    # a child reaped during the test counts: 0.2 s of its CPU
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nd = time.process_time() + 0.2\nwhile time.process_time() < d: pass",
        ],
        check=True,
    )
    rec.pytest_runtest_logfinish("t::child")
    rec.pytest_unconfigure()
    rows = {r["id"]: r for r in read(tmp_path / "tl")}
    assert rows["t::busy"]["cpu"] >= 0.19
    assert rows["t::child"]["cpu"] >= 0.19
    lines = summary(
        [
            {**_row("gw0", "cheap", 0.0, 9.0), "cpu": 0.5},
            {**_row("gw1", "costly", 0.0, 3.0), "cpu": 12.25},
            _row("gw1", "older line, no cpu", 3.0, 4.0),
        ]
    )
    assert lines[-3:] == [
        "timeline: CPU recorded: 13 s over 2 tests (times)",
        "timeline:   CPU 12.2 s, wall 3 s: costly",
        "timeline:   CPU 0.5 s, wall 9 s: cheap",
    ]


# A process that forks a grandchild and exits at once (a fork server's rank, orphaned:
# nobody in this process reaps it), which then burns 0.3 s of CPU.
ORPHAN = """
import os, sys, time
sys.stdin.readline()
if os.fork() == 0:
    d = time.process_time() + 0.3
    while time.process_time() < d:
        pass
    os._exit(0)
"""


def test_a_cgroup_clock_counts_the_cpu_of_a_process_nobody_here_reaped(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE)
    try:
        clock = cgroup_clock(child.pid)
        if clock is None:
            pytest.skip("no cgroup of its own for a process here (cgroup v1 cpuacct or v2, root)")
        assert clock.own.parent == clock.home
        # a cgroup left by a worker that was killed (its process gone) is removed when
        # the next one is made there; one whose process lives is kept
        gone = subprocess.Popen([sys.executable, "-c", ""])
        gone.wait()
        left = clock.home / f"rankguard-timeline-{gone.pid}"
        kept = clock.home / f"rankguard-timeline-{os.getpid()}"
        left.mkdir()
        kept.mkdir()
        try:
            _remove_left(clock.home)
            assert not left.exists() and kept.exists()
        finally:
            kept.rmdir()
        assert (clock.own / "cgroup.procs").read_text().split() == [str(child.pid)]
        rec = Recorder(str(tmp_path / "tl"), clock=clock)
        mine = cpu_seconds()
        rec.pytest_runtest_logstart("t::orphan")
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.close()
        child.wait(timeout=30)
        deadline = time.monotonic() + 30
        while (clock.own / "cgroup.procs").read_text().strip():  # the grandchild's end
            assert time.monotonic() < deadline
            time.sleep(0.02)
        rec.pytest_runtest_logfinish("t::orphan")
        reaped = cpu_seconds() - mine  # what os.times() sees: the child alone
        rec.pytest_unconfigure()
    finally:
        child.kill()
        child.wait()
    (row,) = read(tmp_path / "tl")
    assert row["clock"] == "cgroup"
    assert row["cpu"] >= 0.29, row
    assert reaped < 0.29 <= row["cpu"], (reaped, row)
    assert not clock.own.exists()  # removed at the end
    assert summary([row])[-2].endswith("over 1 tests (cgroup)")


def test_top_and_by_file_sum_the_cpu_by_tier_and_by_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {**_row("gw0", "tests/e2e/test_a.py::one", 0.0, 9.0), "cpu": 10.0},
        {**_row("gw0", "tests/e2e/test_a.py::two", 9.0, 10.0), "cpu": 5.0},
        {**_row("gw1", "tests/e2e/test_b.py::one", 0.0, 3.0), "cpu": 12.0},
        {**_row("gw1", "tests/unit/x/test_c.py::one[1]", 3.0, 4.0), "cpu": 0.5},
    ]
    assert by_file(rows) == [
        "timeline: tier tests/e2e: CPU 27.0 s over 3 tests",
        "timeline: tier tests/unit: CPU 0.5 s over 1 tests",
        "timeline: file tests/e2e/test_a.py: CPU 15.0 s over 2 tests",
        "timeline: file tests/e2e/test_b.py: CPU 12.0 s over 1 tests",
        "timeline: file tests/unit/x/test_c.py: CPU 0.5 s over 1 tests",
    ]
    (tmp_path / "tl").mkdir()
    with open(tmp_path / "tl" / "gw0.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert main([str(tmp_path / "tl"), "--top", "1", "--by-file"]) == 0
    out = capsys.readouterr().out.splitlines()
    costliest = [ln for ln in out if ln.startswith("timeline:   CPU ")]
    assert costliest == ["timeline:   CPU 12.0 s, wall 3 s: tests/e2e/test_b.py::one"]
    assert "timeline: file tests/e2e/test_a.py: CPU 15.0 s over 2 tests" in out
    assert main([str(tmp_path / "tl"), "--top"]) == 2
