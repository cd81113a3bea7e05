"""Hot-path cost of rankguard's per-step calls, in nanoseconds per call.

What, part 1 (tight loops): the per-step calls a training loop makes
(``ProgressTracker.step_end``, ``Session.step_end``, ``with session.step(i)``,
``NullSession.step_end``) and the optimizer hook's callable, each timed as the median of
21 repeats of 200k calls in a tight loop, next to an empty Python function call in the
same loop (the floor: nothing in CPython costs less). ``Session.step_end`` is also timed
while the session's heartbeat thread publishes every 0.01 s (JSON + write + fsync), to
see whether that thread slows the training thread down.

What, part 2 (in a training-like loop): a tight loop keeps the code and branch
predictors hot, which flatters tiny calls. So the same calls are also timed next to a
real ``opt.step()`` (SGD, one 1-element parameter, ~25 us of torch overhead): loop A and
loop B differ only in the measured call, short runs of A and B alternate (ABBA), and the
median of the paired differences is reported with its interquartile range. A control
pair (A against itself) shows the method's bias. Pairs: ``opt.step(); f(i)`` against
``opt.step(); session.step_end(i)``, and ``opt.step()`` without against with
``install_optimizer_hook()``.

What, part 3 (the same, resolved per iteration): on a shared machine part 2's runs of
2,000 iterations differ by several microseconds from one another, more than the calls
measured. So each iteration of ``opt.step(); call(i)`` is also timed on its own
(``perf_counter_ns``), in chunks of 20 per variant, the variants in a new random order
each round; a descheduled or interrupted iteration lands in the upper tail, and the
low quantiles (p10, p25) and the median of each variant are compared with those of
``opt.step(); f(i)``. Variants: the floors (a call that reads the clock, a call that
reads the clock and stores it into a list slot, the least a step end does; a global
optimizer hook that does nothing: torch's dispatch of a hook), ``session.step_end`` and
the optimizer hook.

Timing uses the measuring thread's CPU time (``time.thread_time_ns``), so that time the
thread spends descheduled on a busy machine does not count; ``--wall`` uses the wall
clock as before.

Why: ``step_end`` runs once per training step on every rank, so it must stay in the
noise of a step. The goal is under 1 microsecond per call; for scale, NVRx's
``send_heartbeat`` (an IPC round trip to its monitor) costs about 14 microseconds.

The session is measured after its first ``step_end`` (which takes progress over from the
optimizer hook and rebinds ``session.step_end`` to the tracker's method), i.e. as every
later step of a training loop sees it.

Run: ``python bench/hot_path.py`` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, register_optimizer_step_post_hook

from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.identity import RankIdentity
from rankguard.rank.timeline import ProgressTracker
from rankguard.session import NullSession, Session

GOAL_NS = 1000.0  # step_end under 1 microsecond
NVRX_SEND_HEARTBEAT_NS = 14_000.0  # NVRx send_heartbeat (IPC), for scale

Loop = Callable[[int], int]  # runs n iterations, returns elapsed ns

# The training thread's own CPU time (CLOCK_THREAD_CPUTIME_ID): on a shared machine a
# wall clock also counts the time the thread was descheduled, which no call of ours
# causes and which swamps sub-microsecond differences; ``--wall`` uses perf_counter_ns.
_clock: Callable[[], int] = time.thread_time_ns


# ---- tight loops: one closure per measured call, the loop itself identical -----------


def _loop_noarg(fn: Callable[[], object]) -> Loop:
    def run(n: int) -> int:
        t0 = _clock()
        for _ in range(n):
            fn()
        return _clock() - t0

    return run


def _loop_arg(fn: Callable[[int], object]) -> Loop:
    def run(n: int) -> int:
        t0 = _clock()
        for i in range(n):
            fn(i)
        return _clock() - t0

    return run


def _loop_with(session: Session) -> Loop:
    def run(n: int) -> int:
        step = session.step
        t0 = _clock()
        for i in range(n):
            with step(i):
                pass
        return _clock() - t0

    return run


def _empty() -> None:
    pass


def _empty_arg(i: int) -> None:
    pass


def measure(loop: Loop, calls: int, repeats: int) -> float:
    """Median ns per call over ``repeats`` runs of ``calls`` calls (GC off while timing)."""
    loop(min(calls, 10_000))  # warm-up
    per_call: list[float] = []
    gc.disable()
    try:
        for _ in range(repeats):
            per_call.append(loop(calls) / calls)
    finally:
        gc.enable()
    return statistics.median(per_call)


# ---- training-like loops: paired A/B next to a real opt.step() -----------------------


@dataclass
class Paired:
    a_ns: float  # median ns per iteration of loop A
    b_ns: float  # median ns per iteration of loop B
    diff_ns: float  # median of paired (B - A) differences
    q1_ns: float  # interquartile range of the differences
    q3_ns: float


def measure_paired(
    run_a: Callable[[int], float], run_b: Callable[[int], float], calls: int, pairs: int
) -> Paired:
    """``run_x(n)`` runs n iterations and returns ns per iteration (its own setup and
    teardown untimed). Short runs alternate A B B A ... so slow drift cancels."""
    run_a(1_000)
    run_b(1_000)
    a: list[float] = []
    b: list[float] = []
    gc.disable()
    try:
        for k in range(pairs):
            if k % 2 == 0:
                a.append(run_a(calls))
                b.append(run_b(calls))
            else:
                b.append(run_b(calls))
                a.append(run_a(calls))
    finally:
        gc.enable()
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    return Paired(statistics.median(a), statistics.median(b), statistics.median(diffs), q1, q3)


def _opt_loop(step: Callable[[], object], call: Callable[[int], object]) -> Callable[[int], float]:
    def run(n: int) -> float:
        t0 = _clock()
        for i in range(n):
            step()
            call(i)
        return (_clock() - t0) / n

    return run


# ---- per-iteration quantiles next to a real opt.step() (part 3) ----------------------

Chunk = Callable[[int, list[int]], None]  # runs n iterations, appends each one's ns


def _chunk(
    step: Callable[[], object],
    call: Callable[[int], object],
    hook: Callable[[object, object, object], None] | None = None,
) -> Chunk:
    def run(n: int, out: list[int]) -> None:
        handle = register_optimizer_step_post_hook(hook) if hook is not None else None
        clock = time.perf_counter_ns
        t = clock()
        for i in range(n):
            step()
            call(i)
            t2 = clock()
            out.append(t2 - t)
            t = t2
        if handle is not None:
            handle.remove()

    return run


QUANTILES = (0.10, 0.25, 0.50)


def measure_quantiles(
    chunks: dict[str, Chunk], rounds: int, per_chunk: int = 20
) -> dict[str, list[int]]:
    """Each variant's iterations, ``per_chunk`` at a time, variants in a random order
    each round (GC off while timing); returns every iteration's ns per variant."""
    times: dict[str, list[int]] = {name: [] for name in chunks}
    for run in chunks.values():
        run(1_000, [])  # warm-up
    order = list(chunks)
    rng = random.Random(0)
    gc.disable()
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                chunks[name](per_chunk, times[name])
    finally:
        gc.enable()
    return times


def quantiles(values: list[int]) -> list[int]:
    ordered = sorted(values)
    return [ordered[int(q * len(ordered))] for q in QUANTILES]


def _clock_call(i: int) -> None:
    time.monotonic_ns()


def _store_call() -> Callable[[int], None]:
    ring = [0] * 8192
    clock = time.monotonic_ns

    def store(i: int) -> None:
        ring[i & 8191] = clock()

    return store


def _noop_hook(optimizer: object, args: object, kwargs: object) -> None:
    pass


def _optimizer() -> torch.optim.Optimizer:
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    return torch.optim.SGD([param], lr=0.0)


def _identity(rank: int) -> RankIdentity:
    return RankIdentity(
        run_id="bench",
        rank=rank,
        local_rank=rank,
        world_size=2,
        node_rank=0,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        gpu=None,
    )


def _hook_callable(session: Session) -> Callable[[object, object, object], None]:
    """The function ``install_optimizer_hook`` registered, as torch will call it."""
    session.install_optimizer_hook()
    return _global_optimizer_post_hooks[session._hook.id]  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200_000, help="tight loop: calls per repeat")
    p.add_argument("--repeats", type=int, default=21, help="tight loop: repeats (median)")
    p.add_argument("--opt-calls", type=int, default=2_000, help="A/B: iterations per run")
    p.add_argument("--pairs", type=int, default=100, help="A/B: pairs of runs (median)")
    p.add_argument("--rounds", type=int, default=1_500, help="per-iteration: rounds")
    p.add_argument("--wall", action="store_true", help="time with the wall clock, not CPU time")
    p.add_argument("--smoke", action="store_true", help="tiny loops (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.calls, args.repeats, args.opt_calls, args.pairs = 2_000, 3, 50, 3
        args.rounds = 10
    global _clock
    if args.wall:
        _clock = time.perf_counter_ns
    n, r = args.calls, args.repeats

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPU(s), {platform.processor() or platform.machine()}"
    )
    clock = "wall clock (perf_counter_ns)" if args.wall else "the thread's CPU time"
    print(f"tight loops: median of {r} repeats x {n:,} calls; GC off while timing; {clock}\n")

    rows: list[tuple[str, float, float]] = []  # name, ns, floor ns
    floor0 = measure(_loop_noarg(_empty), n, r)
    floor1 = measure(_loop_arg(_empty_arg), n, r)
    rows.append(("empty function call f()   [floor]", floor0, floor0))
    rows.append(("empty function call f(i)  [floor]", floor1, floor1))
    tracker = ProgressTracker(mode="cpu")
    rows.append(
        ("ProgressTracker(cpu).step_end()", measure(_loop_noarg(tracker.step_end), n, r), floor0)
    )
    tracker = ProgressTracker(mode="cpu")
    rows.append(
        ("ProgressTracker(cpu).step_end(i)", measure(_loop_arg(tracker.step_end), n, r), floor1)
    )

    opt = _optimizer()
    with tempfile.TemporaryDirectory(prefix="rankguard-bench-") as tmp:
        session = Session(_identity(0), Path(tmp), HeartbeatConfig(publish_interval_s=5.0))
        # A loop's first step_end takes progress over from the optimizer hook; from then
        # on `session.step_end` (looked up as a loop does each step) is the tracker's.
        session.step_end(0)
        try:
            session_ns = measure(_loop_arg(session.step_end), n, r)
            rows.append(("Session.step_end(i)  (publish every 5 s)", session_ns, floor1))
            rows.append(("with session.step(i): pass", measure(_loop_with(session), n, r), floor1))
            null = NullSession()
            rows.append(
                ("NullSession.step_end(i)", measure(_loop_arg(null.step_end), n, r), floor1)
            )
            # A script that called step_end itself reports its own steps (the hook is
            # then never installed), so the hook is measured on a fresh session.
            hook_session = Session(
                _identity(0), Path(tmp) / "hook", HeartbeatConfig(publish_interval_s=5.0)
            )
            hook = _hook_callable(hook_session)
            hook_ns = measure(_loop_noarg(lambda: hook(opt, (), {})), n, r)
            hook_session.close()
            rows.append(("optimizer hook callable (as torch calls it)", hook_ns, floor0))

            # ---- part 2: next to a real opt.step() ----
            step = opt.step
            control = measure_paired(
                _opt_loop(step, _empty_arg),
                _opt_loop(step, _empty_arg),
                args.opt_calls,
                args.pairs,
            )
            in_loop = measure_paired(
                _opt_loop(step, _empty_arg),
                _opt_loop(step, session.step_end),
                args.opt_calls,
                args.pairs,
            )
            plain = _opt_loop(step, _empty_arg)
            counted = [0]

            hooked_session = Session(
                _identity(0), Path(tmp) / "hooked", HeartbeatConfig(publish_interval_s=5.0)
            )

            def with_hook(k: int) -> float:
                hooked_session.install_optimizer_hook()
                before = hooked_session.tracker.progress_seq
                ns = plain(k)
                counted[0] += hooked_session.tracker.progress_seq - before
                handle, hooked_session._hook = hooked_session._hook, None
                handle.remove()  # the hook is global: remove it for the plain runs
                return ns

            hooked = measure_paired(plain, with_hook, args.opt_calls, args.pairs)
            hooked_session.close()

            # ---- part 3: per-iteration quantiles next to opt.step() ----
            q_session = Session(
                _identity(0), Path(tmp) / "quantiles", HeartbeatConfig(publish_interval_s=5.0)
            )
            q_hook = _hook_callable(q_session)
            q_session._hook.remove()  # registered again around each chunk
            per_it = measure_quantiles(
                {
                    "opt.step(); f(i)": _chunk(step, _empty_arg),
                    "floor: opt.step(); clock read": _chunk(step, _clock_call),
                    "floor: opt.step(); clock into a list slot": _chunk(step, _store_call()),
                    "floor: opt.step() with a no-op hook": _chunk(step, _empty_arg, _noop_hook),
                    "opt.step(); session.step_end(i)": _chunk(step, session.step_end),
                    "opt.step() with the optimizer hook": _chunk(step, _empty_arg, q_hook),
                },
                args.rounds,
            )
            q_session._hook = None
            q_session.close()
        finally:
            session.close()

        busy = Session(_identity(1), Path(tmp), HeartbeatConfig(publish_interval_s=0.01))
        busy.step_end(0)  # the loop's first step (see above)
        try:
            written0 = busy.publisher.records_written
            t0 = time.perf_counter()
            busy_ns = measure(_loop_arg(busy.step_end), n, r)
            elapsed = time.perf_counter() - t0
            written = busy.publisher.records_written - written0
            idle0 = busy.publisher.records_written
            time.sleep(1.0)  # the same thread with the training thread idle
            idle_rate = float(busy.publisher.records_written - idle0)
        finally:
            busy.close()
        rows.append(("Session.step_end(i)  (publish every 0.01 s)", busy_ns, floor1))

    width = max(len(name) for name, _, _ in rows)
    print(f"{'call':<{width}}  {'ns/call':>9}  {'x floor':>8}  {'minus floor':>11}")
    print("-" * (width + 33))
    for name, ns, floor in rows:
        print(f"{name:<{width}}  {ns:9.1f}  {ns / floor:8.2f}  {ns - floor:11.1f}")
    print()
    rate = written / elapsed if elapsed > 0 else 0.0
    print(
        f"contention check: step_end {busy_ns:.1f} ns with the heartbeat thread publishing "
        f"vs {session_ns:.1f} ns with it idle ({busy_ns / session_ns:.2f}x); the thread wrote "
        f"{written} records in {elapsed:.1f} s ({rate:.0f}/s; asked 100/s, "
        f"{idle_rate:.0f}/s while the training thread sleeps; each record is fsync'd)"
    )
    print()

    print(
        f"in a training-like loop: each iteration runs opt.step() (SGD, 1 param) then the "
        f"call; {args.pairs} ABBA pairs x {args.opt_calls:,} iterations; "
        f"B - A = median paired difference [interquartile range]"
    )
    rows2 = [
        ("control: A = B = opt.step(); f(i)", control),
        ("A opt.step(); f(i)  B opt.step(); session.step_end(i)", in_loop),
        ("A opt.step()  B opt.step() with optimizer hook", hooked),
    ]
    width2 = max(len(name) for name, _ in rows2)
    print(f"{'pair':<{width2}}  {'A ns/it':>9}  {'B ns/it':>9}  {'B - A ns':>9}  IQR of B - A")
    print("-" * (width2 + 50))
    for name, pr in rows2:
        print(
            f"{name:<{width2}}  {pr.a_ns:9.0f}  {pr.b_ns:9.0f}  {pr.diff_ns:9.0f}  "
            f"[{pr.q1_ns:.0f}, {pr.q3_ns:.0f}]"
        )
    expected = args.pairs * args.opt_calls + 1_000
    print(f"(the hook counted {counted[0]:,} progress steps for {expected:,} hooked opt.step())")
    in_loop_cost = in_loop.diff_ns + floor1  # B - A removes an empty call too
    print()

    base_name = "opt.step(); f(i)"
    base = quantiles(per_it[base_name])
    n_its = len(per_it[base_name])
    print(
        f"per iteration: each of {n_its:,} iterations per variant timed alone (perf_counter_ns), "
        f"{args.rounds} rounds of 20 per variant in random order; quantiles of each variant "
        f"minus those of {base_name!r} ({'/'.join(str(b) for b in base)} ns)"
    )
    width3 = max(len(name) for name in per_it)
    print(f"{'variant':<{width3}}  {'p10':>7}  {'p25':>7}  {'p50':>7}")
    print("-" * (width3 + 27))
    extra: dict[str, list[int]] = {}
    for name, values in per_it.items():
        if name == base_name:
            continue
        extra[name] = [q - b for q, b in zip(quantiles(values), base, strict=True)]
        print(f"{name:<{width3}}  " + "  ".join(f"{d:+7d}" for d in extra[name]))
    print()

    worst = max(session_ns, busy_ns)
    verdict = "MEETS" if worst < GOAL_NS else "MISSES"
    print(
        f"goal: Session.step_end < {GOAL_NS:.0f} ns (tight loop) -> {verdict}: worst "
        f"{worst:.0f} ns = {worst / NVRX_SEND_HEARTBEAT_NS * 100:.1f}% of NVRx "
        f"send_heartbeat's ~14 us"
    )
    verdict = "MEETS" if in_loop_cost < GOAL_NS else "MISSES"
    print(
        f"goal: Session.step_end < {GOAL_NS:.0f} ns (next to opt.step) -> {verdict}: "
        f"~{in_loop_cost:.0f} ns (B - A + one empty call), control {control.diff_ns:+.0f} ns"
    )
    verdict = "MEETS" if hooked.diff_ns < GOAL_NS else "MISSES"
    print(
        f"goal: optimizer hook < {GOAL_NS:.0f} ns per step -> {verdict}: +{hooked.diff_ns:.0f} ns "
        f"per opt.step() ({hooked.diff_ns / hooked.a_ns * 100:.1f}% of a 1-param SGD step; "
        f"the callable alone: {hook_ns:.0f} ns in a tight loop)"
    )
    step_q = extra["opt.step(); session.step_end(i)"][1]
    hook_q = extra["opt.step() with the optimizer hook"][1]
    print(
        f"per iteration (p25): session.step_end +{step_q} ns -> "
        f"{'MEETS' if step_q < GOAL_NS else 'MISSES'}; optimizer hook +{hook_q} ns -> "
        f"{'MEETS' if hook_q < GOAL_NS else 'MISSES'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
