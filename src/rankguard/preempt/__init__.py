"""Preemption: the exit signal sets a flag, every rank saves one agreed step, the job
exits with ``EXIT_PREEMPTED`` to be requeued, and the next run resumes there.

- :mod:`.config`: ``PreemptionConfig`` (Megatron Bridge's names);
- :mod:`.handler`: the rank's flag-only signal handler, the DataLoader worker helper;
- :mod:`.rank`: the rank side (the launcher told, save times in heartbeats);
- :mod:`.saver`: the ``Saver`` protocol (``save(step)``, ``wait()``), a plain file saver;
- :mod:`.coordinator`: the launcher side (forward, agree, wait ``preempt_time``, kill);
- :mod:`.launch`: what ``rankguard run`` builds from it (start, budget, outcome);
- :mod:`.budget`: does a save fit the grace window?

See ``docs/preemption.md``.
"""

from rankguard.preempt.config import EXIT_SIGNALS, PreemptionConfig, parse_exit_signal
from rankguard.preempt.handler import ExitSignalHandler, ignore_exit_signal
from rankguard.preempt.saver import Saver, TorchFileSaver, save_and_wait

__all__ = [
    "EXIT_SIGNALS",
    "ExitSignalHandler",
    "PreemptionConfig",
    "Saver",
    "TorchFileSaver",
    "ignore_exit_signal",
    "parse_exit_signal",
    "save_and_wait",
]
