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

from rankguard.bootstrap import init
from rankguard.ranksession import RankSession
from rankguard.session import NullSession, Session, current

__all__ = ["NullSession", "RankSession", "Session", "__version__", "current", "init"]

__version__ = "0.1.0"
