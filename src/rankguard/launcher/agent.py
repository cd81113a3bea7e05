"""``RankguardAgent``: torch elastic's ``LocalElasticAgent`` plus notifications.

``SimpleElasticAgent`` is designed to be subclassed through its worker-lifecycle methods;
we extend ``_start_workers`` only to chain our handler in front of the termination
handler that torch elastic installs when it starts the workers, so the monitor learns
that the launcher is stopping the job (SIGTERM/SIGINT/...) before the workers die and
does not report their deaths as faults. torch's handler still runs and still shuts the
workers down as usual.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

__all__ = ["RankguardAgent"]

logger = logging.getLogger(__name__)

_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class RankguardAgent(LocalElasticAgent):
    def __init__(self, *args: Any, on_signal: Callable[[str], None] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self._on_signal = on_signal

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        pids: dict[int, Any] = super()._start_workers(worker_group)
        if self._on_signal is not None and threading.current_thread() is threading.main_thread():
            for name in _SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._chain(sig)
        return pids

    def _chain(self, sig: signal.Signals) -> None:
        previous = signal.getsignal(sig)
        notify = self._on_signal
        assert notify is not None
        if getattr(previous, "_rankguard_chained", False):
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            try:
                notify(signal.Signals(signum).name)
            except Exception:
                logger.exception("rankguard: signal notification failed")
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        handler._rankguard_chained = True  # type: ignore[attr-defined]
        signal.signal(sig, handler)
