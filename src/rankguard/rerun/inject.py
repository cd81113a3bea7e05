"""Error injection with Megatron Bridge's keys: a failed validation about once every
``error_injection_rate`` validations, and what its re-runs then show:

- ``transient_error``: the re-run in place differs (-> continue);
- ``persistent_error``: the same in place, different after the resume (-> exit 16, 17);
- ``correct_result``: the same everywhere (-> exit 16, then a data or model problem).

The injector draws from its own generator (seeded per rank): the training's random
streams are untouched. Its verdict rides in the rerun state across the resume.
"""

from __future__ import annotations

import math
import random

__all__ = ["ErrorInjector"]


class ErrorInjector:
    __slots__ = ("_rng", "injected", "kind", "rate")

    def __init__(self, rate: int, kind: str, *, seed: int, rank: int) -> None:
        self.rate = rate
        self.kind = kind
        self._rng = random.Random(seed * 1_000_003 + rank)
        self.injected: str | None = None  # the type injected in this iteration

    def maybe_inject(self) -> bool:
        """Fail this validation? At most one injection per iteration."""
        if self.rate <= 0 or self.injected is not None:
            return False
        if self._rng.randrange(self.rate) != 0:
            return False
        self.injected = self.kind
        return True

    def in_place(self, diff: float) -> float:
        """The relative difference the re-run in place shows."""
        if self.injected is None:
            return diff
        return math.inf if self.injected == "transient_error" else 0.0

    def after_resume(self, diff: float) -> float:
        """The relative difference the re-run after the resume shows."""
        if self.injected is None:
            return diff
        return math.inf if self.injected == "persistent_error" else 0.0
