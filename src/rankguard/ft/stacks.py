"""Python stacks of a rank, taken before it is killed.

Two ways, best first:

- ``py-spy dump --pid`` when py-spy is on PATH (``pip install 'rankguard[stacks]'`` on
  every node): reads the process from outside, works on a wedged process; with
  ``--native`` where py-spy supports it, so a rank stuck in a C++ collective shows the
  native frames (``py-spy dump --native``), else without. A stopped process (SIGSTOP,
  state ``T``) is read with ``--nonblocking`` (Python frames only): py-spy's own pause
  of the process fails on a stopped one ("Failed to get stack traces"), and the
  faulthandler fallback would let it run again;
- faulthandler: every rank started by ``rankguard run`` registers
  ``faulthandler.register(DUMP_SIGNAL, file=<run_dir>/stacks/rank_<r>_pid_<p>.txt,
  all_threads=True)`` at start-up; the launcher sends the signal and faulthandler's C
  handler writes every thread's stack, even while the main thread is blocked in C
  (sleep, a collective). A stopped process gets SIGCONT after the signal so it can write.

The launcher calls :func:`dump_stacks` before any kill, and the finding names the file.

The dump signal goes only to a process that handles it (``SigCgt`` in
``/proc/<pid>/status``): sent to a rank that has not yet registered its handler, its
default action would kill the rank. Stack files are opened without following a
symbolic link (one planted in the stacks folder would redirect the append), in a
``stacks/`` folder made with the run directory's mode and checked to be this user's
(:func:`rankguard.util.fs.owned_subdir`): a group member who may read the run cannot write
there.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from rankguard.schema.layout import STACKS_DIR, RunLayout
from rankguard.util.fs import owned_subdir
from rankguard.util.procs import process_state

__all__ = ["DUMP_SIGNAL", "dump_stacks", "handles_signal", "install_dump_handler", "stack_file"]

logger = logging.getLogger(__name__)

# A real-time signal nobody else uses (SIGUSR1/2 belong to schedulers and users).
DUMP_SIGNAL = signal.SIGRTMIN + 3


def stack_file(run_dir: Path, rank: int, pid: int) -> Path:
    return RunLayout(Path(run_dir)).stack_dump(rank, pid)


def _open_append(path: Path) -> IO[Any]:
    """``path`` opened to append text, never through a symbolic link (ELOOP)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
    return os.fdopen(fd, "a", encoding="utf-8")


def handles_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: its ``SigCgt`` mask);
    False when that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def install_dump_handler(run_dir: Path, rank: int) -> IO[Any] | None:
    """Rank side, at start-up: faulthandler writes all threads' stacks on DUMP_SIGNAL.
    Keep the returned file open for the life of the process."""
    path = stack_file(run_dir, rank, os.getpid())
    try:
        owned_subdir(run_dir, STACKS_DIR)
        fh = _open_append(path)  # must outlive this call
        faulthandler.register(DUMP_SIGNAL, file=fh, all_threads=True, chain=False)
        return fh
    except (OSError, RuntimeError, ValueError) as exc:
        logger.warning("rankguard: no stack dumps for this rank: %s", exc)
        return None


def _py_spy(pid: int, out: Path, timeout_s: float, native: bool = True) -> bool:
    exe = shutil.which("py-spy")
    if exe is None:
        return False
    # Native frames first (a rank stuck inside a C++ collective shows where); py-spy
    # builds or platforms without them fail fast, and the plain dump follows.
    # A stopped process is read as it is (--nonblocking: no pause, no native frames).
    deadline = time.monotonic() + timeout_s
    stopped = process_state(pid) in ("T", "t")
    tries = [["--nonblocking"]] if stopped else [["--native"], []] if native else [[]]
    for extra in tries:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            res = subprocess.run(
                [exe, "dump", "--pid", str(pid), *extra],
                capture_output=True,
                text=True,
                timeout=left * 0.6 if extra == ["--native"] else left,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("rankguard: py-spy dump %s of pid %d failed: %s", extra, pid, exc)
            continue
        if res.returncode == 0:
            break
        logger.warning("rankguard: py-spy dump of pid %d: %s", pid, res.stderr.strip())
    else:
        return False
    try:
        owned_subdir(out.parent.parent, out.parent.name)
        fh = _open_append(out)
    except OSError as exc:
        logger.warning("rankguard: cannot write the stacks of pid %d to %s: %s", pid, out, exc)
        return False
    with fh:
        fh.write(f"\n=== py-spy dump at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ===\n")
        if extra == ["--native"]:
            fh.write("(py-spy --native: native frames included)\n")
        elif extra:
            fh.write("(py-spy --nonblocking: the process was stopped; Python frames only)\n")
        fh.write(res.stdout)
    return True


def _size(path: Path) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if not os.path.islink(path) else 0


def _faulthandler(pid: int, out: Path, timeout_s: float) -> bool:
    if not handles_signal(pid, DUMP_SIGNAL):
        logger.warning(
            "rankguard: pid %d has no stack dump handler (yet): not signalled (the signal "
            "would kill it)",
            pid,
        )
        return False
    before = _size(out)
    try:
        os.kill(pid, DUMP_SIGNAL)
        if process_state(pid) in ("T", "t"):
            os.kill(pid, signal.SIGCONT)  # let it run the handler; it is killed next
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    size, stable_since = before, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = _size(out)
        if now_size != size:
            size, stable_since = now_size, time.monotonic()
        elif size > before and time.monotonic() - stable_since > 0.05:
            return True
    return size > before


def dump_stacks(
    run_dir: Path,
    rank: int,
    pid: int,
    *,
    method: str = "auto",
    timeout_s: float = 10.0,
    native: bool = True,
) -> str | None:
    """Write the stacks of ``pid`` to its stack file; the path, or None when it failed.
    ``native``: py-spy tries native frames first (it pauses the process to unwind them:
    seconds on a loaded machine); False: Python frames only."""
    out = stack_file(run_dir, rank, pid)
    if method in ("auto", "py-spy") and _py_spy(pid, out, timeout_s, native):
        return str(out)
    if method == "py-spy":
        logger.warning("rankguard: stack_dump=py-spy but py-spy failed; trying faulthandler")
    if _faulthandler(pid, out, timeout_s):
        return str(out)
    return None
