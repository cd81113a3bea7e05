"""The optimizer hook's lead check: by identity through a weak reference.

Next to a real ``opt.step()`` the hook's ``id(optimizer)`` compare (a new integer each
step) cost 80-310 ns more than a weak reference's identity check (``bench/hot_path.py``
part 3 and its README section): the hook makes no ``id()`` call per step, and holding
the lead weakly keeps the script's optimizer (and its state) from living on in the
tracker.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import rankguard.rank.timeline as timeline
from rankguard.rank.timeline import ProgressTracker
from tests.factories import FakeNsClock as FakeClock


class Optimizer:
    pass


def test_the_hook_makes_no_id_call_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def counting_id(obj: object) -> int:
        calls.append(obj)
        return id(obj)

    monkeypatch.setattr(timeline, "id", counting_id, raising=False)
    t = ProgressTracker(clock=FakeClock(), mode="cpu")
    lead, other = Optimizer(), Optimizer()
    for _ in range(3):
        t.optimizer_step_hook(lead, (), {})
        t.optimizer_step_hook(other, (), {})
    assert t.progress_seq == 3 and t.iteration == 3
    assert calls == []


def test_the_hook_holds_its_lead_weakly_and_counts_only_it() -> None:
    t = ProgressTracker(clock=FakeClock(), mode="cpu")
    lead, other = Optimizer(), Optimizer()
    t.optimizer_step_hook(lead, (), {})
    t.optimizer_step_hook(other, (), {})
    t.optimizer_step_hook(lead, (), {})
    assert t.progress_seq == 2
    gone = weakref.ref(lead)
    del lead
    gc.collect()
    assert gone() is None, "the tracker must not keep the script's optimizer alive"
    rebuilt = Optimizer()  # the lead is gone: the next optimizer that steps leads
    t.optimizer_step_hook(rebuilt, (), {})
    t.optimizer_step_hook(other, (), {})  # while the new lead lives, no other counts
    t.optimizer_step_hook(rebuilt, (), {})
    assert t.progress_seq == 4


def test_a_rebuilt_optimizer_takes_the_lead_so_progress_goes_on() -> None:
    """An in-process restart's new round (or a script's second phase) builds a new
    optimizer once the old one is gone: its steps are still the rank's progress."""
    t = ProgressTracker(clock=FakeClock(), mode="cpu")
    for _ in range(3):
        opt = Optimizer()
        for _ in range(2):
            t.optimizer_step_hook(opt, (), {})
        del opt
        gc.collect()
    assert t.progress_seq == 6 and t.iteration == 6


def test_an_optimizer_without_weak_references_still_leads() -> None:
    t = ProgressTracker(clock=FakeClock(), mode="cpu")
    lead = object()  # a plain object() takes no weak references
    t.optimizer_step_hook(lead, (), {})
    t.optimizer_step_hook(object(), (), {})
    t.optimizer_step_hook(lead, (), {})
    assert t.progress_seq == 2 and t.iteration == 2
