"""GPU checks: what only a real GPU can show, in one short script (about a minute).

What, on CUDA device 0 (prints "no CUDA device" and exits 0 without one):

1. The hot path never synchronises. A GPT-like model (bf16 autocast, fused AdamW) trains
   ``--steps`` steps under ``torch.cuda.set_sync_debug_mode("error")``, first bare
   (baseline: torch itself must not sync in this loop) and then with rankguard's per-step
   calls: ``ComputeProbe`` (CUDA timing events around ``with probe:``, straggler
   detection) wrapping ``ProgressTracker.step_end`` (progress), while a helper thread
   plays the heartbeat thread (``tracker.poll()``, ``probe.heartbeat_fields()``) and the
   performance reporter's own thread reads its CUDA timing events. Any synchronising call
   raises inside the loop; the script says which part raised.
2. Progress from CUDA events: after the loop the tracker's ``progress_seq`` must reach
   the step count (events completed, counted by ``query()``), and its ``mode`` is
   ``cuda``.
3. Real TFLOP/s and MFU: FLOPs of one step counted with ``FlopCounterMode``; the
   reporter's TFLOP/s per GPU and MFU (peak from the device table) against the same
   figure from wall-clock time with ``torch.cuda.synchronize()`` around the timed steps.
   Also the reporter's device step time (CUDA events) against that wall-clock time, and
   the probe's compute time against the step time.
4. NVML: one health snapshot through ``collect_gpu_health`` (NVML, nvidia-smi fallback).
5. End to end: ``rankguard run --nproc-per-node 1 -m rankguard.demo.train`` on the GPU
   (NCCL), which must complete with state ``completed`` and no finding, its heartbeats
   showing progress.

Run: ``python bench/gpu_check.py [--steps 60] [--skip-e2e]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _model(args: argparse.Namespace, device: Any) -> tuple[Any, Any, Any, Any]:
    import torch

    from rankguard.demo.model import GPTConfig, TinyGPT, synthetic_batch

    cfg = GPTConfig(
        vocab_size=32768,
        seq_len=args.seq_len,
        d_model=args.d_model,
        n_heads=args.d_model // 128,
        n_layers=args.layers,
    )
    model = TinyGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = synthetic_batch(cfg, args.batch_size, torch.Generator().manual_seed(0), device)
    return model, opt, x, y


def _train_step(model: Any, opt: Any, x: Any, y: Any, probe: Any = None) -> None:
    import torch

    if probe is not None:
        probe.__enter__()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(x, y)
    loss.backward()
    if probe is not None:
        probe.__exit__(None, None, None)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _sync_loop(
    args: argparse.Namespace, model: Any, opt: Any, x: Any, y: Any, calls: Any = None
) -> tuple[float, str | None]:
    """Steps under sync-debug "error"; wall seconds (synchronised) and the error, if any."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    error = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(args.steps):
            if calls is None:
                _train_step(model, opt, x, y)
            else:
                probe, step_end = calls
                _train_step(model, opt, x, y, probe)
                step_end(i)
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, error


def part_hot_path(args: argparse.Namespace) -> bool:
    import torch

    from rankguard.perf.config import PerfConfig
    from rankguard.perf.flops import mfu, tflops_per_gpu
    from rankguard.perf.measured import measured_flops_per_step
    from rankguard.perf.reporter import PerfReporter
    from rankguard.straggler.probe import ComputeProbe
    from rankguard.timeline import ProgressTracker

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(0)
    print(f"== 1-3: hot path, progress, TFLOP/s on {name} ==")
    model, opt, x, y = _model(args, device)
    for _ in range(5):  # warm-up: kernels, allocator, fused optimizer state
        _train_step(model, opt, x, y)
    torch.cuda.synchronize()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        flops = measured_flops_per_step(model, (x,), loss_fn=lambda out: _ce(out, y))
    print(f"FLOPs per step (FlopCounterMode, bf16 autocast): {flops:.4g}")

    base_s, base_err = _sync_loop(args, model, opt, x, y)
    if base_err is not None:
        print(f"baseline with fused AdamW synchronised ({base_err}); trying SGD")
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)
        base_s, base_err = _sync_loop(args, model, opt, x, y)
    if base_err is not None:
        print(f"baseline loop (no rankguard) synchronised by itself: {base_err}")
        print("RESULT: cannot judge rankguard's hot path with this loop")
        return False
    print(f"baseline: {args.steps} steps, no sync, {base_s / args.steps * 1e3:.2f} ms/step")

    tracker = ProgressTracker()
    probe = ComputeProbe(tracker.step_end, cuda=True)
    reporter = PerfReporter(
        PerfConfig(log_interval=10, warmup_iterations=5),
        tracker,
        rank=0,
        world_size=1,
        run_id="gpu-check",
        out_dir=None,
        device_name=name,
        cuda_device=0,
        console=io.StringIO(),
    )
    reporter.set_flops(flops, "measured: FlopCounterMode")
    reporter.set_batch(samples=args.batch_size, tokens=args.batch_size * args.seq_len)
    stop = threading.Event()
    compute_ms: list[float] = []

    def heartbeat() -> None:  # what the heartbeat thread does every publish interval
        while not stop.is_set():
            tracker.poll()
            fields = probe.heartbeat_fields()
            if fields is not None:
                compute_ms.append(fields["straggler"]["compute_ms"])
            stop.wait(0.01)

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    reporter.start()
    rg_s, rg_err = _sync_loop(args, model, opt, x, y, calls=(probe, probe.step_end))
    time.sleep(0.5)  # the helper thread and the reporter read the completed events
    stop.set()
    thread.join()
    tracker.poll()
    tracker.poll()
    reporter.poll()
    reporter.close()
    ok = True
    if rg_err is not None:
        print(f"FAIL: a rankguard call synchronised under sync-debug 'error': {rg_err}")
        ok = False
    else:
        per_step = (rg_s - base_s) / args.steps * 1e6
        print(
            f"rankguard: {args.steps} steps, no sync, {rg_s / args.steps * 1e3:.2f} ms/step "
            f"({per_step:+.1f} us/step vs baseline, noise included)"
        )
    print(f"progress: mode {tracker.mode}, progress_seq {tracker.progress_seq} of {args.steps}")
    ok &= tracker.mode == "cuda" and tracker.progress_seq == args.steps
    wall_step_s = rg_s / args.steps
    wall_tflops = tflops_per_gpu(flops, wall_step_s, 1)
    last = reporter.latest or {}
    print(
        f"TFLOP/s per GPU: reporter {last.get('TFLOPS_per_GPU')} (device step "
        f"{last.get('gpu_step_time_ms')} ms, issue step {last.get('step_time_ms')} ms); "
        f"wall clock {wall_tflops:.1f} ({wall_step_s * 1e3:.2f} ms/step)"
    )
    print(
        f"MFU: reporter {last.get('MFU')}; wall clock "
        f"{mfu(wall_tflops, reporter.peak_tflops)} (peak {reporter.peak_tflops} TFLOP/s, "
        f"{reporter.peak_source})"
    )
    if compute_ms:
        print(
            f"straggler probe (CUDA events around forward+backward): median "
            f"{statistics.median(compute_ms):.2f} ms of a {wall_step_s * 1e3:.2f} ms step "
            f"({len(compute_ms)} heartbeat reads)"
        )
    else:
        print("FAIL: the straggler probe produced no sample")
        ok = False
    print(f"RESULT hot path / progress / probe: {'PASS' if ok else 'FAIL'}\n")
    return ok


def _ce(logits: Any, y: Any) -> Any:
    from torch.nn import functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def part_nvml() -> bool:
    from rankguard.health.collector import collect_gpu_health

    print("== 4: GPU health (NVML first) ==")
    snap = collect_gpu_health(command_timeout_s=10)
    print(json.dumps(snap, indent=1)[:3000])
    ok = snap.get("source") == "nvml" and bool(snap.get("gpus"))
    print(f"RESULT NVML: {'PASS' if ok else 'FAIL'} (source {snap.get('source')})\n")
    return ok


def part_e2e() -> bool:
    print("== 5: rankguard run, 1 rank on the GPU (NCCL) ==")
    with tempfile.TemporaryDirectory(prefix="rankguard-gpu-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "rankguard.cli.main",
            "run",
            "--nproc-per-node",
            "1",
            "--log-dir",
            tmp,
            "--set",
            "heartbeat.enabled=true",
            "--set",
            "heartbeat.publish_interval_s=0.5",
            "-m",
            "rankguard.demo.train",
            "--steps",
            "30",
            "--step-sleep",
            "0.02",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        print(res.stdout[-2500:], res.stderr[-1500:], sep="\n")
        status_files = list(Path(tmp).glob("heartbeat/*/status.json"))
        status = json.loads(status_files[0].read_text()) if status_files else {}
        findings = list(Path(tmp).glob("heartbeat/*/findings.jsonl"))
        n_findings = sum(len(f.read_text().splitlines()) for f in findings)
        beats = [
            json.loads(line)
            for f in Path(tmp).glob("heartbeat/*/rank_0_pid_*.heartbeat.jsonl")
            for line in f.read_text().splitlines()
        ]
        seq = max((b.get("progress_seq") or 0 for b in beats), default=0)
    ok = res.returncode == 0 and status.get("state") == "completed" and n_findings == 0
    print(
        f"RESULT e2e: {'PASS' if ok else 'FAIL'} (rc {res.returncode}, state "
        f"{status.get('state')}, findings {n_findings}, last progress_seq {seq})\n"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--skip-e2e", action="store_true")
    args = p.parse_args(argv)
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, pid {os.getpid()}")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (run this where a GPU is lent)")
        return 0
    results = {"hot path": part_hot_path(args), "nvml": part_nvml()}
    if not args.skip_e2e:
        results["e2e"] = part_e2e()
    print("SUMMARY: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
