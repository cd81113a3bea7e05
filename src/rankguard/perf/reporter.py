"""The in-rank performance monitor: turns the step timeline into metrics.

The hot path writes nothing new: :class:`~rankguard.rank.timeline.ProgressTracker`
already stamps every step end into a ring buffer. A daemon thread here reads the ring a
few times a second and, at iteration 1 and every ``log_interval`` steps, computes the
window's step time, samples/s, tokens/s, TFLOP/s per GPU and in total, MFU, memory and
the data-loading share. Rank 0 appends each entry to ``perf.jsonl`` and prints one
line; it rewrites ``perf_summary_<timestamp>.json`` as the run goes (a killed job keeps
one; one file per run, which a restarted attempt takes over) and at the end, with
FlagScale's perf monitor schema.
Every rank exposes its latest window (:attr:`PerfReporter.latest`) to its heartbeat
records, from which node 0's monitor derives cross-rank min/median/max step times
without any collective.

Step times are intervals between consecutive step ends. On GPU they are the times the
training thread issued the steps, which in steady state run at the device's pace (the
caching allocator and any ``.item()`` bound the queue); in addition, the thread records
a timing CUDA event on the training stream at each poll and reads it once completed,
giving ``gpu_step_time_ms``, the device's own time per step over the last interval,
with no synchronisation. TFLOP/s use the GPU figure when there is one.

Evaluation and checkpoint saves are not steps: a step interval that contained a phase
other than train (a span the API or the stack sampling of
:class:`~rankguard.rank.phases.PhaseWatcher` left in the tracker; this thread samples at each
poll, so any phase longer than the poll interval is seen) is left out of the step times,
the window's rates and the summary; an explicit checkpoint's progress is no step at all.

Warm-up: final statistics leave out the first ``warmup_iterations`` steps (compilation,
allocator growth, data-loader start); a run shorter than twice that uses its second
half, as FlagScale does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import statistics
import sys
import threading
import time
from array import array
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from rankguard.perf.config import PerfConfig
from rankguard.perf.flagscale import link_flagscale_summary
from rankguard.perf.flops import analytic_flops_per_step, mfu, tflops_per_gpu
from rankguard.perf.memory import memory_gb
from rankguard.perf.peaks import resolve_peak_tflops
from rankguard.perf.sinks import PerfSink, RunInfo, SinkSet, SinkThread
from rankguard.perf.trackers import build_trackers
from rankguard.perf.trackers.events import RunEventTail
from rankguard.rank.phases import PhaseWatcher
from rankguard.rank.timeline import RING_SIZE, ProgressTracker
from rankguard.schema.coerce import as_int, as_number
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import PERF_JOB_FILE, PERF_LOG_FILE, PERF_SUMMARY_PREFIX
from rankguard.util.fs import QueuedJsonl, atomic_write_json

__all__ = ["SUMMARY_PREFIX", "PerfReporter", "final_statistics", "prune_runs", "run_job"]

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = PERF_SUMMARY_PREFIX
PERF_LOG = PERF_LOG_FILE
_MASK = RING_SIZE - 1


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


def _round(x: float | None, digits: int = 6) -> float | None:
    """``digits`` significant digits (a CPU's 0.0055 TFLOP/s keeps its precision)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def final_statistics(
    step_ms: list[float] | array, warmup: int
) -> tuple[list[float], dict[str, float | None]]:
    """The steps kept after warm-up and their mean/median/min/max (ms)."""
    steps = list(step_ms)
    kept = steps[warmup:] if len(steps) >= 2 * warmup and warmup else steps[len(steps) // 2 :]
    if not warmup:
        kept = steps
    if not kept:
        return [], {"avg": None, "median": None, "min": None, "max": None}
    return kept, {
        "avg": statistics.fmean(kept),
        "median": statistics.median(kept),
        "min": min(kept),
        "max": max(kept),
    }


class _GpuTimer:
    """Device time per step between two timing events recorded on the training stream."""

    def __init__(self, tracker: ProgressTracker, event_factory: Any = None) -> None:
        self.tracker = tracker
        self.event_factory = event_factory
        self.pending: tuple[Any, int] | None = None
        self.previous: tuple[Any, int] | None = None
        self.ms_per_step: float | None = None
        self.total_ms = 0.0  # device time and steps over all intervals after warm-up
        self.total_steps = 0
        self.warmup = 0

    def _event(self) -> Any:
        if self.event_factory is not None:
            return self.event_factory()
        import torch  # here, not at the top: `import rankguard` (light commands) stays torch-free

        return torch.cuda.Event(enable_timing=True)

    def poll(self) -> None:
        if self.pending is not None:
            event, seq = self.pending
            if not event.query():
                return
            if self.previous is not None and seq > self.previous[1]:
                elapsed = self.previous[0].elapsed_time(event)
                self.ms_per_step = elapsed / (seq - self.previous[1])
                if self.previous[1] >= self.warmup:
                    self.total_ms += elapsed
                    self.total_steps += seq - self.previous[1]
            self.previous, self.pending = self.pending, None
        issued = self.tracker.issued_seq
        if self.previous is None or issued > self.previous[1]:
            event = self._event()
            stream = self.tracker.stream
            if stream is not None:
                event.record(stream)
            else:
                event.record()
            self.pending = (event, issued)


class PerfReporter:
    MAX_ENTRIES = 10_000  # log entries kept in memory for the summary's iteration_logs

    def __init__(
        self,
        cfg: PerfConfig,
        tracker: ProgressTracker,
        *,
        rank: int,
        world_size: int,
        run_id: str,
        out_dir: Path | None,
        device_name: str | None = None,
        cuda_device: int | None = None,
        console: TextIO | None = None,
        poll_interval_s: float = 0.2,
        gpu_event_factory: Any = None,
        job: str | None = None,
        phases: PhaseWatcher | None = None,
        sinks: Iterable[PerfSink] = (),
        run_dir: Path | None = None,
    ) -> None:
        """``phases``: sampled at each poll, so that evaluation and saving between two
        steps are left out of the step times (None: only the phases the script set).
        ``sinks``: where windows, run events and the summary also go, besides the
        trackers of ``cfg.trackers``; ``run_dir``: the run directory whose findings,
        restarts and checkpoints rank 0 forwards to them."""
        self.cfg = cfg
        self.phases = phases
        self.job = job  # the training job this run belongs to: retention keeps to it
        self._job_marked = False
        self.tracker = tracker
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.out_dir = out_dir if rank == 0 else None
        # perf.jsonl: lines a failed write (a full disk) left wait, in order, for the next
        # poll; none is lost to a transient write error
        self._log = QueuedJsonl(self.out_dir / PERF_LOG) if self.out_dir is not None else None
        self.device_name = device_name
        self.cuda_device = cuda_device
        self.console = console if console is not None else sys.stdout
        self.poll_interval_s = poll_interval_s
        self.peak_tflops, self.peak_source = resolve_peak_tflops(
            override=cfg.peak_tflops, dtype=cfg.dtype, device_name=device_name
        )
        self.flops_per_step: float | None = cfg.flops_per_step
        self.flops_source = "config: perf.flops_per_step" if cfg.flops_per_step else "none"
        self.global_samples: float | None = None
        self.global_tokens: float | None = None
        self.batch_source: str | None = None  # who set the batch: user, an integration, detected
        self.model_dtype: str | None = None  # the parameters' dtype (set_model_dtype)
        self.model_dtype_source: str | None = None
        self.entries: list[JsonObject] = []
        self.latest: JsonObject | None = None
        self.step_ms = array("d")
        self._seen = 0
        self._last_log_seq = 0
        self._train_steps_offset = 0
        self.skipped_steps = 0
        self.excluded_steps = 0  # step intervals that contained eval or a save
        # The window since the last log line, kept as the steps go by (a log interval
        # may span more steps than the ring holds): the ring's values at the last logged
        # step, and the time and count of the saves and excluded intervals since.
        self._log_ns = 0
        self._log_data_ns = 0
        self._gap_ns = 0
        self._gap_n = 0
        self._first_ns: int | None = None
        self._start_wall = time.time()
        self._summary_path: Path | None = None  # one file a run, rewritten as it goes
        self._summary_at: float | None = None  # monotonic time of the last rewrite
        self._gpu = _GpuTimer(tracker, gpu_event_factory)
        self._gpu.warmup = cfg.warmup_iterations
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._tty = bool(getattr(self.console, "isatty", lambda: False)())
        self._header_done = False
        self._flops_why_said = False  # the console said why there is no TFLOP/s
        # trackers: fed after each poll, outside the window lock, through a thread of
        # their own (a slow tracker never delays this thread)
        self.sinks = SinkSet([*build_trackers(cfg, rank=rank, perf_dir=out_dir), *sinks])
        self._sink_thread = SinkThread(self.sinks)
        self._sink_lock = threading.Lock()
        self._sinks_open = False
        self._run_events = (
            RunEventTail(run_dir) if run_dir is not None and rank == 0 and self.sinks else None
        )

    # ---- inputs ----------------------------------------------------------------------

    def set_batch(
        self,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        data_parallel_size: int | None = None,
        source: str = "user: set_batch",
    ) -> None:
        """Per-replica batch of one optimizer step; global = x data-parallel size.
        ``source`` says where the figures came from (the summary's ``batch_source``)."""
        dp = self.world_size if data_parallel_size is None else data_parallel_size
        if dp < 1:
            raise ValueError(f"data_parallel_size: must be >= 1, got {dp}")
        self.batch_source = source
        self.global_samples = None if samples is None else float(samples) * dp
        self.global_tokens = None if tokens is None else float(tokens) * dp
        if self.cfg.model is not None and self.cfg.flops_per_step is None and samples:
            self.set_flops(
                analytic_flops_per_step(self.cfg.model, int(samples * dp)),
                f"analytic: {self.cfg.model.family} formula, global batch {int(samples * dp)}",
            )

    def set_flops(self, flops_per_step: float, source: str) -> None:
        """Training FLOPs of one optimizer step for the global batch."""
        if flops_per_step <= 0:
            raise ValueError(f"flops_per_step: must be > 0, got {flops_per_step}")
        self.flops_per_step = float(flops_per_step)
        self.flops_source = source

    def set_model_dtype(self, dtype: str, source: str) -> None:
        """The dtype the model is stored in, as seen on its parameters (the summary's
        ``dtype``; ``perf.dtype`` only picks the peak column)."""
        self.model_dtype = str(dtype)
        self.model_dtype_source = source

    # ---- thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankguard-perf", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.poll()
            except Exception:
                logger.exception("rankguard perf: poll failed")

    def poll(self) -> list[JsonObject]:
        with self._lock:
            new = self._poll()
        if self.sinks:
            self._to_sinks(new)
        return new

    def _to_sinks(self, new: list[JsonObject]) -> None:
        """New windows and run events to the sinks (each sink's failures contained)."""
        with self._sink_lock:
            events = []
            if self._run_events is not None:
                last = as_int(self.latest["iteration"]) if self.latest else None
                try:
                    events = self._run_events.poll(last)
                except Exception:
                    logger.exception("rankguard perf: reading the run's events failed")
            if not (new or events):
                return
            out = self._sink_thread
            if not self._sinks_open:
                self._sinks_open = True
                out.open(self._run_info())
            for entry in new:
                out.window(entry)
            for ev in events:
                out.event(ev.kind, ev.step, ev.fields)

    def _run_info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            rank=self.rank,
            world_size=self.world_size,
            out_dir=str(self.out_dir) if self.out_dir is not None else None,
            job=self.job,
            config={
                "device": self.device_name or "cpu",
                "dtype": self.cfg.dtype,
                "log_interval": self.cfg.log_interval,
                "flops_source": self.flops_source,
                "batch_source": self.batch_source,
            },
        )

    def heartbeat_fields(self) -> JsonObject | None:
        """What every heartbeat record carries: the latest window, for cross-rank stats."""
        e = self.latest
        if e is None:
            return None
        recent = self.entries[-16:]  # several windows per heartbeat when steps are fast
        return {
            "perf": {
                "step": e["step"],
                "iteration": e["iteration"],
                "step_time_ms": e["gpu_step_time_ms"] or e["step_time_ms"],
                "TFLOPS_per_GPU": e["TFLOPS_per_GPU"],
                "MFU": e["MFU"],  # Prometheus' rankguard_rank_mfu_ratio
                "memory_GB": e["memory_GB"],
                "windows": [
                    [w["step"], w["iteration"], w["gpu_step_time_ms"] or w["step_time_ms"]]
                    for w in recent
                ],
            }
        }

    def _resolve_device(self) -> None:
        """On GPU, name the device (for the peak table) once the script set it up."""
        if self.device_name is not None or self.cuda_device is None:
            return
        try:
            import torch  # here, not at the top: `import rankguard` stays torch-free

            if not torch.cuda.is_initialized():
                return
            self.device_name = torch.cuda.get_device_name(self.cuda_device)
        except Exception:
            self.device_name = "unknown cuda device"
        if self.cfg.peak_tflops is None:
            self.peak_tflops, self.peak_source = resolve_peak_tflops(
                override=None, dtype=self.cfg.dtype, device_name=self.device_name
            )

    @property
    def unwritten_lines(self) -> int:
        """perf.jsonl lines waiting for a write to succeed."""
        return self._log.unwritten if self._log is not None else 0

    def _poll(self) -> list[JsonObject]:
        tracker = self.tracker
        if self.phases is not None:
            try:
                self.phases.observe()
            except Exception:
                logger.exception("rankguard perf: recognising the phase failed")
        self._resolve_device()
        if self._log is not None and self._log.unwritten:
            self._mark_job()
            self._log.flush()
        if tracker.mode == "cuda":
            try:
                self._gpu.poll()
            except Exception:
                logger.exception("rankguard perf: GPU timing event failed")
        issued = tracker.issued_seq
        issued_iteration = tracker.issued_iteration
        if issued <= self._seen:
            return []
        if issued - self._seen >= RING_SIZE:  # fell behind the ring: skip the gap
            self.skipped_steps += issued - RING_SIZE + 1 - self._seen
            self._seen = issued - RING_SIZE + 1
            self._window_from(self._seen)
        ring, skip = tracker.step_ns, set(tracker.non_step_seqs)
        new: list[JsonObject] = []
        for seq in range(self._seen + 1, issued + 1):
            if seq in skip:  # a checkpoint save: neither a step nor a log boundary
                self._train_steps_offset += 1
                self._gap_ns += ring[seq & _MASK] - ring[(seq - 1) & _MASK]
                self._gap_n += 1
                continue
            prev_ns = ring[(seq - 1) & _MASK] if seq > 1 else self._first_start_ns()
            if seq > 1 and tracker.interval_in_other_phase(prev_ns, ring[seq & _MASK]):
                self.excluded_steps += 1  # eval or a save: not a step time
                self._gap_ns += ring[seq & _MASK] - prev_ns
                self._gap_n += 1
            elif prev_ns:
                self.step_ms.append((ring[seq & _MASK] - prev_ns) / 1e6)
            step = seq - self._train_steps_offset  # training steps, saves not counted
            if step == 1 or step % self.cfg.log_interval == 0:
                entry = self._entry(seq, step, issued, issued_iteration)
                if entry is not None:
                    new.append(entry)
        self._seen = issued
        if new:
            self.entries.extend(new)
            del self.entries[: -self.MAX_ENTRIES]  # perf.jsonl keeps them all
            self.latest = new[-1]
            if self._log is not None:
                self._mark_job()
                self._log.append(new)
                self._rewrite_summary()
                if self.cfg.console:
                    for entry in new:
                        self._print(entry)
        return new

    def _window_from(self, seq: int) -> None:
        """The next log line's window starts at step ``seq``: its ring values taken now,
        while the ring still holds them."""
        self._last_log_seq = seq
        self._log_ns = self.tracker.step_ns[seq & _MASK]
        self._log_data_ns = self.tracker.data_at[seq & _MASK]
        self._gap_ns = self._gap_n = 0

    def _first_start_ns(self) -> int:
        """When the first step began: when the loop entered its phase (or at start-up),
        as seen at the first poll after it (the phase may change again later)."""
        if self._first_ns is None:
            tracker = self.tracker
            first_end = tracker.step_ns[1]
            phase_ns = tracker.phase_ns
            self._first_ns = phase_ns if phase_ns <= first_end else tracker.started_ns
        return self._first_ns

    def _entry(
        self, seq: int, step: int, issued: int, issued_iteration: int | None
    ) -> JsonObject | None:
        tracker, ring = self.tracker, self.tracker.step_ns
        start = self._last_log_seq
        start_ns = self._log_ns if start > 0 else self._first_start_ns()
        n = seq - start
        if n <= 0:
            return None
        # checkpoint saves and evaluations left out of the step time
        window_ns = ring[seq & _MASK] - start_ns - self._gap_ns
        n -= self._gap_n
        start_data_ns = self._log_data_ns if start > 0 else 0
        self._window_from(seq)
        if n <= 0 or window_ns <= 0:
            return None
        step_s = window_ns / 1e9 / n
        gpu_ms = self._gpu.ms_per_step
        rate_s = gpu_ms / 1e3 if gpu_ms else step_s
        per_gpu = (
            tflops_per_gpu(self.flops_per_step, rate_s, self.world_size)
            if self.flops_per_step
            else None
        )
        now_gb, peak_gb, mem_kind = memory_gb(self.cuda_device)
        data_ns = tracker.data_at[seq & _MASK] - start_data_ns
        data_share = data_ns / window_ns if tracker.data_ns else None
        latest_iter = issued_iteration if issued_iteration is not None else issued
        # the script's steps issued after this one (a save's progress is not a step)
        later_saves = sum(1 for s in tracker.non_step_seqs if seq < s <= issued)
        iteration = latest_iter - (issued - seq - later_saves)
        return {
            "schema_version": 1,
            "run_id": self.run_id,
            "rank": self.rank,
            "iteration": iteration,
            "step": step,
            "timestamp": _iso(time.time()),
            "step_time_ms": _round(step_s * 1e3),
            "gpu_step_time_ms": _round(gpu_ms),
            "samples_per_sec": _round(self.global_samples / rate_s)
            if self.global_samples
            else None,
            "tokens_per_sec": _round(self.global_tokens / rate_s) if self.global_tokens else None,
            "TFLOPS_per_GPU": _round(per_gpu),
            "TFLOPS_total": _round(per_gpu * self.world_size) if per_gpu is not None else None,
            "MFU": _round(mfu(per_gpu, self.peak_tflops)) if per_gpu is not None else None,
            "memory_GB": _round(now_gb),
            "peak_memory_GB": _round(peak_gb),
            "memory_kind": mem_kind,
            "data_loading_share": _round(data_share),
            "steps_in_window": n,
            # the first window of a loop that set no phase runs from the process start:
            # imports, model, data loader and process group are in it (warm-up)
            **({"includes_startup": True} if start == 0 and self._from_startup() else {}),
        }

    def _from_startup(self) -> bool:
        """Did the first step's interval start at the process start (no phase entered
        before it), not at a known start of the loop?"""
        return self._first_start_ns() == self.tracker.started_ns

    _COLUMNS = (
        ("iteration", "ITER", "d", 8),
        ("step_time_ms", "STEP ms", ".1f", 9),
        ("tokens_per_sec", "TOK/s", ",.0f", 11),
        ("samples_per_sec", "SAMPLES/s", ",.1f", 10),
        ("TFLOPS_per_GPU", "TFLOP/s/GPU", ".3f", 12),
        ("MFU", "MFU %", ".1f", 6),
        ("memory_GB", "MEM GB", ".2f", 7),
        ("data_loading_share", "DATA %", ".1f", 7),
    )

    def _why_no_tflops(self, e: JsonObject) -> None:
        """Once, on the console: why the TFLOP/s column is empty (the summary's
        ``flops_source`` says it too). Said when the detector gave up, or from the second
        window on (the first may come before the first step's FLOPs are known)."""
        if self._flops_why_said or e.get("TFLOPS_per_GPU") is not None:
            return
        source = self.flops_source
        if not (source.startswith("none:") or (as_number(e.get("step")) or 0) > 1):
            return
        self._flops_why_said = True
        why = source.removeprefix("none:").strip().removesuffix("; set perf.model")
        self._write(
            f"[rankguard perf] no TFLOP/s or MFU: {why if why != 'none' else 'no FLOPs known'}"
            " (set perf.model, perf.flops_per_step, or call measure_flops)"
        )

    def _print(self, e: JsonObject) -> None:
        """A table on a terminal (header once, aligned rows); plain lines in logs."""
        self._why_no_tflops(e)

        def fmt(key: str, spec: str) -> str:
            v = as_number(e.get(key))
            if v is None:
                return "-"
            if key in ("MFU", "data_loading_share"):
                v = 100 * v
            if key == "TFLOPS_per_GPU" and 0 < v < 0.1:
                spec = ".3g"  # a tiny model's figure, not 0.000
            return f"{v:{spec}}"

        if self._tty:
            if not self._header_done:
                head = " ".join(f"{title:>{w}}" for _, title, _, w in self._COLUMNS)
                self._write(f"[rankguard perf] {head}")
                self._header_done = True
            row = " ".join(f"{fmt(k, spec):>{w}}" for k, _, spec, w in self._COLUMNS)
            if e.get("includes_startup"):
                row += "  (first step: incl. start-up, warm-up)"
            self._write(f"[rankguard perf] {row}")
            return
        step = f"step {fmt('step_time_ms', '.1f')} ms"
        if e.get("includes_startup"):
            step = f"first step {fmt('step_time_ms', '.1f')} ms incl. start-up (warm-up)"
        self._write(
            f"[rankguard perf] iter {e['iteration']} | {step}"
            f" | {fmt('tokens_per_sec', ',.0f')} tok/s | {fmt('samples_per_sec', ',.1f')}"
            f" samples/s | {fmt('TFLOPS_per_GPU', '.3f')} TFLOP/s/GPU"
            f" | MFU {fmt('MFU', '.1f') + '%' if e.get('MFU') is not None else '-'}"
            f" | mem {fmt('memory_GB', '.2f')} GB"
        )

    def _write(self, line: str) -> None:
        try:
            self.console.write(line + "\n")
            self.console.flush()
        except (OSError, ValueError):
            pass

    # ---- end -------------------------------------------------------------------------

    def summary(self) -> JsonObject:
        kept, stats = final_statistics(self.step_ms, self.cfg.warmup_iterations)
        avg_ms = stats["avg"]
        gpu = self._gpu
        gpu_avg_ms = gpu.total_ms / gpu.total_steps if gpu.total_steps else None
        rate_s = (gpu_avg_ms or avg_ms or 0.0) / 1e3
        per_gpu = (
            tflops_per_gpu(self.flops_per_step, rate_s, self.world_size)
            if self.flops_per_step and rate_s
            else None
        )
        peaks = [p for e in self.entries if (p := as_number(e.get("peak_memory_GB"))) is not None]
        return {
            "session_info": {
                "start_time": _iso(self._start_wall),
                "end_time": _iso(time.time()),
                "total_iterations": len(self.step_ms) + self.skipped_steps + self.excluded_steps,
                "steps_with_eval_or_save": self.excluded_steps,
                "run_id": self.run_id,
                "world_size": self.world_size,
                "device": self.device_name or "cpu",
                "dtype": self.model_dtype or "unknown",
                "dtype_source": self.model_dtype_source,
                "peak_dtype": self.cfg.dtype,
                "peak_tflops_per_gpu": self.peak_tflops,
                "peak_source": self.peak_source,
                "flops_per_step": self.flops_per_step,
                "flops_source": self.flops_source,
                "batch_source": self.batch_source,
                "warmup_iterations": self.cfg.warmup_iterations,
                "steps_in_statistics": len(kept),
                "log_interval": self.cfg.log_interval,
            },
            "final_statistics": {
                "avg_tflops_per_gpu": _round(per_gpu),
                "avg_tflops_total": _round(per_gpu * self.world_size) if per_gpu else None,
                "avg_mfu": _round(mfu(per_gpu, self.peak_tflops)) if per_gpu else None,
                "avg_step_time_ms": _round(avg_ms),
                "avg_gpu_step_time_ms": _round(gpu_avg_ms),
                "median_step_time_ms": _round(stats["median"]),
                "min_step_time_ms": _round(stats["min"]),
                "max_step_time_ms": _round(stats["max"]),
                "avg_samples_per_sec": _round(self.global_samples / rate_s)
                if self.global_samples and rate_s
                else None,
                "avg_tokens_per_sec": _round(self.global_tokens / rate_s)
                if self.global_tokens and rate_s
                else None,
                "peak_memory_gb": _round(max(peaks)) if peaks else None,
                "ettr": None,  # the job's, written by rankguard's launcher at the end
            },
            "iteration_logs": [*self.entries],
        }

    def close(self) -> Path | None:
        """Final poll; rank 0 writes the summary and applies retention. Idempotent."""
        if self._closed:
            return None
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.poll()
        except Exception:
            logger.exception("rankguard perf: final poll failed")
        summary = self.summary() if self.out_dir is not None or self._sinks_open else None
        if self._sinks_open:
            with self._sink_lock:
                self._sink_thread.close(summary)
        if self.out_dir is None or summary is None:
            return None
        path = self._summary_file()
        self._mark_job()
        if self.unwritten_lines:
            logger.error(
                "rankguard perf: %d line(s) of %s could not be written: %s",
                self.unwritten_lines,
                PERF_LOG,
                self._log.last_error if self._log is not None else None,
            )
        try:
            atomic_write_json(path, summary)
        except OSError as exc:
            logger.error("rankguard perf: cannot write %s: %s", path, exc)
            return None
        prune_runs(self.out_dir.parent, keep=self.cfg.keep_runs, current=self.out_dir)
        return path

    SUMMARY_EVERY_S = 30.0  # the running summary's rewrites, at most this often

    def _summary_file(self) -> Path:
        """``perf_summary_<start>.json``: one per run, rewritten atomically while the run
        goes (FlagScale writes its summary periodically: a killed job keeps one) and a
        last time at close. The run directory is the job's across in-job restarts: an
        attempt takes over the summary an earlier attempt left there (its file name, its
        contents replaced by this attempt's), so a run never holds two."""
        if self._summary_path is None:
            assert self.out_dir is not None
            earlier = sorted(self.out_dir.glob(f"{SUMMARY_PREFIX}*.json"))
            if earlier:
                self._summary_path = earlier[-1]
            else:
                stamp = datetime.fromtimestamp(self._start_wall, timezone.utc)
                name = f"{SUMMARY_PREFIX}{stamp.strftime('%Y%m%d_%H%M%S')}.json"
                self._summary_path = self.out_dir / name
            if self.cfg.flagscale_summary_link:
                link_flagscale_summary(self._summary_path)
        return self._summary_path

    def _rewrite_summary(self) -> None:
        """The summary so far, after a new window, at most every ``SUMMARY_EVERY_S``
        (the perf thread's work, never the training loop's)."""
        now = time.monotonic()
        if self._summary_at is not None and now - self._summary_at < self.SUMMARY_EVERY_S:
            return
        self._summary_at = now
        try:
            atomic_write_json(self._summary_file(), self.summary())
        except OSError as exc:  # tried again with the next window
            logger.warning("rankguard perf: cannot write the running summary: %s", exc)

    def _mark_job(self) -> None:
        """Say which job this run belongs to (``perf_job.json``), once, before its
        first file: retention then tells this job's runs from another's."""
        if self._job_marked or self.out_dir is None:
            return
        try:
            atomic_write_json(
                self.out_dir / PERF_JOB_FILE,
                {"job": self.job, "run_id": self.run_id, "uid": os.getuid()},
            )
        except OSError as exc:  # tried again at the next poll
            logger.warning("rankguard perf: cannot write %s: %s", PERF_JOB_FILE, exc)
            return
        self._job_marked = True


_UNKNOWN_JOB = object()  # an unreadable marker: the run of no job


def run_job(run: Path) -> object:
    """The job a perf run directory belongs to, from its ``perf_job.json``: the job
    name; None for a run without a marker (older versions, a reporter given no job)."""
    try:
        marker = json.loads((run / PERF_JOB_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return _UNKNOWN_JOB
    return marker.get("job") if isinstance(marker, dict) else _UNKNOWN_JOB


def prune_runs(root: Path, *, keep: int, current: Path) -> list[Path]:
    """Delete all but the newest ``keep`` runs of the current run's job under ``root``.

    The runs of this job: directories (not symlinks) owned by this user, holding perf
    files, whose ``perf_job.json`` names the same job as ``current``'s (the training
    script or module :func:`rankguard.launcher.run.job_name` gives); another job's runs
    in the same log directory, or another user's, are never touched."""
    job = run_job(current)
    uid = os.getuid()
    runs = [
        p
        for p in root.iterdir()
        if not p.is_symlink()
        and p.is_dir()
        and p.stat().st_uid == uid
        and (any(p.glob(f"{SUMMARY_PREFIX}*.json")) or (p / PERF_LOG).exists())
        and (p.resolve() == current.resolve() or run_job(p) == job)
    ]
    runs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in runs[keep:]:
        if old.resolve() == current.resolve():
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed
