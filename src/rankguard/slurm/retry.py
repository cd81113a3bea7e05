"""Job-level retry decision, shared by the sbatch script and ``rankguard slurm retry``.

``rankguard run`` restarts the ranks inside the job (``--max-restarts``) and, once that
budget is spent, exits with a code from :mod:`rankguard.launcher.exitcodes`. Whether the
whole job is then run again is decided here, by :func:`decide`:

- ``0``                              -> :attr:`Decision.DONE`
- ``EXIT_PREEMPTED`` (14)            -> :attr:`Decision.REQUEUE`, always: a preemption is
                                        not a failure and spends no retry
- a code outside :data:`RETRYABLE`   -> :attr:`Decision.GIVE_UP` (retrying cannot help;
                                        among them ``EXIT_WILL_REPEAT``, 18: the launcher
                                        found that the failure will repeat)
- retryable, retries left            -> :attr:`Decision.REQUEUE`
- retryable, retries spent           -> :attr:`Decision.GIVE_UP`

The sbatch script rendered by :mod:`rankguard.slurm.sbatch` carries a shell copy of this
function (``rg_decide``); the tests check both agree on a table of cases.

:func:`run_with_retries` is the same loop without Slurm's requeue, for an allocation that
is already running (``salloc``, an interactive node, another scheduler): it runs a
command again while it exits with a retryable code.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import Enum
from types import FrameType

from rankguard.launcher.exitcodes import EXIT_PREEMPTED, EXIT_WILL_REPEAT, RETRYABLE

__all__ = ["RETRYABLE", "Decision", "decide", "exit_status", "run_with_retries"]


class Decision(str, Enum):
    """What to do with a job whose launcher exited.

    Terminal: ``DONE`` and ``GIVE_UP`` end the job with the launcher's exit code;
    ``REQUEUE`` starts the job again (Slurm: ``scontrol requeue``; the wrapper: a new
    attempt) and the next attempt is decided again with ``restart_count + 1``.
    """

    DONE = "DONE"
    REQUEUE = "REQUEUE"
    GIVE_UP = "GIVE_UP"


def decide(exit_code: int, restart_count: int, max_retries: int) -> Decision:
    """Decide after an attempt that exited with ``exit_code``.

    ``restart_count`` is how many times the job was already retried (Slurm's
    ``SLURM_RESTART_COUNT``, 0 on the first run); ``max_retries`` is
    ``num_job_retries_on_failure``.
    """
    if restart_count < 0:
        raise ValueError(f"restart_count: must be >= 0, got {restart_count}")
    if max_retries < 0:
        raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
    if exit_code == 0:
        return Decision.DONE
    if exit_code == EXIT_PREEMPTED:
        return Decision.REQUEUE
    if exit_code == EXIT_WILL_REPEAT:  # the launcher's verdict: a retry fails the same way
        return Decision.GIVE_UP
    if exit_code not in RETRYABLE:
        return Decision.GIVE_UP
    if restart_count < max_retries:
        return Decision.REQUEUE
    return Decision.GIVE_UP


def exit_status(returncode: int) -> int:
    """A subprocess return code as a shell reports it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _stderr_log(message: str) -> None:
    print(f"[rankguard slurm retry {_stamp()}] {message}", file=sys.stderr, flush=True)


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _forward_signals(
    current: Callable[[], subprocess.Popen[bytes] | None], stopped: list[int]
) -> Iterator[None]:
    """Pass SIGTERM/SIGINT/SIGHUP to the running attempt and remember that we were asked
    to stop (a preempted or cancelled job must not be retried). Only in the main thread:
    signal handlers cannot be installed elsewhere, and then signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)
        proc = current()
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in _FORWARDED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_with_retries(
    command: Sequence[str],
    *,
    max_retries: int,
    delay_s: float = 0.0,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] = _stderr_log,
) -> int:
    """Run ``command`` up to ``1 + max_retries`` times while it exits with a retryable code.

    Returns the last attempt's exit status (128 + N when killed by signal N; 127 when the
    command cannot be started). A SIGTERM, SIGINT or SIGHUP received meanwhile is passed
    on to the running attempt and ends the loop after it.
    """
    if not command:
        raise ValueError("command: nothing to run")
    if max_retries < 0:
        raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
    if delay_s < 0:
        raise ValueError(f"delay_s: must be >= 0, got {delay_s}")
    total = max_retries + 1
    proc: subprocess.Popen[bytes] | None = None
    stopped: list[int] = []
    code = 0
    with _forward_signals(lambda: proc, stopped):
        for attempt in range(total):
            if stopped:  # a signal arrived between two attempts
                log(
                    f"{signal.Signals(stopped[0]).name} received: stop before attempt {attempt + 1}"
                )
                return code
            log(f"attempt {attempt + 1}/{total}: {subprocess.list2cmdline(list(command))}")
            try:
                proc = subprocess.Popen(list(command), env=None if env is None else dict(env))
            except OSError as exc:
                log(f"attempt {attempt + 1}/{total}: cannot start {command[0]!r}: {exc}")
                return 127
            code = exit_status(proc.wait())
            proc = None
            decision = decide(code, attempt, max_retries)
            if stopped:
                name = signal.Signals(stopped[0]).name
                log(f"attempt {attempt + 1}/{total} exited with code {code}; {name} received: stop")
                return code
            if decision is Decision.DONE:
                log(f"attempt {attempt + 1}/{total} exited with code 0: done")
                return code
            if decision is Decision.GIVE_UP:
                why = "retries spent" if code in RETRYABLE else "not retryable"
                if code == EXIT_WILL_REPEAT:
                    why = "the launcher found that the failure will repeat"
                log(f"attempt {attempt + 1}/{total} exited with code {code}: {why}, give up")
                return code
            if attempt + 1 == total:  # a preemption is requeued, but attempts are spent
                log(f"attempt {attempt + 1}/{total} exited with code {code}: no attempt left")
                return code
            log(f"attempt {attempt + 1}/{total} exited with code {code}: retryable, retry")
            if delay_s:
                time.sleep(delay_s)
    raise AssertionError("unreachable: the last attempt always ends in DONE or GIVE_UP")
