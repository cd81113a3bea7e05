"""Cost of recognising the phase (eval, checkpointing) from the main thread's stack.

What: the heartbeat thread (each record) and the perf thread (each poll, 0.2 s) call
``PhaseWatcher.observe()``: ``sys._current_frames()``, then a walk from the main thread's
innermost frame outwards with one cached verdict per code object. Measured from a second
thread while the main thread is parked at the bottom of a stack of D Python frames
(D = 20, 60, 150; an HF Trainer evaluation is ~40-80 deep): median ns per ``observe()``
over 21 repeats of 2,000 calls,

- ``train``: no frame names a phase, the whole stack is walked (the common case);
- ``eval at the bottom``: ``estimate_loss`` is the outermost frame (worst case of a hit);
- ``eval, cold cache``: a fresh watcher each call (the first sample of each code object);
- next to the floor: ``sys._current_frames()`` alone, which the heartbeat's ``main_frame``
  evidence already paid before phases existed.

Times are the sampling thread's CPU time (``time.thread_time_ns``): on a shared machine a
wall clock mostly measures the other processes.

Nothing runs on the training thread; the training hot path is unchanged. The cost per
heartbeat is the figure for the stack depth; per second of training it is that times
(1 / publish_interval_s + 5 polls of the perf thread).

Run: ``python bench/phase_sampling.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable

from rankguard.rank.phases import PhaseWatcher, main_thread_frame
from rankguard.rank.timeline import ProgressTracker


def _deep(n: int, park: Callable[[], None]) -> None:
    if n <= 0:
        park()
        return
    _deep(n - 1, park)


def estimate_loss(n: int, park: Callable[[], None]) -> None:
    _deep(n, park)


def _time(fn: Callable[[], object], calls: int, repeats: int) -> float:
    fn()
    per: list[float] = []
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.thread_time_ns()
            for _ in range(calls):
                fn()
            per.append((time.thread_time_ns() - t0) / calls)
    finally:
        gc.enable()
    return statistics.median(per)


def _measure_while_parked(
    outer: Callable[[int, Callable[[], None]], None],
    depth: int,
    measure: Callable[[], float],
) -> float:
    """Park the main thread ``depth`` frames deep under ``outer``; run ``measure`` from a
    second thread meanwhile."""
    result: list[float] = []
    done = threading.Event()

    def sampler() -> None:
        try:
            result.append(measure())
        finally:
            done.set()

    th = threading.Thread(target=sampler)

    def park() -> None:
        th.start()
        done.wait()

    outer(depth, park)
    th.join()
    return result[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2_000)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--smoke", action="store_true", help="tiny loops (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.calls, args.repeats = 50, 3
    sys.setrecursionlimit(10_000)
    tracker = ProgressTracker(mode="cpu")
    tracker.step_end()  # in train: the watcher samples the stack
    watcher = PhaseWatcher(tracker)
    calls, repeats = args.calls, args.repeats

    def frames_only() -> float:
        return _time(main_thread_frame, calls, repeats)

    def observe() -> float:
        return _time(watcher.observe, calls, repeats)

    def observe_cold() -> float:
        def fresh() -> None:
            PhaseWatcher(tracker).observe()

        return _time(fresh, max(1, calls // 10), repeats)

    def check(expected: str) -> Callable[[], float]:
        def run() -> float:
            phase = watcher.observe()[0]
            assert phase == expected, (phase, expected)
            return observe()

        return run

    print(f"python {sys.version.split()[0]}; median of {repeats} x {calls:,} calls, ns per call")
    print(
        f"{'stack depth':>11}  {'frames only':>11}  {'train':>8}  {'eval@bottom':>11}  "
        f"{'eval cold':>9}"
    )
    rows = []
    for depth in (20, 60, 150):
        floor = _measure_while_parked(_deep, depth, frames_only)
        train = _measure_while_parked(_deep, depth, check("train"))
        hit = _measure_while_parked(estimate_loss, depth, check("eval"))
        cold = _measure_while_parked(estimate_loss, depth, observe_cold)
        rows.append((depth, floor, train, hit, cold))
        print(f"{depth:>11}  {floor:>11.0f}  {train:>8.0f}  {hit:>11.0f}  {cold:>9.0f}")
    depth, _, train, hit, _ = rows[1]
    per_s = 1 / 5.0 + 5
    print(
        f"\nat depth {depth}: {max(train, hit) / 1000:.1f} us per sample; with the default "
        f"publish interval (5 s) and the perf thread's 0.2 s polls, "
        f"{per_s * max(train, hit) / 1e9 * 100:.4f} % of one core (and of the GIL), none "
        "of it on the training thread"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
