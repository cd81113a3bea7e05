"""A synthetic run directory: the records rank 0's processes (and its peers') and the
launcher would write, at times the test chooses (the goodput tests' true timeline)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

T0 = 1_800_000_000.0  # wall clock of the synthetic job's start
MONO = 5_000.0  # the rank's monotonic clock at T0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Rank0:
    """One process of rank 0 (or of ``rank``): writes the heartbeat records its session
    would."""

    run_dir: Path
    pid: int
    start: float
    rank: int = 0
    interval: float = 1.0
    iteration: int | None = None
    progress: int = 0
    last_progress: float | None = None
    phase: str = "setup"
    phase_since: float = 0.0
    iteration_source: str | None = None  # "script": the script numbers its steps
    checkpoint_count: int = 0  # saves among the progress steps
    records: list[dict[str, Any]] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.phase_since = self.start
        self.last_record = self.start
        self.record("process_start", self.start)

    def record(self, event: str, t: float, **extra: Any) -> None:
        self.records.append(
            {
                "schema_version": 1,
                "event": event,
                "run_id": "synthetic",
                "rank": self.rank,
                "pid": self.pid,
                "wall_time_ns": int(t * 1e9),
                "monotonic_ns": int((MONO + t - T0) * 1e9),
                "progress_seq": self.progress,
                "iteration": self.iteration,
                "phase": self.phase,
                "phase_elapsed_s": round(t - self.phase_since, 6),
                "last_progress_monotonic_ns": None
                if self.last_progress is None
                else int((MONO + self.last_progress - T0) * 1e9),
                "checkpoint_count": self.checkpoint_count,
                **({"iteration_source": self.iteration_source} if self.iteration_source else {}),
                **extra,
            }
        )
        self.last_record = t

    def idle_to(self, t: float) -> None:
        """Periodic records up to ``t``."""
        while self.last_record + self.interval < t:
            self.record("heartbeat", self.last_record + self.interval)

    def set_phase(self, phase: str, t: float) -> None:
        self.idle_to(t)
        self.phase, self.phase_since = phase, t
        self.record("heartbeat", t)  # the session writes one at each phase change

    def step(self, t: float, perf_every: int = 10) -> None:
        self.idle_to(t)
        first = self.progress == 0
        self.iteration = (self.iteration or 0) + 1
        self.progress += 1
        self.last_progress = t
        if self.phase != "train":
            self.phase, self.phase_since = "train", t
        if first or self.iteration % perf_every == 0:
            self.perf.append(
                {
                    "iteration": self.iteration,
                    # the perf monitor's count of training steps in this process
                    "step": self.progress - self.checkpoint_count,
                    "timestamp": iso(t),
                    "includes_startup": first or None,
                }
            )

    def save(self, t: float, duration: float) -> float:
        """A blocking save after the current step (as ``rg.checkpoint()``: its end is
        progress but not a step). The time it ends."""
        self.set_phase("checkpointing", t)
        end = t + duration
        self.progress += 1
        self.checkpoint_count += 1
        self.last_progress = end
        self.set_phase("train", end)
        return end

    def reenter(self, t: float, back_at: float, *, iteration: int | None = None) -> None:
        """An in-process re-entry from ``t`` to ``back_at``: the ``inprocess_restart``
        phase, then the rank marked recovered (its last progress moves, no step is
        counted); ``iteration``: the one it resumes after (default: where it was)."""
        self.set_phase("inprocess_restart", t)
        self.last_progress = back_at
        if iteration is not None:
            self.iteration = iteration
        self.set_phase("train", back_at)

    def end(self, t: float, *, clean: bool) -> None:
        self.idle_to(t)
        self.record("process_end", t, exit={"clean": clean, "exit_code": 0 if clean else 1})

    def write(self) -> None:
        path = self.run_dir / f"rank_{self.rank}_pid_{self.pid}.heartbeat.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        if self.rank != 0:
            return  # the perf log is rank 0's
        perf = self.run_dir.parent.parent / "perf_monitor" / self.run_dir.name / "perf.jsonl"
        perf.parent.mkdir(parents=True, exist_ok=True)
        with perf.open("a") as fh:
            fh.writelines(json.dumps({"rank": 0, **p}) + "\n" for p in self.perf)


def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs" / "heartbeat" / "synthetic"
    d.mkdir(parents=True)
    return d


def append(path: Path, *records: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def train(
    rank: Rank0, t: float, steps: int, dt: float, phases: dict[int, tuple[str, float]]
) -> float:
    """``steps`` steps of ``dt`` from ``t``; after iteration k, phase ``phases[k]`` for its
    duration. The time of the last step's end."""
    for _ in range(steps):
        t += dt
        rank.step(t)
        if rank.iteration in phases:
            name, duration = phases[rank.iteration]
            rank.set_phase(name, t)
            t += duration
            rank.set_phase("train", t)
    return t
