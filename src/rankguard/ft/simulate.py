"""Simulated faults (Megatron Bridge's ``simulate_fault``), so users can check their setup.

On the target rank (``simulated_fault_rank``, or one chosen at random, the same on
every rank), ``simulated_fault_base_delay`` plus up to as much again after start-up,
and only in the first attempt (not again after the restart it causes):

- ``rank_hung``: SIGSTOP to itself (process frozen: heartbeats stop);
- ``rank_killed``: SIGKILL to itself (process gone: the agent restarts);
- ``rank_stalled``: the main thread blocks (a signal whose handler sleeps) while the
  heartbeat thread lives on (no progress);
- ``random``: one of the three, chosen with the run id as seed.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from types import FrameType

from rankguard.ft.config import FaultToleranceConfig

__all__ = ["STALL_SIGNAL", "FaultSimulator"]

logger = logging.getLogger(__name__)

STALL_SIGNAL = signal.SIGRTMIN + 4
_CONCRETE = ("rank_hung", "rank_killed", "rank_stalled")


def _stall(signum: int, frame: FrameType | None) -> None:
    while True:  # the main thread stays here; other threads keep running
        time.sleep(3600)


class FaultSimulator:
    def __init__(
        self, cfg: FaultToleranceConfig, *, rank: int, world_size: int, run_id: str
    ) -> None:
        rng = random.Random(f"{run_id}/simulated-fault")
        self.fault = (
            rng.choice(_CONCRETE)
            if cfg.simulated_fault_type == "random"
            else cfg.simulated_fault_type
        )
        self.target = (
            cfg.simulated_fault_rank
            if cfg.simulated_fault_rank is not None
            else rng.randrange(world_size)
        )
        self.delay_s = cfg.simulated_fault_base_delay * (1.0 + rng.random())
        self.rank = rank
        self._thread: threading.Thread | None = None

    @property
    def armed(self) -> bool:
        return self.rank == self.target

    def start(self) -> None:
        """Arm the fault (main thread: the stall needs its signal handler here)."""
        if not self.armed:
            return
        if self.fault == "rank_stalled":
            signal.signal(STALL_SIGNAL, _stall)
        self._thread = threading.Thread(target=self._run, name="rankguard-fault", daemon=True)
        self._thread.start()
        logger.warning(
            "rankguard: simulated fault %s armed on rank %d in %.1fs",
            self.fault,
            self.rank,
            self.delay_s,
        )

    def _run(self) -> None:
        time.sleep(self.delay_s)
        print(f"[rankguard] simulating fault {self.fault} on rank {self.rank}", flush=True)
        pid = os.getpid()
        if self.fault == "rank_hung":
            os.kill(pid, signal.SIGSTOP)
        elif self.fault == "rank_killed":
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, STALL_SIGNAL)
