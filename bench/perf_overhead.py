"""Performance-monitor cost and FLOP-count accuracy.

1. Hot path: ns per ``Session.step_end`` with the performance reporter attached and
   polling (its thread reads the step ring buffer 5 times a second), beside the same
   call with perf disabled and an empty function call (the floor); the difference is
   the perf monitor's hot-path share, given as a percentage of the demo's step time.
2. Background cost: CPU seconds the reporter thread uses per wall second while the loop
   runs at 20k steps/s (it is off the hot path but shares the machine).
3. Accuracy: FLOPs per step of the demo model from Megatron's formula (the demo's
   ``--flops analytic``) against ``FlopCounterMode`` (``--flops measured``), for the
   causal formula Megatron uses and the non-causal one FlopCounterMode counts.

Run: ``python bench/perf_overhead.py``
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rankguard.demo.model import GPTConfig, TinyGPT, synthetic_batch
from rankguard.demo.train import demo_shape
from rankguard.monitor.config import HeartbeatConfig
from rankguard.perf.config import PerfConfig
from rankguard.perf.flops import analytic_flops_per_step
from rankguard.perf.measured import measured_flops_per_step
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.identity import RankIdentity
from rankguard.rank.timeline import ProgressTracker
from rankguard.session import Session

REPEATS = 21
CALLS = 200_000
BACKGROUND_S = 3.0
DEMO_STEP_MS = 70.0  # the demo's CPU step time (bench/README.md, rankguard demo)


def _ns_per_call(fn: object, calls: int | None = None) -> float:
    f = fn  # local for speed
    calls = CALLS if calls is None else calls
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter_ns()
        for i in range(calls):
            f(i)  # type: ignore[operator]
        samples.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(samples)


def _identity() -> RankIdentity:
    return RankIdentity(
        run_id="bench",
        rank=0,
        local_rank=0,
        world_size=1,
        node_rank=0,
        hostname="bench",
        pid=0,
        gpu=None,
    )


def hot_path() -> None:
    def empty(i: int) -> None:
        pass

    with tempfile.TemporaryDirectory() as tmp:
        hb = HeartbeatConfig(enabled=True, publish_interval_s=1.0)
        plain = Session(_identity(), Path(tmp), hb, publish=False)
        tracker = ProgressTracker()
        reporter = PerfReporter(
            PerfConfig(),
            tracker,
            rank=0,
            world_size=1,
            run_id="bench",
            out_dir=Path(tmp) / "perf",
            console=io.StringIO(),
        )
        reporter.set_batch(samples=8, tokens=8 * 64)
        with_perf = Session(
            _identity(), Path(tmp), hb, tracker=tracker, publish=False, perf=reporter
        )
        floor = _ns_per_call(empty)
        off = _ns_per_call(plain.step_end)
        on = _ns_per_call(with_perf.step_end)
        plain.close()
        with_perf.close()
    delta = on - off
    print(f"== hot path: Session.step_end (median of {REPEATS} x {CALLS:,} calls) ==")
    print(f"  empty function call (floor)        {floor:8.1f} ns")
    print(f"  step_end, perf disabled            {off:8.1f} ns")
    print(f"  step_end, perf reporter polling    {on:8.1f} ns")
    print(f"  perf monitor's share               {delta:8.1f} ns per step")
    print(
        f"  whole step_end vs demo step ({DEMO_STEP_MS:.0f} ms): "
        f"{100 * on / (DEMO_STEP_MS * 1e6):.5f} %  (goal < 0.1 %)"
    )


def background() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tracker = ProgressTracker(mode="cpu")
        reporter = PerfReporter(
            PerfConfig(log_interval=10),
            tracker,
            rank=0,
            world_size=1,
            run_id="bench",
            out_dir=Path(tmp) / "perf",
            console=io.StringIO(),
        )
        reporter.start()
        calls = 0
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        while time.perf_counter() - t0 < BACKGROUND_S:
            for i in range(1000):
                tracker.step_end(i)
            calls += 1000
            time.sleep(0.05)  # ~20k steps/s with the loop idle otherwise
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        reporter.close()
        polls_cpu = []
        for _ in range(50):
            for i in range(1000):
                tracker.step_end(i)
            c0 = time.thread_time()
            reporter.poll()
            polls_cpu.append(time.thread_time() - c0)
    print("== background: reporter thread ==")
    print(f"  {calls} steps in {wall:.1f} s; process CPU {cpu:.2f} s (loop + reporter)")
    print(
        f"  one poll over 1000 new steps (100 log entries): "
        f"{1e3 * statistics.median(polls_cpu):.2f} ms CPU"
    )


def accuracy() -> None:
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    batch = 8
    x, y = synthetic_batch(cfg, batch, torch.Generator().manual_seed(0), torch.device("cpu"))

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))

    measured = measured_flops_per_step(model, (x,), loss_fn=loss)
    shape = demo_shape(cfg)
    causal = analytic_flops_per_step(shape, batch)
    from dataclasses import replace

    full = analytic_flops_per_step(replace(shape, causal=False), batch)
    print("== FLOPs per step, demo model (2 layers, h=64, s=64, V=256, batch 8) ==")
    print(f"  FlopCounterMode (measured)             {measured:14,.0f}")
    print(
        f"  Megatron formula, causal (the demo's)  {causal:14,.0f}  ratio {causal / measured:.4f}"
    )
    print(f"  formula, full attention (as counted)   {full:14,.0f}  ratio {full / measured:.4f}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny loops (seconds)")
    if ap.parse_args().smoke:
        REPEATS, CALLS, BACKGROUND_S = 3, 2_000, 0.3
    hot_path()
    background()
    accuracy()
