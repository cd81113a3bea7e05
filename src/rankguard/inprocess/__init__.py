"""In-process restart: recover from a fault or a hang inside the same processes.

``rankguard.inprocess.wrap(train)`` (or ``@rankguard.inprocess.wrap``) re-enters
``train`` on every rank after an exception in any rank or a hang, without starting
Python again: the process group is torn down and initialised anew through the job's
store, and ``train`` is called again; it learns how many times with
:func:`restart_count`; :func:`atomic` keeps a section (the optimizer step and the state
a re-entry resumes from) whole. With standbys (``--standby-ranks``),
:func:`live_state` declares the state a standby taking a lost rank's place gets from a
peer. See ``docs/inprocess.md`` and
``docs/live_recovery.md``.
"""

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.interrupt import RestartInterrupt
from rankguard.inprocess.wrapper import (
    HARD_TIMEOUT_EXIT_CODE,
    RESTART_PHASE,
    InProcessRestartError,
    RestartInfo,
    atomic,
    current,
    live_link,
    restart_count,
    run_config,
    wrap,
)
from rankguard.live.state import live_state

__all__ = [
    "HARD_TIMEOUT_EXIT_CODE",
    "RESTART_PHASE",
    "InProcessRestartConfig",
    "InProcessRestartError",
    "RestartInfo",
    "RestartInterrupt",
    "atomic",
    "current",
    "live_link",
    "live_state",
    "restart_count",
    "run_config",
    "wrap",
]
