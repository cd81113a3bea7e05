"""``rankguard`` CLI with a fault in the launcher process itself, for ``fault_matrix.py``.

Nothing in the package is changed on disk: this wrapper imports the CLI, wraps one public
method of a launcher-side class in this process only, then runs the CLI as usual.

- ``FAULT_MATRIX_INJECT=monitor_crash``: once the file ``FAULT_MATRIX_TRIGGER`` exists,
  ``JobMonitor.scan_once`` raises when the monitor thread calls it (a bug that escapes
  the scan's own guard into the thread). ``FAULT_MATRIX_MODE=once``: the first such call
  raises and removes the trigger (a bug hit once); ``always`` (default): every later call
  in that thread raises. Scans from the main thread (the final drain at the end of the
  job) still run.
- ``FAULT_MATRIX_INJECT=relay_death``: likewise ``StoreRelay.push_once`` in the relay
  thread of a node > 0: the node's relay stops pushing while its ranks keep training.

Usage: ``FAULT_MATRIX_INJECT=... FAULT_MATRIX_TRIGGER=PATH python
bench/fault_matrix_launcher.py run ...`` (the arguments of ``rankguard``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rankguard.cli.main import main
from rankguard.monitor.monitor import JobMonitor
from rankguard.relay.relay import StoreRelay


class InjectedThreadDeath(RuntimeError):
    pass


def _dies_on_trigger(
    method: Callable[..., Any], thread_name: str, trigger: str, once: bool = False
) -> Any:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == thread_name and os.path.exists(trigger):
            if once:
                os.unlink(trigger)
            print(
                f"[fault-matrix] {thread_name} thread dies now ({time.time():.3f})",
                file=sys.stderr,
                flush=True,
            )
            raise InjectedThreadDeath(f"injected death of the {thread_name} thread")
        return method(self, *args, **kwargs)

    return wrapped


def arrange() -> None:
    kind = os.environ.get("FAULT_MATRIX_INJECT", "")
    trigger = os.environ.get("FAULT_MATRIX_TRIGGER", "")
    if kind == "monitor_crash" and trigger:
        once = os.environ.get("FAULT_MATRIX_MODE", "always") == "once"
        JobMonitor.scan_once = _dies_on_trigger(  # type: ignore[method-assign]
            JobMonitor.scan_once, "rankguard-monitor", trigger, once
        )
    elif kind == "relay_death" and trigger:
        StoreRelay.push_once = _dies_on_trigger(  # type: ignore[method-assign]
            StoreRelay.push_once, "rankguard-relay", trigger
        )
    elif kind:
        raise SystemExit(f"fault_matrix_launcher: unknown FAULT_MATRIX_INJECT={kind!r}")


if __name__ == "__main__":
    arrange()
    sys.exit(main())
