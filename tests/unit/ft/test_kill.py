"""Dump then kill (ft/kill.py) on real child processes: parallel dumps, the configured
method and timeout, SIGKILL only to the targets marked kill, refused and vanished pids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft import kill as kill_mod
from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.kill import (
    DEFAULT_DUMP_POLICY,
    DumpPolicy,
    KillTarget,
    OwnedWorkers,
    dump_stacks_of,
    dump_then_kill,
    kill_marked,
)
from rankguard.ft.stacks import stack_file
from tests.factories import Children, DictStore, alive

# A rank with the dump handler installed, blocked in a named function.
RANK_CHILD = """\
import sys, time
from rankguard.ft.stacks import install_dump_handler

fh = install_dump_handler(sys.argv[1], int(sys.argv[2]))
assert fh is not None

def blocked_here():
    print("ready", flush=True)
    time.sleep(120)

blocked_here()
"""

# A rank that never answers the dump signal (its handler writes nothing): every
# faulthandler dump of it waits the whole timeout.
DEAF_CHILD = """\
import signal, sys, time
from rankguard.ft.stacks import DUMP_SIGNAL

signal.signal(DUMP_SIGNAL, lambda signum, frame: None)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def spawn(tmp_path: Path, children: Children) -> Callable[..., subprocess.Popen[str]]:
    """Start a rank child (killed and reaped at the end)."""

    def start(rank: int, *, deaf: bool = False) -> subprocess.Popen[str]:
        return children.start(DEAF_CHILD if deaf else RANK_CHILD, str(tmp_path), str(rank))

    return start


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)  # reaped: the pid no longer exists
    return proc.pid


# ---- policy --------------------------------------------------------------------------


def test_policy_from_the_fault_tolerance_config() -> None:
    cfg = FaultToleranceConfig(stack_dump="faulthandler", stack_dump_timeout_s=2.5)
    assert DumpPolicy.from_config(cfg) == DumpPolicy(method="faulthandler", timeout_s=2.5)
    # the defaults are the config's defaults
    assert DumpPolicy.from_config(FaultToleranceConfig()) == DEFAULT_DUMP_POLICY
    with pytest.raises(ValueError):
        DumpPolicy(method="gdb")
    with pytest.raises(ValueError):
        DumpPolicy(timeout_s=0)


def test_method_and_timeout_reach_every_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, str, float]] = []

    def fake_dump(
        run_dir: Path, rank: int, pid: int, *, method: str, timeout_s: float, native: bool
    ) -> str:
        assert native  # every rank stops with the group: native frames for each
        calls.append((rank, pid, method, timeout_s))
        return f"dump-{rank}"

    monkeypatch.setattr(kill_mod, "dump_stacks", fake_dump)
    monkeypatch.setattr(kill_mod, "pid_running", lambda pid: True)
    policy = DumpPolicy.from_config(
        FaultToleranceConfig(stack_dump="py-spy", stack_dump_timeout_s=7.0)
    )
    targets = [KillTarget(0, 1000), KillTarget(2, 1002), KillTarget(1, 1001, kill=False)]
    results = dump_stacks_of(tmp_path, targets, policy, culprit=2)
    assert sorted(calls) == [
        (0, 1000, "py-spy", 7.0),
        (1, 1001, "py-spy", 7.0),
        (2, 1002, "py-spy", 7.0),
    ]
    assert [r.rank for r in results] == [2, 0, 1]  # the culprit first, then by rank
    assert [r.path for r in results] == ["dump-2", "dump-0", "dump-1"]


# ---- parallel ------------------------------------------------------------------------


def test_unresponsive_ranks_cost_one_timeout_not_n(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    n, timeout_s = 6, 1.5
    procs = [spawn(r, deaf=True) for r in range(n)]
    targets = [KillTarget(r, p.pid, kill=r == 3) for r, p in enumerate(procs)]
    policy = DumpPolicy(method="faulthandler", timeout_s=timeout_s)
    t0 = time.monotonic()
    done = dump_then_kill(tmp_path, targets, policy)
    elapsed = time.monotonic() - t0
    assert elapsed >= timeout_s * 0.9  # each dump did wait for its timeout
    assert elapsed < 2 * timeout_s + 1.0, elapsed  # serially: n x 1.5 s = 9 s
    assert [r.rank for r in done.dumps] == [3, 0, 1, 2, 4, 5]  # the one to kill first
    assert all(r.path is None and r.error for r in done.dumps)  # nothing was written
    assert done.killed == [procs[3].pid]
    assert procs[3].wait(timeout=5) == -9  # killed after its dump failed
    assert all(alive(p, 0.05) for i, p in enumerate(procs) if i != 3)


def test_parallel_faulthandler_dumps_of_blocked_ranks(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    procs = [spawn(r) for r in range(4)]
    targets = [KillTarget(r, p.pid) for r, p in enumerate(procs)]
    results = dump_stacks_of(
        tmp_path, targets, DumpPolicy(method="faulthandler", timeout_s=5.0), culprit=2
    )
    assert [r.rank for r in results] == [2, 0, 1, 3]
    for res, proc in zip(sorted(results, key=lambda r: r.rank), procs, strict=True):
        assert res.path == str(stack_file(tmp_path, res.rank, proc.pid))
        text = Path(res.path).read_text(encoding="utf-8")
        assert "blocked_here" in text
        assert "most recent call first" in text  # faulthandler's format
        assert "py-spy dump" not in text  # the method asked for, not py-spy
    assert all(alive(p, 0.05) for p in procs)  # dumping kills nobody


# ---- kill ----------------------------------------------------------------------------


def test_only_targets_marked_kill_are_killed(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    procs = [spawn(r) for r in range(3)]
    targets = [KillTarget(r, p.pid, kill=r == 1) for r, p in enumerate(procs)]
    done = dump_then_kill(tmp_path, targets, DumpPolicy(method="faulthandler", timeout_s=5.0))
    assert [r.rank for r in done.dumps] == [1, 0, 2]
    # the dump was written before the kill
    assert "blocked_here" in Path(str(done.dumps[0].path)).read_text(encoding="utf-8")
    assert done.killed == [procs[1].pid]
    assert procs[1].wait(timeout=5) == -9
    assert alive(procs[0]) and alive(procs[2])


@pytest.mark.parametrize("pid", [1, 0, -1])
def test_pid_one_or_less_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid: int
) -> None:
    sent: list[tuple[int, int]] = []
    dumped: list[int] = []
    monkeypatch.setattr(kill_mod.os, "kill", lambda p, s: sent.append((p, s)))
    monkeypatch.setattr(kill_mod, "dump_stacks", lambda *a, **k: dumped.append(a[2]))
    done = dump_then_kill(tmp_path, [KillTarget(0, pid, kill=True)], DEFAULT_DUMP_POLICY)
    assert sent == [] and dumped == []
    assert done.killed == []
    (res,) = done.dumps
    assert res.path is None and res.error is not None and "refused" in res.error
    assert not (tmp_path / "stacks").exists()


def test_vanished_pid_is_skipped_quickly(tmp_path: Path) -> None:
    pid = _gone_pid()
    t0 = time.monotonic()
    done = dump_then_kill(
        tmp_path, [KillTarget(5, pid, kill=True)], DumpPolicy(method="auto", timeout_s=5.0)
    )
    assert time.monotonic() - t0 < 1.0  # no wait for a dump timeout
    assert done.killed == []
    assert [(r.rank, r.path, r.error) for r in done.dumps] == [(5, None, "not running")]
    assert not stack_file(tmp_path, 5, pid).exists()


def test_kill_of_a_process_that_just_exited_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(kill_mod, "pid_running", lambda pid: True)  # ... until the kill
    monkeypatch.setattr(kill_mod.os, "kill", gone)
    assert kill_marked([KillTarget(0, 4242, kill=True)]) == []


def test_a_failing_dump_does_not_stop_the_others_or_the_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    victim = spawn(0)
    real = kill_mod.dump_stacks

    def flaky(run_dir: Path, rank: int, pid: int, **kw: Any) -> str | None:
        if rank == 1:
            raise OSError("disk full")
        return real(run_dir, rank, pid, **kw)

    monkeypatch.setattr(kill_mod, "dump_stacks", flaky)
    other = spawn(1)
    done = dump_then_kill(
        tmp_path,
        [KillTarget(0, victim.pid, kill=True), KillTarget(1, other.pid)],
        DumpPolicy(method="faulthandler", timeout_s=5.0),
    )
    assert done.dumps[0].path is not None
    assert done.dumps[1].path is None and done.dumps[1].error == "disk full"
    assert victim.wait(timeout=5) == -9
    assert alive(other)
    assert os.path.exists(str(done.dumps[0].path))


# ---- the relay of a node > 0 ---------------------------------------------------------


def test_relay_serves_a_kill_request_with_the_policy_in_parallel(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    from rankguard.relay.relay import StoreRelay, request_kill

    culprit = spawn(4)
    deaf = [spawn(r, deaf=True) for r in (5, 6, 7)]
    store = DictStore()
    timeout_s = 1.5
    workers = OwnedWorkers()  # the relay's node's workers: these four children
    workers.set([culprit.pid, *(p.pid for p in deaf)])
    relay = StoreRelay(
        store,
        tmp_path,
        "run-kill",
        node_rank=1,
        interval_s=60,
        dump_policy=DumpPolicy(method="faulthandler", timeout_s=timeout_s),
        workers=workers,
    )
    request_kill(
        store,
        "run-kill",
        1,
        [
            {"rank": 4, "pid": culprit.pid, "kill": True},
            *({"rank": r, "pid": p.pid} for r, p in zip((5, 6, 7), deaf, strict=True)),
        ],
    )
    t0 = time.monotonic()
    relay.push_once()
    elapsed = time.monotonic() - t0
    assert elapsed < 2 * timeout_s + 1.0, elapsed  # serially: 3 x 1.5 s
    assert culprit.wait(timeout=5) == -9
    assert all(alive(p, 0.05) for p in deaf)
    text = stack_file(tmp_path, 4, culprit.pid).read_text(encoding="utf-8")
    assert "blocked_here" in text and "most recent call first" in text  # faulthandler
    assert "py-spy dump" not in text
    assert not store.check(["rankguard/run-kill/kill/node/1"])  # served once


def test_signal_pid_checks_the_process_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs after the pidfd is open: the process checked is the one signalled."""
    from rankguard.ft.kill import signal_pid

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        order: list[str] = []
        real_open = os.pidfd_open

        def opened(pid: int, *a: int) -> int:
            order.append("open")
            return real_open(pid, *a)

        monkeypatch.setattr(os, "pidfd_open", opened)

        def ours(pid: int) -> bool:
            order.append("check")
            return pid == proc.pid

        assert signal_pid(proc.pid, signal.SIGKILL, lambda pid: False) is None
        assert proc.poll() is None  # refused: not signalled
        order.clear()
        assert signal_pid(proc.pid, signal.SIGKILL, ours) is True
        assert order == ["open", "check"]
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert signal_pid(proc.pid, signal.SIGKILL, ours) is False  # gone
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
