"""Stack dumps of a real child process, taken from outside (faulthandler, py-spy)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankguard.ft.stacks import DUMP_SIGNAL, dump_stacks, install_dump_handler, stack_file
from tests.factories import proc_state as _state

# A rank: the dump handler installed at start-up, the main thread blocked in a named
# function, a second thread blocked in another.
CHILD = """\
import sys, threading, time
from rankguard.ft.stacks import install_dump_handler

fh = install_dump_handler(sys.argv[1], int(sys.argv[2]))
assert fh is not None

def side_thread_here():
    time.sleep(60)

def blocked_here():
    threading.Thread(target=side_thread_here, daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)

blocked_here()
"""


def _wait_state(pid: int, states: str, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    state = _state(pid)
    while state not in states and time.monotonic() < deadline:
        time.sleep(0.01)
        state = _state(pid)
    return state


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_install_dump_handler_in_this_process(tmp_path: Path) -> None:
    import faulthandler

    fh = install_dump_handler(tmp_path, 7)
    try:
        assert fh is not None
        path = stack_file(tmp_path, 7, os.getpid())
        assert path == tmp_path / "stacks" / f"rank_7_pid_{os.getpid()}.txt"
        assert path.exists()
    finally:
        faulthandler.unregister(DUMP_SIGNAL)
        if fh is not None:
            fh.close()


def test_faulthandler_dump_names_the_blocked_function(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    t0 = time.monotonic()
    path = dump_stacks(tmp_path, 3, child.pid, method="faulthandler", timeout_s=5.0)
    assert time.monotonic() - t0 < 3.0
    assert path == str(stack_file(tmp_path, 3, child.pid))
    text = Path(path).read_text(encoding="utf-8")
    assert "blocked_here" in text
    assert "side_thread_here" in text  # every thread, not only the current one
    assert "Thread 0x" in text
    assert child.poll() is None  # dumping does not kill the rank


def test_second_dump_appends(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    path = dump_stacks(tmp_path, 3, child.pid, method="faulthandler", timeout_s=5.0)
    assert path is not None
    first = Path(path).read_text(encoding="utf-8")
    assert dump_stacks(tmp_path, 3, child.pid, method="faulthandler", timeout_s=5.0) == path
    second = Path(path).read_text(encoding="utf-8")
    assert second.startswith(first)
    assert second.count("blocked_here") == 2 * first.count("blocked_here")


def test_stopped_process_still_gets_its_stacks_written(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    os.kill(child.pid, signal.SIGSTOP)
    assert _wait_state(child.pid, "Tt") in "Tt"
    path = dump_stacks(tmp_path, 3, child.pid, method="faulthandler", timeout_s=5.0)
    assert path is not None
    assert "blocked_here" in Path(path).read_text(encoding="utf-8")
    # SIGCONT was sent after the dump signal: the process runs again (killed next).
    assert _wait_state(child.pid, "SR") in "SR"


def test_dead_pid_returns_none(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)  # reaped: the pid no longer exists
    t0 = time.monotonic()
    assert dump_stacks(tmp_path, 0, proc.pid, method="faulthandler", timeout_s=2.0) is None
    assert dump_stacks(tmp_path, 0, proc.pid, method="auto", timeout_s=2.0) is None
    assert time.monotonic() - t0 < 1.5  # not a wait for the timeout
    assert not stack_file(tmp_path, 0, proc.pid).exists()


def test_auto_without_py_spy_falls_back_to_faulthandler(
    tmp_path: Path, child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("py-spy") is None
    path = dump_stacks(tmp_path, 3, child.pid, method="auto", timeout_s=5.0)
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    assert "blocked_here" in text
    assert "py-spy dump" not in text
    assert "most recent call first" in text  # faulthandler's format


def test_py_spy_method_without_py_spy_still_dumps(
    tmp_path: Path, child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    path = dump_stacks(tmp_path, 3, child.pid, method="py-spy", timeout_s=5.0)
    assert path is not None
    assert "blocked_here" in Path(path).read_text(encoding="utf-8")


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not on PATH")
def test_py_spy_dump(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    path = dump_stacks(tmp_path, 3, child.pid, method="py-spy", timeout_s=20.0)
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    assert "=== py-spy dump at" in text
    assert "blocked_here" in text


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not on PATH")
def test_py_spy_dump_has_native_frames(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    path = dump_stacks(tmp_path, 3, child.pid, method="py-spy", timeout_s=20.0)
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    if "native frames included" not in text:
        pytest.skip("this py-spy cannot read native frames here (plain dump taken)")
    assert "blocked_here" in text
    assert "libpython" in text or "libc" in text  # frames below the interpreter


def test_a_rank_without_its_handler_is_not_signalled(tmp_path: Path) -> None:
    """The dump signal's default action kills: a rank that has not yet registered its
    handler is left alone (and lives)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert dump_stacks(tmp_path, 1, proc.pid, method="faulthandler", timeout_s=1.0) is None
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_stack_files_are_not_written_through_a_symlink(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("untouched")
    out = stack_file(tmp_path, 3, child.pid)
    out.unlink()  # the child's handler holds its own open file; plant a link in its place
    out.symlink_to(victim)
    dump_stacks(tmp_path, 3, child.pid, method="py-spy", timeout_s=5.0)
    assert victim.read_text() == "untouched"


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not on PATH")
def test_a_stopped_process_is_read_by_py_spy_and_stays_stopped(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    """py-spy's pause of a stopped process fails; read as it is, the rank's stacks come
    from py-spy and the rank is not let run (faulthandler's fallback sends SIGCONT)."""
    os.kill(child.pid, signal.SIGSTOP)
    assert _wait_state(child.pid, "Tt") in "Tt"
    path = dump_stacks(tmp_path, 3, child.pid, method="auto", timeout_s=20.0)
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    assert "=== py-spy dump at" in text and "--nonblocking" in text
    assert "blocked_here" in text
    time.sleep(0.2)
    assert _state(child.pid) in "Tt"  # still stopped


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not on PATH")
def test_without_native_frames_py_spy_takes_the_python_frames_only(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    path = dump_stacks(tmp_path, 3, child.pid, method="py-spy", timeout_s=20.0, native=False)
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    assert "=== py-spy dump at" in text and "blocked_here" in text
    assert "native frames included" not in text
