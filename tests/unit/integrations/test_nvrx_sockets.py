"""Where the NVRx client sockets go: one directory per launcher, removed when its agent
ends, so a rank that ends by a signal leaves nothing in ``$TMPDIR``; the directories of
dead launchers and ranks are swept, nobody else's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("nvidia_resiliency_ext.fault_tolerance")

from rankguard.ft.config import FaultToleranceConfig
from rankguard.integrations.nvrx import (
    SOCKET_DIR_ENV,
    SOCKET_ENV,
    RankMonitorBridge,
    launcher_socket_dir,
    nvrx_config_from,
    socket_base,
    sweep_socket_dirs,
)
from rankguard.monitor.config import HeartbeatConfig

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]

RANK = """\
import sys, time
from rankguard.ft.config import FaultToleranceConfig
from rankguard.monitor.config import HeartbeatConfig
from rankguard.integrations.nvrx import RankMonitorBridge, nvrx_config_from

cfg = nvrx_config_from(FaultToleranceConfig(), HeartbeatConfig(enabled=True))
bridge = RankMonitorBridge(object(), cfg, rank=int(sys.argv[1])).start()
print(bridge.path, flush=True)
time.sleep(60)
"""


@pytest.fixture
def tmpdir_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # a short $TMPDIR of its own (a test's tmp_path can be too long for a socket's path)
    tmp = Path(tempfile.mkdtemp(prefix="rgs-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv(SOCKET_DIR_ENV, raising=False)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _rank(rank: int) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def _bridge_here() -> RankMonitorBridge:
    """Rank 0's bridge in this process (where a socket goes does not depend on which
    process binds it; a process of its own only where it must die)."""
    cfg = nvrx_config_from(FaultToleranceConfig(), HeartbeatConfig(enabled=True))
    return RankMonitorBridge(object(), cfg, rank=0).start()


def test_ranks_killed_by_a_signal_leave_nothing_in_tmpdir(tmpdir_env: Path) -> None:
    with launcher_socket_dir() as d:
        assert d is not None and d.parent == tmpdir_env
        assert os.stat(d).st_mode & 0o777 == 0o700
        procs = [_rank(r) for r in (0, 1)]
        # rank 0 killed, rank 1 stopped as a restart stops it
        for (proc, path), sig in zip(procs, (signal.SIGKILL, signal.SIGTERM), strict=True):
            assert path.parent == d and path.exists()
            proc.send_signal(sig)
            proc.wait(10)
        assert os.listdir(tmpdir_env) == [d.name]  # every socket in the launcher's one
    assert os.listdir(tmpdir_env) == []
    assert SOCKET_DIR_ENV not in os.environ


def test_a_rank_outside_the_launcher_sweeps_the_dead_ones(tmpdir_env: Path) -> None:
    proc, path = _rank(0)
    assert path.parent.parent == tmpdir_env
    assert path.parent.name.startswith(f"rg-nvrx-{proc.pid}-")
    proc.kill()
    proc.wait(10)
    assert path.parent.exists()  # nobody could remove it then
    bridge = _bridge_here()  # the next one sweeps it
    try:
        assert not path.parent.exists() and bridge.path.exists()
    finally:
        bridge.close()


def test_the_sweep_removes_only_this_users_dirs_of_dead_pids(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = os.getppid()
    (tmp_path / f"rg-nvrx-{dead.pid}-abcd1234").mkdir()
    (tmp_path / f"rg-nvrx-{live}-abcd1234").mkdir()
    (tmp_path / "rg-nvrx-abcd1234").mkdir()  # an older name: no pid, left alone
    (tmp_path / "other").mkdir()
    target = tmp_path / "other"
    (tmp_path / f"rg-nvrx-{dead.pid}-link").symlink_to(target, target_is_directory=True)
    (target / "keep").write_text("x")
    if os.geteuid() == 0:
        foreign = tmp_path / f"rg-nvrx-{dead.pid}-nobody00"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
    removed = sweep_socket_dirs(tmp_path)
    assert removed == [f"rg-nvrx-{dead.pid}-abcd1234"]
    assert (target / "keep").exists()
    left = set(os.listdir(tmp_path))
    assert f"rg-nvrx-{live}-abcd1234" in left and "rg-nvrx-abcd1234" in left


def test_a_tmpdir_too_long_for_a_socket_path_puts_the_sockets_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind under a $TMPDIR that leaves no room for the socket's name fails ("AF_UNIX
    path too long") and the rank's NVRx client finds no server: the sockets go to /tmp."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv(SOCKET_DIR_ENV, raising=False)
    assert socket_base() == Path("/tmp")
    with launcher_socket_dir() as d:
        assert d is not None and d.parent == Path("/tmp")
        bridge = _bridge_here()
        try:
            assert bridge.path.parent == d and bridge.path.exists()  # bound: the path fits
        finally:
            bridge.close()
    assert d is not None and not d.exists()
