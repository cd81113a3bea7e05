"""A full garbage collection in a rank, before and after rankguard's start-up freeze.

What: a rank has imported torch and rankguard (``rankguard.launcher.worker``, what every
rank imports before the script) and built an optimizer (which imports ``torch._dynamo``).
A full collection (``gc.collect()``) is timed, median of ``--repeats``; then
:func:`rankguard.util.gcfreeze.freeze_startup` runs as the worker runs it before the script,
here after the optimizer so that the whole start-up is frozen, and a full collection is
timed again. The worker freezes before the script, so a real rank keeps the objects the
optimizer's import makes in the walk: the third line, "worker's point", is a
fresh process frozen at the worker's point, then the optimizer built.

Why: the interpreter starts a full collection whenever enough long-lived objects were
made; in a rank that walk is a pause of the training thread no step time explains, at a
moment no rank chooses (straggler noise).

Also: the CPU a process spends on its start-up imports (``import torch`` and
``rankguard.launcher.worker``, then :func:`~rankguard.util.gcfreeze.freeze_startup`) with the
interpreter's automatic collections on, and paused as the launcher and the worker pause
them (:func:`~rankguard.util.gcfreeze.pause_collection`): median of ``--repeats`` fresh
processes each, interleaved.

Run: ``python bench/gc_pause.py [--repeats 7]``; ``--smoke``: 3 repeats, one start-up each way.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

_CHILD = """
import gc, resource, statistics, sys, time

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

t0 = cpu()
import torch
import rankguard.launcher.worker
from rankguard.util.gcfreeze import freeze_startup

def full(n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); gc.collect(); out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3

n = int(sys.argv[1])
if sys.argv[2] == "worker":
    freeze_startup()
    startup = cpu() - t0  # what _START measures with collections on (--smoke reads it)
opt = torch.optim.AdamW(torch.nn.Linear(8, 8).parameters())
before = full(n) if sys.argv[2] == "after" else None
if sys.argv[2] == "after":
    freeze_startup()
print(before, full(n), len(gc.get_objects()), gc.get_freeze_count())
if sys.argv[2] == "worker" and sys.argv[3:] == ["startup"]:
    print(startup)
"""


_START = """
import resource, sys

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

t0 = cpu()
from rankguard.util.gcfreeze import freeze_startup, pause_collection
if sys.argv[1] == "paused":
    pause_collection()
import torch
import rankguard.launcher.worker
freeze_startup()
print(cpu() - t0)
"""


def _startup_cpu_s(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _START, mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(out.stdout.split()[-1])


def _child(repeats: int, when: str, *extra: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _CHILD, str(repeats), when, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return out.stdout.split()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="1 repeat, one start-up each way (the one with collections on is the "
        "worker's-point child's own)",
    )
    args = p.parse_args()
    repeats = 1 if args.smoke else args.repeats
    t0 = time.monotonic()
    before, after, tracked, frozen = _child(repeats, "after")
    # --smoke: the worker's-point child also says its start-up CPU (collections on, as
    # _START "on" measures it), one interpreter fewer
    _, at_worker, tracked_w, frozen_w, *startup_on = _child(
        repeats, "worker", *(["startup"] if args.smoke else [])
    )
    print(f"full collection, nothing frozen:        {float(before):7.1f} ms")
    print(
        f"frozen after the optimizer:             {float(after):7.1f} ms "
        f"({tracked} objects tracked, {frozen} frozen)"
    )
    print(
        f"frozen at the worker's point:           {float(at_worker):7.1f} ms "
        f"({tracked_w} objects tracked, {frozen_w} frozen)"
    )
    print(f"ratio nothing frozen / worker's point:  {float(before) / float(at_worker):7.1f}x")
    on: list[float] = []
    paused: list[float] = []
    if startup_on:  # --smoke
        on.append(float(startup_on[0]))
        paused.append(_startup_cpu_s("paused"))
    for _ in range(0 if args.smoke else repeats):  # interleaved: drift falls on both alike
        on.append(_startup_cpu_s("on"))
        paused.append(_startup_cpu_s("paused"))
    cpu_on, cpu_paused = statistics.median(on), statistics.median(paused)
    print(f"start-up imports, collections on:       {cpu_on * 1e3:7.0f} ms CPU")
    print(
        f"start-up imports, collections paused:   {cpu_paused * 1e3:7.0f} ms CPU "
        f"(saves {(cpu_on - cpu_paused) * 1e3:.0f} ms per process start)"
    )
    print(f"({repeats} repeats each, {len(on)} start-ups, {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
