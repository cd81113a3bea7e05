"""A standby's session: silent while it waits, the rank's own once it takes one.

A standby writes no heartbeats (the monitor knows only the training ranks, and a
healthy run shows no standby activity): its session behaves as the no-op
:class:`~rankguard.session.NullSession` until :meth:`StandbySession.promote`, called by
the in-process wrapper when the standby takes a rank, builds the session that rank's
environment calls for. From then on every attribute is the new session's, looked up at
call time, so the ``rankguard.init()`` the script made during its set-up serves the new
rank too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankguard.session import NullSession

__all__ = ["StandbySession"]

_OWN = frozenset({"_build", "_inner", "promote", "promoted"})


class StandbySession(NullSession):
    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._inner: Any = None

    @property
    def promoted(self) -> bool:
        return object.__getattribute__(self, "_inner") is not None

    def promote(self) -> None:
        """The standby took a rank: from now on, that rank's session."""
        if self.promoted:
            return
        inner = self._build()
        self._inner = inner
        inner.install_optimizer_hook()

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN or name.startswith("__"):
            return object.__getattribute__(self, name)
        inner = object.__getattribute__(self, "_inner")
        if inner is None:
            return object.__getattribute__(self, name)
        return getattr(inner, name)
