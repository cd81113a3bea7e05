"""Trackers on vs off: the demo model's step time on the training thread.

The demo's model (``rankguard.demo``: TinyGPT, batch 8 x 64 tokens, AdamW) steps on the
main thread. Two real :class:`PerfReporter` run side by side, each with its thread and
one window a step (``perf.log_interval=1``, ten times the windows the default gives):
one with no tracker, one with TensorBoard, W&B (offline) and MLflow (a local file
store). The loop alternates blocks of steps between them (off, on, off, on, ...), so
a loaded machine's drift falls on both alike; the figure is the median step time of
each side and the difference, against the spread of the off blocks. Trackers write
from their own thread: the goal is a difference inside that spread.

Run: ``python bench/trackers.py`` (``--smoke``: 4 short blocks, TensorBoard only).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rankguard.demo.model import GPTConfig, TinyGPT, synthetic_batch
from rankguard.perf.config import MlflowConfig, PerfConfig, TensorBoardConfig, WandbConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.timeline import ProgressTracker


def _reporter(trackers: list[str], tmp: Path) -> tuple[PerfReporter, ProgressTracker]:
    cfg = PerfConfig(
        log_interval=1,
        console=False,
        trackers=trackers,
        tensorboard=TensorBoardConfig(log_dir=str(tmp / "tb")),
        wandb=WandbConfig(mode="offline", dir=str(tmp), project="rankguard-bench"),
        mlflow=MlflowConfig(tracking_uri=(tmp / "mlruns").as_uri(), experiment="bench"),
    )
    tracker = ProgressTracker(mode="cpu")
    out = tmp / ("perf_on" if trackers else "perf_off")
    rep = PerfReporter(
        cfg, tracker, rank=0, world_size=1, run_id="bench", out_dir=out, console=io.StringIO()
    )
    rep.set_batch(samples=8, tokens=8 * 64)
    rep.start()
    return rep, tracker


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--blocks", type=int, default=20, help="blocks per side")
    ap.add_argument("--steps", type=int, default=15, help="steps per block")
    ap.add_argument("--smoke", action="store_true", help="4 blocks of 5 steps, TensorBoard")
    args = ap.parse_args()
    blocks, steps = (2, 5) if args.smoke else (args.blocks, args.steps)
    trackers = ["tensorboard"] if args.smoke else ["tensorboard", "wandb", "mlflow"]
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gcfg = GPTConfig()
    model = TinyGPT(gcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    seq = {"off": 0, "on": 0}

    def step(side: str, tracker: ProgressTracker) -> float:
        t0 = time.perf_counter()
        x, y = synthetic_batch(gcfg, 8, gen, torch.device("cpu"))
        model.loss(x, y).backward()
        opt.step()
        opt.zero_grad()
        seq[side] += 1
        tracker.step_end(seq[side])
        return (time.perf_counter() - t0) * 1e3

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        off, off_tracker = _reporter([], tmp)
        on, on_tracker = _reporter(trackers, tmp)
        for _ in range(5):  # warm-up; the first window opens the trackers
            step("off", off_tracker)
            step("on", on_tracker)
        t0 = time.monotonic()
        queue = on._sink_thread._queue
        while time.monotonic() - t0 < 120 and (not queue.empty() or not on._sinks_open):
            time.sleep(0.2)  # wandb.init takes seconds: off the clock
        time.sleep(1.0)
        print(f"  trackers opened in {time.monotonic() - t0:.1f} s (their own thread)")
        times: dict[str, list[float]] = {"off": [], "on": []}
        block_medians: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(blocks):
            for side, tracker in (("off", off_tracker), ("on", on_tracker)):
                block = [step(side, tracker) for _ in range(steps)]
                times[side] += block
                block_medians[side].append(statistics.median(block))
        t1 = time.monotonic()
        on.close()
        off.close()
        windows = len(on.entries)
        print(
            f"  close: {time.monotonic() - t1:.1f} s; tracker errors {on.sinks.errors}, "
            f"dropped {on._sink_thread.dropped}, windows sent {windows}"
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    q = statistics.quantiles(block_medians["off"], n=4) if blocks >= 2 else [0.0, 0.0, 0.0]
    spread = q[2] - q[0]
    delta = med["on"] - med["off"]
    print(
        f"== trackers on vs off: demo step on the training thread ({blocks} x {steps} steps "
        "a side, alternating blocks, one window a step) =="
    )
    print(f"  off                          median {med['off']:7.2f} ms")
    print(f"  on ({'+'.join(trackers)})  median {med['on']:7.2f} ms")
    print(
        f"  on - off {delta:+.2f} ms ({100 * delta / med['off']:+.1f} %); "
        f"off blocks' interquartile spread {spread:.2f} ms"
    )
    verdict = "inside the noise" if abs(delta) <= max(spread, 0.02 * med["off"]) else "MEASURABLE"
    print(f"  verdict: {verdict} (goal: nothing measurable on the training thread)")


if __name__ == "__main__":
    main()
