"""PerfReporter driven by hand: a fake clock, ``tracker.step_end`` and ``reporter.poll()``.

No thread is started; every duration comes from the fake clock, so step times, rates and
TFLOP/s are exact (up to the reporter's rounding to significant digits).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rankguard.perf.config import PerfConfig
from rankguard.perf.flops import ModelShape, analytic_flops_per_step
from rankguard.perf.peaks import CPU_REASON
from rankguard.perf.reporter import (
    PERF_LOG,
    SUMMARY_PREFIX,
    PerfReporter,
    final_statistics,
    prune_runs,
)
from rankguard.rank.timeline import RING_SIZE, ProgressTracker
from tests.factories import FakeNsClock as FakeClock

MS = 1_000_000  # ns
ENTRY_KEYS = {  # FlagScale perf_monitor's iteration_logs keys
    "iteration",
    "timestamp",
    "TFLOPS_per_GPU",
    "TFLOPS_total",
    "samples_per_sec",
    "tokens_per_sec",
    "step_time_ms",
    "memory_GB",
    "peak_memory_GB",
}


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-5)


class Rig:
    """A tracker, a reporter and their clock; ``step(ms)`` runs one step of ``ms``."""

    def __init__(
        self,
        tmp_path: Path | None,
        *,
        world_size: int = 1,
        rank: int = 0,
        mode: str = "cpu",
        event_factory: Any = None,
        **cfg: Any,
    ) -> None:
        self.clock = FakeClock()
        self.tracker = ProgressTracker(clock=self.clock, mode=mode, event_factory=event_factory)
        self.console = io.StringIO()
        self.out_dir = None if tmp_path is None else tmp_path / "perf_monitor" / "run-1"
        self.reporter = PerfReporter(
            PerfConfig(**cfg),
            self.tracker,
            rank=rank,
            world_size=world_size,
            run_id="run-1",
            out_dir=self.out_dir,
            console=self.console,
            gpu_event_factory=event_factory,
        )
        self.iteration = 0

    def step(self, ms: float, *, data_ms: float = 0.0, poll: bool = False) -> list[dict]:
        if data_ms:
            self.clock.advance_ms(data_ms)
            self.tracker.data_ns += int(data_ms * MS)
        self.clock.advance_ms(ms - data_ms)
        self.iteration += 1
        self.tracker.step_end(self.iteration)
        return self.reporter.poll() if poll else []

    def steps(self, *durations: float, poll: bool = False) -> None:
        for ms in durations:
            self.step(ms, poll=poll)

    def checkpoint(self, ms: float) -> None:
        self.tracker.checkpoint_start("ckpt")
        self.clock.advance_ms(ms)
        self.tracker.checkpoint_end()


def _entries_at(rig: Rig) -> list[int]:
    return [e["step"] for e in rig.reporter.entries]


# ---- cadence and step times ---------------------------------------------------------


def test_entries_at_step_one_and_every_log_interval() -> None:
    rig = Rig(None, log_interval=5)
    for _ in range(12):
        rig.step(100, poll=True)
    assert _entries_at(rig) == [1, 5, 10]
    assert [e["iteration"] for e in rig.reporter.entries] == [1, 5, 10]
    assert [e["steps_in_window"] for e in rig.reporter.entries] == [1, 4, 5]
    assert rig.reporter.poll() == []  # nothing new, nothing logged


def test_one_poll_covering_many_boundaries_logs_each_window() -> None:
    rig = Rig(None, log_interval=5)
    rig.steps(*(10.0 * i for i in range(1, 26)))  # step i takes 10*i ms
    new = rig.reporter.poll()
    assert [e["step"] for e in new] == [1, 5, 10, 15, 20, 25]
    assert new == rig.reporter.entries
    # Window (a, b] averages steps a+1..b: 10 * mean(a+1..b).
    assert [e["step_time_ms"] for e in new] == [
        approx(10),
        approx(35),
        approx(80),
        approx(130),
        approx(180),
        approx(230),
    ]
    assert list(rig.reporter.step_ms) == [approx(10.0 * i) for i in range(1, 26)]


def test_step_time_exact_from_the_fake_clock() -> None:
    rig = Rig(None, log_interval=2)
    rig.steps(250, 250, 250, 250, poll=True)
    assert [e["step_time_ms"] for e in rig.reporter.entries] == [250, 250, 250]
    assert list(rig.reporter.step_ms) == [250] * 4


def test_first_step_is_measured_from_the_phase_change() -> None:
    rig = Rig(None, log_interval=10)
    rig.clock.advance_ms(7000)  # model build, data loader start: not a step
    rig.tracker.set_phase("train")
    rig.clock.advance_ms(40)
    rig.tracker.step_end(1)
    (entry,) = rig.reporter.poll()
    assert entry["step_time_ms"] == approx(40)
    assert list(rig.reporter.step_ms) == [approx(40)]


def test_first_step_without_a_phase_change_runs_from_start_up() -> None:
    rig = Rig(None, log_interval=10)
    rig.clock.advance_ms(300)
    rig.tracker.step_end(1)
    assert rig.reporter.poll()[0]["step_time_ms"] == approx(300)


# ---- throughput, TFLOP/s, MFU -------------------------------------------------------


def test_samples_and_tokens_per_second_use_the_global_batch() -> None:
    rig = Rig(None, world_size=4, log_interval=1)
    rig.reporter.set_batch(samples=8, tokens=8 * 512)  # per replica
    e = rig.step(200, poll=True)[0]
    assert e["samples_per_sec"] == approx(8 * 4 / 0.2)
    assert e["tokens_per_sec"] == approx(8 * 512 * 4 / 0.2)


def test_data_parallel_size_overrides_the_world_size() -> None:
    rig = Rig(None, world_size=8, log_interval=1)
    rig.reporter.set_batch(samples=3, tokens=300, data_parallel_size=2)
    e = rig.step(500, poll=True)[0]
    assert e["samples_per_sec"] == approx(3 * 2 / 0.5)
    assert e["tokens_per_sec"] == approx(300 * 2 / 0.5)
    with pytest.raises(ValueError, match="data_parallel_size"):
        rig.reporter.set_batch(samples=1, data_parallel_size=-1)


def test_data_parallel_size_zero_is_rejected() -> None:
    rig = Rig(None, world_size=8)
    with pytest.raises(ValueError, match="data_parallel_size"):
        rig.reporter.set_batch(samples=1, data_parallel_size=0)


def test_no_batch_no_rates() -> None:
    rig = Rig(None, log_interval=1)
    e = rig.step(100, poll=True)[0]
    assert e["samples_per_sec"] is None and e["tokens_per_sec"] is None
    assert e["TFLOPS_per_GPU"] is None and e["TFLOPS_total"] is None and e["MFU"] is None


def test_tflops_per_gpu_divides_global_flops_by_world_size() -> None:
    flops = 8e12  # global batch, one optimizer step
    rig = Rig(None, world_size=4, log_interval=1, flops_per_step=flops)
    e = rig.step(500, poll=True)[0]
    assert e["TFLOPS_per_GPU"] == approx(flops / (0.5 * 1e12 * 4))  # 4.0
    assert e["TFLOPS_total"] == approx(e["TFLOPS_per_GPU"] * 4)
    assert rig.reporter.flops_source == "config: perf.flops_per_step"


def test_mfu_against_the_peak_override() -> None:
    rig = Rig(None, world_size=2, log_interval=1, flops_per_step=4e12, peak_tflops=10.0)
    e = rig.step(100, poll=True)[0]
    per_gpu = 4e12 / (0.1 * 1e12 * 2)  # 20 TFLOP/s
    assert e["TFLOPS_per_GPU"] == approx(per_gpu)
    assert e["MFU"] == approx(per_gpu / 10.0)
    assert rig.reporter.peak_source == "override"


def test_no_mfu_on_cpu_without_a_peak() -> None:
    rig = Rig(None, log_interval=1, flops_per_step=1e9)
    e = rig.step(100, poll=True)[0]
    assert e["TFLOPS_per_GPU"] == approx(1e9 / (0.1 * 1e12))
    assert e["MFU"] is None
    assert rig.reporter.peak_tflops is None and rig.reporter.peak_source == CPU_REASON


def test_analytic_flops_from_the_model_on_set_batch() -> None:
    shape = ModelShape(
        family="gpt",
        num_layers=2,
        hidden_size=64,
        seq_length=32,
        vocab_size=128,
        num_attention_heads=4,
    )
    rig = Rig(None, world_size=2, log_interval=1, model=shape)
    assert rig.reporter.flops_per_step is None
    rig.reporter.set_batch(samples=3)
    expected = analytic_flops_per_step(shape, 6)  # global batch: 3 x 2 replicas
    assert rig.reporter.flops_per_step == expected
    assert "analytic" in rig.reporter.flops_source and "6" in rig.reporter.flops_source
    e = rig.step(250, poll=True)[0]
    assert e["TFLOPS_per_GPU"] == approx(expected / (0.25 * 1e12 * 2))


def test_configured_flops_win_over_the_model() -> None:
    shape = ModelShape(
        family="llama",
        num_layers=1,
        hidden_size=64,
        seq_length=16,
        vocab_size=64,
        num_attention_heads=4,
    )
    rig = Rig(None, world_size=2, model=shape, flops_per_step=5e9)
    rig.reporter.set_batch(samples=4)
    assert rig.reporter.flops_per_step == 5e9


# ---- data loading and checkpoints ---------------------------------------------------


def test_data_loading_share_per_window() -> None:
    rig = Rig(None, log_interval=5)
    for _ in range(10):
        rig.step(100, data_ms=20, poll=True)
    assert [e["data_loading_share"] for e in rig.reporter.entries] == [approx(0.2)] * 3


def test_no_data_loading_share_when_not_measured() -> None:
    rig = Rig(None, log_interval=1)
    assert rig.step(100, poll=True)[0]["data_loading_share"] is None


def test_data_loading_share_when_one_poll_covers_several_windows() -> None:
    rig = Rig(None, log_interval=5)
    for _ in range(10):
        rig.step(100, data_ms=20)
    shares = [e["data_loading_share"] for e in rig.reporter.poll()]
    assert shares == [approx(0.2)] * 3


def test_checkpoint_saves_are_left_out_of_step_times() -> None:
    rig = Rig(None, log_interval=5)
    rig.steps(100, 100, 100, 100, poll=True)
    rig.checkpoint(5000)
    rig.reporter.poll()
    rig.steps(100, 100, 100, 100, 100, 100, 100, poll=True)
    assert all(e["step_time_ms"] == approx(100) for e in rig.reporter.entries)
    assert list(rig.reporter.step_ms) == [approx(100)] * 11  # 11 real steps, no save
    # Entries at training steps 1, 5 and 10; the save (seq 5) is neither a step nor a
    # log boundary, so the windows hold 1, 4 and 5 steps.
    assert [e["steps_in_window"] for e in rig.reporter.entries] == [1, 4, 5]
    assert rig.reporter.summary()["final_statistics"]["max_step_time_ms"] == approx(100)


def test_checkpoint_inside_one_polled_window_is_left_out() -> None:
    rig = Rig(None, log_interval=10)
    rig.steps(50, 50, 50)
    rig.checkpoint(3000)
    rig.steps(*[50] * 12)
    new = rig.reporter.poll()
    assert [e["step_time_ms"] for e in new] == [approx(50)] * len(new)
    assert max(rig.reporter.step_ms) == approx(50)


def test_cadence_stays_on_iterations_after_a_checkpoint() -> None:
    rig = Rig(None, log_interval=5)
    rig.steps(100, 100, 100, poll=True)
    rig.checkpoint(1000)
    rig.steps(*[100] * 9, poll=True)
    assert [e["iteration"] for e in rig.reporter.entries] == [1, 5, 10]


def test_a_save_right_after_a_logged_step_does_not_shift_its_iteration() -> None:
    """The demo saves at step 10 (its log boundary) and the perf thread polls after the
    save ended: the entry of step 10 is iteration 10, not 9 (the save's own count of
    progress is not a step of the script)."""
    rig = Rig(None, log_interval=5)
    rig.steps(*[100] * 10)
    rig.checkpoint(500)  # issued: step 10, then the save
    rig.reporter.poll()
    rig.steps(*[100] * 5)
    rig.checkpoint(500)
    rig.steps(100)
    rig.reporter.poll()
    assert [e["iteration"] for e in rig.reporter.entries] == [1, 5, 10, 15]
    assert [e["step"] for e in rig.reporter.entries] == [1, 5, 10, 15]


def test_a_save_is_counted_out_before_the_perf_thread_can_see_its_progress() -> None:
    """The training thread ends a save: the perf thread, reading at any moment, never
    sees the save's progress without knowing it is a save (else a save is a step and the
    cadence slips)."""
    rig = Rig(None, log_interval=5)
    rig.steps(*[100] * 4)
    tracker = rig.tracker
    seen: list[tuple[int, bool]] = []

    class Watching(list):  # type: ignore[type-arg]
        def append(self, seq: int) -> None:
            # the moment the save is listed: its progress must not be published yet
            seen.append((tracker.issued_seq, seq in self))
            super().append(seq)

    tracker.non_step_seqs = Watching(tracker.non_step_seqs)
    rig.checkpoint(500)
    assert seen == [(4, False)]
    assert tracker.issued_seq == 5 and list(tracker.non_step_seqs) == [5]


# ---- warm-up and final statistics ---------------------------------------------------


def test_final_statistics_drop_the_warmup_steps() -> None:
    rig = Rig(None, warmup_iterations=3, log_interval=100)
    rig.steps(900, 500, 300, 100, 110, 120, 130, 140, 150, 160)
    rig.reporter.poll()
    s = rig.reporter.summary()
    fs = s["final_statistics"]
    assert fs["avg_step_time_ms"] == approx(130)
    assert fs["median_step_time_ms"] == approx(130)
    assert fs["min_step_time_ms"] == approx(100)
    assert fs["max_step_time_ms"] == approx(160)
    assert s["session_info"]["steps_in_statistics"] == 7
    assert s["session_info"]["total_iterations"] == 10


def test_final_statistics_of_a_run_shorter_than_twice_the_warmup_use_its_second_half() -> None:
    rig = Rig(None, warmup_iterations=3, log_interval=100)
    rig.steps(900, 500, 100, 110, 120)
    rig.reporter.poll()
    fs = rig.reporter.summary()["final_statistics"]
    assert fs["avg_step_time_ms"] == approx(110)  # steps[5 // 2:] = 100, 110, 120
    assert fs["max_step_time_ms"] == approx(120)


@pytest.mark.parametrize(
    ("n", "warmup", "kept"),
    [
        (10, 3, list(range(3, 10))),  # long enough: drop the warm-up
        (6, 3, [3, 4, 5]),  # exactly twice: drop the warm-up (= second half)
        (5, 3, [2, 3, 4]),  # shorter: second half
        (1, 3, [0]),  # one step: keep it
        (4, 0, [0, 1, 2, 3]),  # no warm-up: everything
        (0, 3, []),
    ],
)
def test_final_statistics_rule(n: int, warmup: int, kept: list[int]) -> None:
    got, stats = final_statistics([float(i) for i in range(n)], warmup)
    assert got == [float(i) for i in kept]
    if kept:
        assert stats["min"] == kept[0] and stats["max"] == kept[-1]
        assert stats["avg"] == approx(sum(kept) / len(kept))
    else:
        assert stats == {"avg": None, "median": None, "min": None, "max": None}


def test_summary_tflops_and_rates_from_the_average_step() -> None:
    rig = Rig(None, world_size=2, warmup_iterations=0, flops_per_step=2e12, peak_tflops=5.0)
    rig.reporter.set_batch(samples=4, tokens=4096)
    rig.steps(100, 300, 200)
    rig.reporter.poll()
    fs = rig.reporter.summary()["final_statistics"]
    per_gpu = 2e12 / (0.2 * 1e12 * 2)
    assert fs["avg_step_time_ms"] == approx(200)
    assert fs["avg_tflops_per_gpu"] == approx(per_gpu)
    assert fs["avg_tflops_total"] == approx(per_gpu * 2)
    assert fs["avg_mfu"] == approx(per_gpu / 5.0)
    assert fs["avg_samples_per_sec"] == approx(8 / 0.2)
    assert fs["avg_tokens_per_sec"] == approx(8192 / 0.2)


# ---- files and console --------------------------------------------------------------


def test_summary_schema_and_file(tmp_path: Path) -> None:
    rig = Rig(tmp_path, world_size=2, log_interval=2, flops_per_step=1e12)
    rig.reporter.set_batch(samples=2, tokens=64)
    rig.steps(100, 100, 100, 100, 100, poll=True)
    path = rig.reporter.close()
    assert path is not None and path.parent == rig.out_dir
    assert path.name.startswith(SUMMARY_PREFIX) and path.suffix == ".json"
    s = json.loads(path.read_text())
    assert set(s) == {"session_info", "final_statistics", "iteration_logs"}
    assert set(s["session_info"]) >= {"start_time", "end_time", "total_iterations"}
    assert s["session_info"]["start_time"] <= s["session_info"]["end_time"]
    assert s["session_info"]["start_time"].endswith("+00:00")
    assert s["session_info"]["total_iterations"] == 5
    assert set(s["final_statistics"]) >= {
        "avg_tflops_per_gpu",
        "avg_tflops_total",
        "avg_step_time_ms",
        "min_step_time_ms",
        "max_step_time_ms",
        "peak_memory_gb",
        "ettr",
    }
    assert s["final_statistics"]["ettr"] is None  # the launcher's, at the job's end
    assert s["final_statistics"]["peak_memory_gb"] > 0  # process RSS on CPU
    assert len(s["iteration_logs"]) == 3
    for entry in s["iteration_logs"]:
        assert set(entry) >= ENTRY_KEYS
        assert entry["memory_GB"] > 0 and entry["peak_memory_GB"] >= entry["memory_GB"] * 0.5
        assert entry["memory_kind"] == "cpu_rss"
        assert entry["run_id"] == "run-1" and entry["rank"] == 0
    assert s["iteration_logs"] == json.loads(json.dumps(rig.reporter.entries))


def test_perf_jsonl_lines_equal_the_entries(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=3)
    for _ in range(4):
        rig.steps(100, 100, 100, poll=True)
    rig.steps(*[100] * 7)  # one poll for two windows
    rig.reporter.poll()
    assert rig.out_dir is not None
    lines = (rig.out_dir / PERF_LOG).read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(rig.reporter.entries))
    assert [json.loads(x)["step"] for x in lines] == [1, 3, 6, 9, 12, 15, 18]


def test_only_rank_zero_writes_files_and_prints(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rank=1, world_size=2, log_interval=1)
    rig.steps(100, 100, poll=True)
    assert len(rig.reporter.entries) == 2  # measured on every rank (for the heartbeat)
    assert rig.reporter.heartbeat_fields() is not None
    assert rig.reporter.close() is None
    assert not (tmp_path / "perf_monitor").exists()
    assert rig.console.getvalue() == ""


def test_console_line_on_rank_zero(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=2)
    rig.steps(100, 100, 100, 100, poll=True)
    lines = rig.console.getvalue().splitlines()
    why = [ln for ln in lines if "no TFLOP/s or MFU" in ln]  # no FLOPs known: said once
    lines = [ln for ln in lines if ln not in why]
    assert len(why) == 1 and len(lines) == len(rig.reporter.entries) == 3
    assert all(line.startswith("[rankguard perf]") for line in lines)
    assert "100.0" in lines[-1]  # the step time


def test_no_console_line_when_console_is_off(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=1, console=False)
    rig.steps(100, 100, poll=True)
    assert rig.console.getvalue() == ""
    assert rig.out_dir is not None and (rig.out_dir / PERF_LOG).exists()


def test_close_is_idempotent_and_writes_one_summary(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=1)
    rig.steps(100, 100)  # not polled yet: close() polls once more
    first = rig.reporter.close()
    assert first is not None
    assert rig.reporter.close() is None
    assert rig.out_dir is not None
    assert len(list(rig.out_dir.glob(f"{SUMMARY_PREFIX}*.json"))) == 1
    assert json.loads(first.read_text())["session_info"]["total_iterations"] == 2


def _run_dir(root: Path, name: str, mtime: float, *, perf: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if perf:
        (d / PERF_LOG).write_text("{}\n")
    os.utime(d, (mtime, mtime))
    return d


def test_prune_runs_keeps_the_newest(tmp_path: Path) -> None:
    dirs = [_run_dir(tmp_path, f"r{i}", 1_000_000 + i) for i in range(5)]
    other = _run_dir(tmp_path, "not-a-run", 1.0, perf=False)
    removed = prune_runs(tmp_path, keep=2, current=dirs[4])
    assert sorted(removed) == sorted(dirs[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-run", "r3", "r4"]
    assert other.exists()


def test_prune_runs_never_deletes_the_current_run(tmp_path: Path) -> None:
    dirs = [_run_dir(tmp_path, f"r{i}", 1_000_000 + i) for i in range(4)]
    prune_runs(tmp_path, keep=1, current=dirs[0])  # the current one is the oldest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0", "r3"]


def test_close_applies_retention(tmp_path: Path) -> None:
    root = tmp_path / "perf_monitor"
    for i in range(3):
        _run_dir(root, f"old{i}", 1_000_000 + i)
    rig = Rig(tmp_path, log_interval=1, keep_runs=2)
    rig.steps(100, poll=True)
    rig.reporter.close()
    assert sorted(p.name for p in root.iterdir()) == ["old2", "run-1"]


# ---- ring overrun -------------------------------------------------------------------


def test_ring_overrun_skips_the_gap_without_crashing() -> None:
    rig = Rig(None, log_interval=10)
    rig.steps(*[5] * 20, poll=True)  # entries at 1, 10, 20
    n = RING_SIZE + 100
    rig.steps(*[5] * n)  # the reporter falls behind by more than the ring
    new = rig.reporter.poll()
    last = 20 + n
    first_kept = last - RING_SIZE + 1
    assert new, "logging resumes after the gap"
    assert new[0]["step"] == (first_kept // 10 + 1) * 10
    assert new[-1]["step"] == last // 10 * 10
    assert all(e["step_time_ms"] == approx(5) for e in new)
    assert new[0]["steps_in_window"] == new[0]["step"] - first_kept
    assert len(rig.reporter.step_ms) == 20 + (last - first_kept)
    assert all(ms == approx(5) for ms in rig.reporter.step_ms)
    rig.steps(5, 5, 5, 5, 5, 5, 5, 5, 5, 5)  # and goes on normally
    (after,) = rig.reporter.poll()
    assert after["step"] == (last + 10) // 10 * 10 and after["step_time_ms"] == approx(5)


# ---- GPU timer (fake CUDA events) ---------------------------------------------------


class FakeTimingEvent:
    """torch.cuda.Event(enable_timing=True): the test completes it at a device time."""

    def __init__(self) -> None:
        self.recorded_with: list[Any] = []
        self.at_ms: float | None = None

    def record(self, stream: Any = None) -> None:
        self.recorded_with.append(stream)

    def query(self) -> bool:
        return self.at_ms is not None

    def elapsed_time(self, other: FakeTimingEvent) -> float:
        assert self.at_ms is not None and other.at_ms is not None
        return other.at_ms - self.at_ms


class EventFactory:
    def __init__(self) -> None:
        self.made: list[FakeTimingEvent] = []

    def __call__(self) -> FakeTimingEvent:
        e = FakeTimingEvent()
        self.made.append(e)
        return e

    def pending(self) -> list[FakeTimingEvent]:
        return [e for e in self.made if e.recorded_with and e.at_ms is None]


def _cuda_rig(**cfg: Any) -> tuple[Rig, EventFactory]:
    factory = EventFactory()
    rig = Rig(None, mode="cuda", event_factory=factory, **cfg)
    return rig, factory


def _complete_timer_event(factory: EventFactory, at_ms: float) -> None:
    (event,) = factory.pending()  # the reporter's timer has one event in flight
    event.at_ms = at_ms


def test_gpu_step_time_from_two_completed_events() -> None:
    rig, factory = _cuda_rig(world_size=2, log_interval=10, flops_per_step=6e12)
    rig.reporter.set_batch(samples=4)
    rig.steps(*[100] * 10)
    e10 = rig.reporter.poll()[-1]  # records event A after step 10
    assert e10["gpu_step_time_ms"] is None  # no interval measured yet: CPU time
    assert e10["TFLOPS_per_GPU"] == approx(6e12 / (0.1 * 1e12 * 2))
    _complete_timer_event(factory, 1000.0)
    rig.steps(*[100] * 10)
    rig.reporter.poll()  # A done -> previous; records B after step 20
    _complete_timer_event(factory, 1000.0 + 10 * 150.0)  # the device took 150 ms a step
    rig.steps(*[100] * 10)
    e30 = rig.reporter.poll()[-1]
    assert e30["step"] == 30
    assert e30["gpu_step_time_ms"] == approx(150)
    assert e30["step_time_ms"] == approx(100)  # issue time, from the fake clock
    assert e30["TFLOPS_per_GPU"] == approx(6e12 / (0.15 * 1e12 * 2))
    assert e30["samples_per_sec"] == approx(8 / 0.15)
    hb = rig.reporter.heartbeat_fields()
    assert hb is not None and hb["perf"]["step_time_ms"] == approx(150)
    assert hb["perf"]["windows"][-1] == [30, 30, approx(150)]


def test_gpu_timer_waits_for_the_pending_event() -> None:
    rig, factory = _cuda_rig(log_interval=1)
    rig.step(100, poll=True)
    rig.step(100, poll=True)
    rig.step(100, poll=True)
    assert len(factory.made) == 1  # one event in flight: nothing recorded until it completes
    assert rig.reporter.entries[-1]["gpu_step_time_ms"] is None


def test_cuda_mode_entries_carry_the_scripts_iteration_numbers() -> None:
    rig, _ = _cuda_rig(log_interval=5)
    rig.iteration = 100  # resumed from a checkpoint at iteration 100
    rig.steps(*[100] * 10)
    assert [e["iteration"] for e in rig.reporter.poll()] == [101, 105, 110]


def test_cuda_summary_averages_the_device_time_over_the_run() -> None:
    rig, factory = _cuda_rig(world_size=1, warmup_iterations=0, flops_per_step=1e12)
    device_ms = 0.0
    per_step = [100.0] * 9 + [400.0]  # nine intervals at 100 ms a step, the last at 400
    rig.steps(*[100] * 10)
    rig.reporter.poll()  # event after step 10
    _complete_timer_event(factory, device_ms)
    for ms in per_step:
        rig.steps(*[100] * 10)
        rig.reporter.poll()
        device_ms += 10 * ms
        _complete_timer_event(factory, device_ms)
    rig.reporter.poll()
    assert rig.reporter._gpu.ms_per_step == approx(400)
    mean_ms = sum(per_step) / len(per_step)  # 130 ms
    fs = rig.reporter.summary()["final_statistics"]
    assert fs["avg_tflops_per_gpu"] == pytest.approx(1e12 / (mean_ms / 1e3 * 1e12), rel=0.05)


# ---- heartbeat fields ---------------------------------------------------------------


def test_heartbeat_fields_shape() -> None:
    rig = Rig(None, log_interval=1, flops_per_step=1e12)
    assert rig.reporter.heartbeat_fields() is None
    rig.steps(*[100] * 20, poll=True)
    hb = rig.reporter.heartbeat_fields()
    assert hb is not None and set(hb) == {"perf"}
    perf = hb["perf"]
    assert set(perf) == {
        "step",
        "iteration",
        "step_time_ms",
        "TFLOPS_per_GPU",
        "MFU",
        "memory_GB",
        "windows",
    }
    assert perf["step"] == 20 and perf["iteration"] == 20
    assert perf["step_time_ms"] == approx(100)
    assert perf["TFLOPS_per_GPU"] == approx(10)
    assert perf["memory_GB"] > 0
    assert len(perf["windows"]) == 16  # the last 16 windows
    assert perf["windows"][0] == [5, 5, approx(100)]
    assert perf["windows"][-1] == [20, 20, approx(100)]
    json.dumps(hb)  # goes into a JSON heartbeat record


def test_perf_jsonl_lines_a_full_disk_refused_are_written_later_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from rankguard.util import fs as _fs

    real = _fs.append_bytes

    def full(path: Any, data: bytes, *, fsync: bool = True) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    rig = Rig(tmp_path, log_interval=3)
    rig.steps(100, 100, 100, poll=True)  # steps 1 and 3 written
    monkeypatch.setattr(_fs, "append_bytes", full)
    for _ in range(3):  # steps 6, 9, 12: the disk is full
        rig.steps(100, 100, 100, poll=True)
    assert rig.reporter.unwritten_lines == 3
    monkeypatch.setattr(_fs, "append_bytes", real)  # space again
    rig.reporter.poll()  # no new window: the queued lines go now
    assert rig.reporter.unwritten_lines == 0
    rig.steps(100, 100, 100, poll=True)
    assert rig.out_dir is not None
    lines = (rig.out_dir / PERF_LOG).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 3, 6, 9, 12, 15]


# ---- the first window and the dtype the summary names --------------------------------


def test_first_window_from_start_up_is_labelled_warm_up(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=5)
    rig.step(3300, poll=True)  # imports, model, data loader: no phase entered before it
    rig.steps(100, 100, 100, 100, poll=True)
    first, second = rig.reporter.entries
    assert first["includes_startup"] is True and "includes_startup" not in second
    assert second["step_time_ms"] == approx(100)
    assert "first step 3300.0 ms incl. start-up (warm-up)" in rig.console.getvalue()


def test_first_window_from_the_loops_start_is_a_step() -> None:
    rig = Rig(None, log_interval=5)
    rig.clock.advance_ms(3000)  # start-up
    rig.tracker.set_phase("train")  # the loop (or its framework) says where it starts
    rig.step(100, poll=True)
    (first,) = rig.reporter.entries
    assert "includes_startup" not in first and first["step_time_ms"] == approx(100)


def test_summary_dtype_is_the_models_not_the_peak_column() -> None:
    rig = Rig(None, dtype="bf16")
    info = rig.reporter.summary()["session_info"]
    assert (info["dtype"], info["dtype_source"], info["peak_dtype"]) == ("unknown", None, "bf16")
    rig.reporter.set_model_dtype("fp32", "detected: parameters of GPT")
    info = rig.reporter.summary()["session_info"]
    assert (info["dtype"], info["dtype_source"]) == ("fp32", "detected: parameters of GPT")


def test_the_summary_is_written_while_the_run_goes(tmp_path: Path) -> None:
    """FlagScale rewrites its summary as the run goes: a job killed before close keeps one
    (one file per run, rewritten atomically, at most every SUMMARY_EVERY_S; close writes it
    a last time)."""
    rig = Rig(tmp_path, log_interval=2)
    assert rig.out_dir is not None
    rig.steps(100, 100, poll=True)  # written at the first window (iteration 1)
    (running,) = rig.out_dir.glob(f"{SUMMARY_PREFIX}*.json")
    first = json.loads(running.read_text())
    assert set(first) == {"session_info", "final_statistics", "iteration_logs"}
    assert [e["iteration"] for e in first["iteration_logs"]] == [1]
    rig.steps(100, 100, poll=True)  # within SUMMARY_EVERY_S: not rewritten yet
    assert json.loads(running.read_text()) == first
    rig.reporter._summary_at = -1e9  # as if SUMMARY_EVERY_S had passed
    rig.steps(100, 100, poll=True)
    assert [e["iteration"] for e in json.loads(running.read_text())["iteration_logs"]] == [
        1,
        2,
        4,
        6,
    ]
    final = rig.reporter.close()
    assert final == running  # the same file, a last time
    assert len(list(rig.out_dir.glob(f"{SUMMARY_PREFIX}*.json"))) == 1
    assert json.loads(final.read_text())["session_info"]["total_iterations"] == 6


def test_a_restarted_attempt_takes_over_the_summary_its_predecessor_left(tmp_path: Path) -> None:
    """An in-job restart keeps the run directory: the new attempt's rank 0 rewrites the
    summary the killed attempt left there (the same name, this attempt's contents), so a
    run never holds two (readers would not know which one is the job's)."""
    killed = Rig(tmp_path, log_interval=2)
    assert killed.out_dir is not None
    killed.steps(100, 100, poll=True)  # a running summary, then SIGKILL: no close()
    (left,) = killed.out_dir.glob(f"{SUMMARY_PREFIX}*.json")
    assert json.loads(left.read_text())["session_info"]["dtype"] == "unknown"
    restarted = Rig(tmp_path, log_interval=2)
    restarted.reporter.set_model_dtype("fp32", "detected: parameters of GPT")
    restarted.steps(100, 100, 100, poll=True)
    final = restarted.reporter.close()
    assert final == left
    assert list(killed.out_dir.glob(f"{SUMMARY_PREFIX}*.json")) == [left]
    info = json.loads(left.read_text())["session_info"]
    assert info["dtype"] == "fp32" and info["total_iterations"] == 3


def test_the_console_says_once_why_there_is_no_tflops(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=1)
    rig.reporter.flops_source = (
        "none: FLOPs not measured: sharded parameters (FSDP); set perf.model"
    )
    rig.steps(100, 100, 100, poll=True)
    said = [ln for ln in rig.console.getvalue().splitlines() if "no TFLOP/s" in ln]
    assert said == [
        "[rankguard perf] no TFLOP/s or MFU: FLOPs not measured: sharded parameters (FSDP)"
        " (set perf.model, perf.flops_per_step, or call measure_flops)"
    ]
    quiet = Rig(tmp_path / "b", log_interval=1)
    quiet.step(100, poll=True)  # the first window: the detector may not be done yet
    assert "no TFLOP/s" not in quiet.console.getvalue()


def test_a_tiny_models_tflops_are_printed_nonzero(tmp_path: Path) -> None:
    rig = Rig(tmp_path, log_interval=1, flops_per_step=1e7)  # 1e7 FLOPs in 100 ms
    rig.steps(100, 100, poll=True)
    assert "| 0.0001 TFLOP/s/GPU" in rig.console.getvalue(), rig.console.getvalue()


def test_a_log_interval_longer_than_the_ring_still_gives_the_window_step_time() -> None:
    """A window of more steps than the step-time ring holds: its start was overwritten
    by the time the window ends, so it is taken when the steps go by (with a save and
    the data-loading time inside it)."""
    interval = RING_SIZE + 1000
    rig = Rig(None, log_interval=interval)
    rig.step(100, data_ms=10, poll=True)  # step 1: logged
    for i in range(2, interval + 1):
        rig.step(100, data_ms=10)
        if i == 3000:
            rig.checkpoint(5000)
        if i % 500 == 0:
            rig.reporter.poll()
    rig.reporter.poll()
    assert _entries_at(rig) == [1, interval]
    last = rig.reporter.entries[-1]
    assert last["steps_in_window"] == interval - 1
    assert last["step_time_ms"] == approx(100)
    assert last["data_loading_share"] == approx(0.1)
