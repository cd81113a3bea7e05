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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.interrupt import RestartInterrupt

if TYPE_CHECKING:
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

# The wrapper (and with it live recovery's state exchange) is imported at the first use
# of one of its names, not with the package: every rank reads its config section
# (``rankguard.config`` imports :mod:`.config` and so this package), and most wrap
# nothing; importing the wrapper there was a third of a rank's own imports.
_LAZY = {
    **dict.fromkeys(
        (
            "HARD_TIMEOUT_EXIT_CODE",
            "RESTART_PHASE",
            "InProcessRestartError",
            "RestartInfo",
            "atomic",
            "current",
            "live_link",
            "restart_count",
            "run_config",
            "wrap",
        ),
        "rankguard.inprocess.wrapper",
    ),
    "live_state": "rankguard.live.state",
}
_SUBMODULES = frozenset(
    ("config", "interrupt", "monitor", "peers", "policy", "setup", "sockets", "wrapper")
)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:  # ``rankguard.inprocess.wrapper`` read as an attribute
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
