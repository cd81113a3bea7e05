"""The ledger while the job runs: status.json's ``goodput`` block and ``goodput.json``.

Node 0's monitor merges :meth:`GoodputStatus.status_fields` into every status it
writes. Reading the run directory costs the size of rank 0's heartbeat files, so the
ledger is computed again at most every ``interval_s`` (the block in between is the last
one), and once more when the run is over (``ended()`` true: the monitor's final
status), which is then marked ``final``. Each new ledger is also written whole to
``goodput.json`` in the run directory (atomically), for readers that want the parts
without status.json: the trackers of rank 0's perf thread.

The block::

    "goodput": {"final": false, "wall_s": 312.4, "ettr": 0.931,
                "productive_s": 290.9, "attempts": 2, "interruptions": 1,
                "largest_loss": {"part": "startup", "seconds": 11.2},
                "parts_s": {"productive": 290.9, "startup": 11.2, ...}}
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from rankguard.goodput.ledger import ETTR_DIGITS, PARTS, Ledger, Part
from rankguard.goodput.rundir import read_ledger
from rankguard.schema.layout import GOODPUT_FILE
from rankguard.schema.statusblocks import GoodputBlock, LargestLoss
from rankguard.util.fs import atomic_write_json

__all__ = ["DEFAULT_INTERVAL_S", "GoodputStatus", "goodput_block", "largest_loss"]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0


def largest_loss(parts: dict[Part, float]) -> tuple[Part, float] | None:
    """The part other than productive training that took the most time (None: none)."""
    losses = [(v, p) for p, v in parts.items() if p is not Part.PRODUCTIVE and v > 0]
    if not losses:
        return None
    value, part = max(losses, key=lambda x: x[0])
    return part, value


def goodput_block(ledger: Ledger, *, final: bool) -> GoodputBlock:
    """status.json's ``goodput`` block of ``ledger``."""
    loss = largest_loss(ledger.parts)
    return GoodputBlock(
        final=final,
        wall_s=round(ledger.wall_s, 3),
        ettr=None if ledger.ettr is None else round(ledger.ettr, ETTR_DIGITS),
        productive_s=round(ledger.parts[Part.PRODUCTIVE], 3),
        attempts=ledger.attempts,
        interruptions=len(ledger.interruptions),
        largest_loss=None if loss is None else LargestLoss(loss[0].value, round(loss[1], 3)),
        parts_s={p.value: round(ledger.parts[p], 3) for p in PARTS},
    )


class GoodputStatus:
    """A status source (:class:`rankguard.monitor.api.StatusSource`): the ledger of
    ``run_dir``, at most every ``interval_s`` and a last time once ``ended()``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        ended: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s}")
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self._ended = ended
        self._clock = clock
        self._due = -float("inf")
        self._final = False
        self.block: GoodputBlock | None = None
        self.write_errors = 0

    def status_fields(self) -> dict[str, GoodputBlock]:
        if not self._final:
            final = self._ended()
            now = self._clock()
            if final or now >= self._due:
                self._due = now + self.interval_s
                self._compute(final)
        return {} if self.block is None else {self.block.name: self.block}

    def _compute(self, final: bool) -> None:
        ledger = read_ledger(self.run_dir)
        if ledger is None:
            return
        self._final = final
        self.block = goodput_block(ledger, final=final)
        try:
            atomic_write_json(
                self.run_dir / GOODPUT_FILE, {**ledger.to_dict(), "final": final}, indent=None
            )
        except OSError as exc:  # the status says the same; the next ledger tries again
            self.write_errors += 1
            if self.write_errors == 1:
                logger.error("rankguard goodput: cannot write %s: %s", GOODPUT_FILE, exc)
