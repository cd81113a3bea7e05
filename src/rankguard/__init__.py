"""rankguard: keeps distributed PyTorch training alive and says what is wrong.

In a training script started by ``rankguard run``::

    import rankguard
    rg = rankguard.init()            # no-op outside the launcher
    for i, batch in enumerate(loader):
        with rg.step(i):             # or: ...; rg.step_end(i)
            loss = train_step(batch)
    with rg.checkpoint("step_100"):  # long saves do not look like hangs
        save(...)

Code that takes a session types it ``rankguard.RankSession`` (both sessions satisfy it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankguard.bootstrap import init
    from rankguard.rank.ranksession import RankSession
    from rankguard.session import NullSession, Session, current

__all__ = ["NullSession", "RankSession", "Session", "__version__", "current", "init"]

__version__ = "0.1.0"

# The rank's API is imported on first use: ``rankguard run``'s launcher and the other
# commands import ``rankguard.<part>`` and never need the rank side (sessions, perf
# reporter, heartbeat publisher), which costs every launcher about 0.1 s of CPU.
_LAZY = {
    "init": "rankguard.bootstrap",
    "RankSession": "rankguard.rank.ranksession",
    "NullSession": "rankguard.session",
    "Session": "rankguard.session",
    "current": "rankguard.session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rankguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
