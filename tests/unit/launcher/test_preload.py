"""``--preload``'s fork server: what it imports before it forks the ranks."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rankguard.launcher import run


def _preloaded(monkeypatch: pytest.MonkeyPatch, modules: tuple[str, ...]) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", seen.extend)
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: None)
    run.start_fork_server(modules)
    return seen


def test_preloading_torch_imports_what_every_optimizer_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.optim's Optimizer imports torch._dynamo at its construction: a rank forked
    # with torch alone paid that import (as long as torch's own) at every restart
    seen = _preloaded(monkeypatch, ("torch",))
    assert seen[-2:] == ["torch", "torch._dynamo"]


def test_other_modules_are_preloaded_as_given_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _preloaded(monkeypatch, ("json", "torch", "json", "torch._dynamo"))
    assert seen[3:] == ["json", "torch", "torch._dynamo"]
    assert seen[:3] == [
        "__main__",
        "rankguard.launcher.forkserver_guard",
        "rankguard.launcher.worker",
    ]


def test_a_temp_directory_too_long_for_the_socket_puts_it_under_tmp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = tmp_path / ("d" * 90)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    made_under: list[str | None] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", lambda _: None)
    monkeypatch.setattr(
        multiprocessing.forkserver, "ensure_running", lambda: made_under.append(tempfile.tempdir)
    )
    run.start_fork_server(("json",))
    assert made_under == ["/tmp"]
    assert tempfile.tempdir == str(long)  # the launcher's own temp directory as it was
    said = capsys.readouterr().err
    assert "too long for the fork server's Unix socket; its socket goes under /tmp" in said


def test_the_fork_server_starts_and_forks_under_a_long_tmpdir(tmp_path: Path) -> None:
    """A real fork server in a fresh interpreter whose TMPDIR is longer than a Unix
    socket's path allows (Python's own would fail: AF_UNIX path too long)."""
    long = tmp_path / ("d" * 90)
    long.mkdir()
    code = (
        "import multiprocessing as mp, os\n"
        "from rankguard.launcher import run\n"
        "run.start_fork_server(('json',))\n"
        "p = mp.get_context('forkserver').Process(target=os.getpid)\n"
        "p.start(); p.join(30)\n"
        "print('exit', p.exitcode)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "exit 0" in res.stdout, res.stdout + res.stderr
