"""``--preload``: the ranks are forked only once the fork server has imported its
modules. Python's fork server answers a fork request after its preload imports, so torch
elastic's start of the workers waits that long; on a loaded machine a heavy preload can
outlast ``heartbeat.initial_process_timeout_s``.

:class:`ForkWait` tells node 0's monitor (``HeartbeatRules.note_ranks_forking``) that the
launcher waits for the fork server, then when the ranks were forked: the initial timeout
counts from that fork, not from the monitor's start, so ranks that could not be started
yet are not reported as never seen. A fork server still importing when that timeout has
run is said as such, in one line naming the preload and how long it has imported.
Without ``--preload`` nothing of this runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankguard.monitor.monitor import JobMonitor

__all__ = ["ForkWait"]

logger = logging.getLogger(__name__)


class ForkWait:
    """The agent's start of forked ranks (``--preload``): :meth:`forking` before torch
    elastic starts them, :meth:`forked` once it did (each start, restarts included)."""

    def __init__(
        self,
        modules: tuple[str, ...],
        server_started_s: float,
        timeout_s: float,
        say: Callable[[str], None],
        monitor: Callable[[], JobMonitor | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``server_started_s``: when the fork server was started (``clock``);
        ``timeout_s``: the initial timeout, after which a fork server still importing
        is said; ``monitor``: node 0's monitor now (None on another node)."""
        self.modules = modules
        self.server_started_s = server_started_s
        self.timeout_s = timeout_s
        self.say = say
        self.monitor = monitor
        self.clock = clock
        self.imported_s: float | None = None  # how long the imports took (first fork)
        self.said: str | None = None  # the line said while the fork server imported
        self._lock = threading.Lock()
        self._waiting = False
        self._timer: threading.Timer | None = None

    def forking(self) -> None:
        """The agent starts the ranks: the monitor's initial timeout waits for the fork;
        the line is said if the fork server is still importing ``timeout_s`` from now."""
        self._tell(None)
        with self._lock:
            self._waiting = True
            if self.imported_s is None and self.said is None and self._timer is None:
                timer = threading.Timer(self.timeout_s, self.still_importing)
                timer.daemon = True
                timer.name = "rankguard-fork-wait"
                self._timer = timer
                timer.start()

    def forked(self) -> None:
        """The ranks were forked (or their start failed): the initial timeout counts
        from now."""
        with self._lock:
            self._waiting = False
            timer, self._timer = self._timer, None
            if self.imported_s is None:
                self.imported_s = self.clock() - self.server_started_s
        if timer is not None:
            timer.cancel()
        self._tell(True)

    def still_importing(self) -> None:
        """The initial timeout ran while the agent waits for the fork server: one line,
        once."""
        with self._lock:
            if not self._waiting or self.said is not None or self.imported_s is not None:
                return
            waited = self.clock() - self.server_started_s
            line = (
                f"--preload {','.join(self.modules)}: the fork server has imported for "
                f"{waited:.1f}s and has not forked the ranks yet; "
                f"initial_process_timeout_s={self.timeout_s:g} counts from their fork"
            )
            self.said = line
        self.say(line)

    def _tell(self, forked: bool | None) -> None:
        try:
            monitor = self.monitor()
            if monitor is not None:
                monitor.rules.note_ranks_forking(monitor.clock() if forked else None)
        except Exception:
            logger.exception("rankguard: telling the monitor of the ranks' fork failed")
