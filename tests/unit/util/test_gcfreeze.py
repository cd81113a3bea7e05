"""freeze_startup: what a process holds before its work is kept out of the collector's
walks; what the work makes is collected as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# One interpreter per check: a freeze cannot be undone for what a test run holds.
_FREEZE = textwrap.dedent(
    """
    import gc, time
    import torch
    from rankguard.util.gcfreeze import freeze_startup

    def full_collection_ms():
        t0 = time.perf_counter(); gc.collect(); return (time.perf_counter() - t0) * 1e3

    before = full_collection_ms()
    freeze_startup()
    frozen = gc.get_freeze_count()
    after = min(full_collection_ms() for _ in range(3))

    finalized = []
    class Cycle:
        def __init__(self):
            self.me = self
        def __del__(self):
            finalized.append(True)
    Cycle()
    gc.collect()
    print(frozen, before, after, finalized == [True])
    """
)


def test_torch_is_frozen_and_what_comes_after_is_still_collected() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    frozen, before, after, finalized = int(out[0]), float(out[1]), float(out[2]), out[3]
    assert frozen > 50_000  # torch's module state
    assert after < before / 5, (before, after)  # a full collection no longer walks it
    assert finalized == "True"  # a cycle made after the freeze is collected, finalizer run


_PAUSE = textwrap.dedent(
    """
    import gc
    from rankguard.util.gcfreeze import freeze_startup, pause_collection, resume_collection

    pause_collection()
    paused = not gc.isenabled()
    import torch
    freeze_startup()
    print(paused, gc.isenabled(), gc.get_freeze_count(), gc.collect())

    gc.disable()  # off by the program's own choice: the pause leaves it off
    pause_collection()
    resume_collection()
    freeze_startup()
    print(gc.isenabled())
    """
)


def test_the_start_up_pause_ends_with_the_freeze_and_respects_a_collector_left_off() -> None:
    """The start-up imports run without automatic collections; the freeze collects their
    garbage once and turns collection back on, unless it was off before the pause."""
    lines = subprocess.run(
        [sys.executable, "-c", _PAUSE], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    paused, enabled, frozen, garbage_after = lines[0].split()
    assert (paused, enabled) == ("True", "True")
    assert int(frozen) > 50_000 and int(garbage_after) == 0  # collected before the freeze
    assert lines[1] == "False"
