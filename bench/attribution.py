"""Culprits, hang classes and fail-slow ranks from the collectives, on unmodified DDP
and FSDP.

Three parts, each a real ``rankguard run`` of ``attribution_job.py`` (gloo, CPU ranks):

1. attribution: one rank (the last) stalls (60 s) in forward, backward (a hook), the
   optimizer, data loading or outside any collective, on 2 and 4 ranks (``--ranks``, e.g.
   ``8``; ``--sites``); the run is stopped 8 s after the first hang finding. Right when
   the stalled rank is the only rank named (``gpu_progress_timeout`` or a heartbeat
   timeout); the finding's ``hang`` kind is printed too. ``--model fsdp``: the job's
   model is sharded with torch's FSDP2 (``fully_shard``) instead of DDP; ``--model
   mesh``: a 2-D mesh (data-parallel x tensor-parallel groups of 2: the tensor-parallel
   all-reduce in forward, DDP over the data-parallel group); its ``forward`` stall stops
   a rank before its tensor-parallel all-reduce, ``backward`` before its data-parallel
   one. The hang's missing ranks and group are printed (``hang_missing``,
   ``hang_group``); a mesh case is right only when the hang names the culprit alone too;
   ``--sections nvrx``: its loop is in NVRx's client sections as a Megatron-style loop's
   (:data:`NVRX_FLAGS`: the section timeouts of the launch). ``--healthy``: first one run
   of that shape with no stall on each size, to its end: right when it got no finding.
2. fail-slow: ``--runs`` runs (40) with one rank's compute per step slowed 1.2x, 1.5x, 2x
   or 3x in turn, the extra time spent in its backward, forward or data loading, the
   rank, the site and the onset (5-10 s after the first step) drawn (``--seed``), then
   ``--clean`` runs (10) with no slow rank, on 4 ranks, straggler detection on
   (:data:`FAILSLOW_SETS`: a report every 3 s, 2 reports in a row, ``--in-a-row``);
   precision and recall
   of ``straggler_detected`` over the runs, recall per slowdown, onset -> finding (from
   the slow rank's own onset time), and the lowest relative score a healthy rank got.
3. cost: the sampler's look (``CollectiveSampler.sample``) in a 1-rank gloo job; a loop
   of tiny all-reduces and a loop of Python work holding the GIL (blocks of ~100 ms, a
   step's worth) with the sampler thread on vs off (the training thread does nothing for
   it; what remains is the thread's GIL share); and the all-reduce loop without the flight
   recorder (``TORCH_FR_BUFFER_SIZE`` unset): what torch's recording costs each collective
   on the training thread, 3 interpreters each way.

``--smoke``: one case of each part, short (its figures are not results): one job of 2
ranks carries the attribution and the fail-slow cases (rank 1 slowed 3x in backward from
1 s on, then stalled there at step 20; the run stopped 1 s after the first hang finding),
the cost part side by side with it. ``--smoke --part failslow``: a 6 s run of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE / "attribution_job.py"
FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
]
SITES = ("forward", "backward", "optimizer", "data", "outside")
HANG_TYPES = ("gpu_progress_timeout", "rank_process_heartbeat_timeout", "rank_section_timeout")


#: ``--sections nvrx``: the launch's NVRx section timeouts, as ft_launcher takes them (the
#: step section's is the progress timeout of :data:`FAST`)
NVRX_FLAGS = (
    "--ft-rank_section_timeouts=setup:60,step:4,checkpointing:30",
    "--ft-rank_out_of_section_timeout=30",
)


@dataclass(frozen=True, slots=True)
class Shape:
    """The job's model (``ddp``, ``fsdp``: torch's FSDP2, ``mesh``: 2-D, ``mesh3``: 3-D,
    ``pipeline``: one stage per rank), whether its loop is in NVRx's client sections
    (``none``, ``nvrx``), and a pipeline's point-to-point operations (``batch``,
    ``irecv``, ``send``)."""

    model: str = "ddp"
    sections: str = "none"
    p2p: str = "batch"

    def culprit(self, nproc: int) -> int:
        """The stalled rank: the last one; a pipeline's stage 1 (on 4 ranks a stage with
        a neighbour on each side)."""
        return 1 if self.model == "pipeline" else nproc - 1


def _cmd(
    run_id: str,
    log_dir: Path,
    nproc: int,
    sets: list[str],
    job: list[str],
    flags: list[str] | None = None,
) -> list[str]:
    cmd = [sys.executable, "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "--rdzv-id", run_id, "--log-dir", str(log_dir)]
    for item in FAST + _start_sets(nproc) + sets:
        cmd += ["--set", item]
    return [*cmd, *(flags or []), str(JOB), *job]


def _start_sets(nproc: int) -> list[str]:
    """Past 4 ranks, the initial heartbeat timeout 120 s (default 30 s): 8 ranks' start
    (an interpreter and torch's import each) took 55 s on 2 cores at load 37."""
    return ["heartbeat.initial_process_timeout_s=120"] if nproc > 4 else []


def _findings(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "findings.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _start_ns(run_dir: Path) -> int | None:
    starts = []
    for f in run_dir.glob("rank_*.jsonl"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            starts.append(int(json.loads(f.read_text().splitlines()[0])["wall_time_ns"]))
    return min(starts) if starts else None


def _launch(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _shape_args(shape: Shape) -> tuple[list[str], list[str]]:
    """The launcher's flags and the job's arguments of a model and sections shape."""
    flags = list(NVRX_FLAGS) if shape.sections == "nvrx" else []
    return flags, ["--model", shape.model, "--sections", shape.sections, "--p2p", shape.p2p]


def _deadline_s(nproc: int) -> float:
    """How long a case waits for its first hang finding: 100 s up to 4 ranks, 15 s
    more per rank past 4 (8 ranks start slowly on 2 cores)."""
    return 100.0 + 15.0 * max(0, nproc - 4)


def attribution_case(
    base: Path,
    nproc: int,
    site: str,
    culprit: int,
    settle_s: float = 8.0,
    slow: tuple[int, str, float, float] | None = None,
    shape: Shape | None = None,
) -> dict[str, Any]:
    """One stalled rank; the run is stopped ``settle_s`` after the first hang finding
    (any other rank named by then counts against it). ``slow`` (rank, site, slowdown,
    from s): the same job carries a fail-slow case too (straggler detection on; its
    result under ``"failslow"``). ``shape``: the model (DDP, FSDP, mesh) and NVRx sections
    (default: DDP, none)."""
    shape = shape or Shape()
    run_id = f"attr-{shape.model}-{shape.p2p}-{shape.sections}-{nproc}-{site}-{os.getpid()}"
    log_dir = base / run_id
    flags, shape_job = _shape_args(shape)
    job = ["--seconds", "120", "--stall-rank", str(culprit), "--stall-site", site]
    job += ["--stall-step", "20", *shape_job]
    sets: list[str] = []
    if slow is not None:
        sets, slow_job = _failslow_args(*slow)
        job += slow_job
    proc = _launch(_cmd(run_id, log_dir, nproc, sets, job, flags))
    run_dir = log_dir / "heartbeat" / run_id
    first: float | None = None
    deadline = time.monotonic() + _deadline_s(nproc)
    while time.monotonic() < deadline and proc.poll() is None:
        hangs = [f for f in _findings(run_dir) if f.get("finding_type") in HANG_TYPES]
        if hangs and first is None:
            first = time.monotonic()
        if first is not None and time.monotonic() - first > settle_s:
            break
        time.sleep(0.5)
    out_text = _stop(proc)
    hangs = [f for f in _findings(run_dir) if f.get("finding_type") in HANG_TYPES]
    named = sorted({int(f["rank"]) for f in hangs})
    hang = next((f["hang"] for f in hangs if isinstance(f.get("hang"), dict)), {})
    kind = hang.get("kind")
    missing = hang.get("missing_ranks")
    out: dict[str, Any] = {
        "model": shape.model,
        "p2p": shape.p2p if shape.model == "pipeline" else None,
        "sections": shape.sections,
        "nproc": nproc,
        "site": site,
        "culprit": culprit,
        "named": named,
        "right": named == [culprit]
        and (shape.model not in ("mesh", "mesh3") or missing == [culprit]),
        "hang_kind": kind,
        "hang_missing": missing,
        "hang_group": hang.get("group"),
        "hang_seq": hang.get("seq"),
    }
    if slow is not None:
        out["failslow"] = _failslow_result(run_dir, *slow, out_text)
    return out


def healthy_case(base: Path, nproc: int, shape: Shape, seconds: float = 30.0) -> dict[str, Any]:
    """A run of the shape with no stall, to its end: every finding it got (none is
    right)."""
    run_id = f"healthy-{shape.model}-{shape.p2p}-{shape.sections}-{nproc}-{os.getpid()}"
    log_dir = base / run_id
    flags, shape_job = _shape_args(shape)
    proc = _launch(_cmd(run_id, log_dir, nproc, [], ["--seconds", str(seconds), *shape_job], flags))
    try:
        out, _ = proc.communicate(timeout=seconds + _deadline_s(nproc))
    except subprocess.TimeoutExpired:
        out = _stop(proc)
    found = _findings(log_dir / "heartbeat" / run_id)
    return {
        "model": shape.model,
        "p2p": shape.p2p if shape.model == "pipeline" else None,
        "sections": shape.sections,
        "nproc": nproc,
        "site": None,
        "exit": proc.returncode,
        "done": "[attribution] done" in out,
        "findings": sorted({str(f.get("finding_type")) for f in found}),
        "right": not found and proc.returncode == 0,
    }


#: the fail-slow part's detector settings (reports every 3 s)
FAILSLOW_SETS = {
    "straggler.report_time_interval": "3",
    "straggler.consecutive_reports": "2",
    "straggler.gpu_relative_perf_threshold": "0.85",
    "straggler.gpu_individual_perf_threshold": "0.5",
}


def _failslow_args(
    slow_rank: int | None,
    site: str,
    slowdown: float,
    slow_from_s: float,
    in_a_row: int | None = None,
) -> tuple[list[str], list[str]]:
    """The ``--set`` items and the job's arguments of a fail-slow case (``in_a_row``:
    the reports in a row, else :data:`FAILSLOW_SETS`')."""
    settings = dict(FAILSLOW_SETS)
    if in_a_row is not None:
        settings["straggler.consecutive_reports"] = str(in_a_row)
    sets = ["straggler.enabled=true"] + [f"{k}={v}" for k, v in settings.items()]
    job = ["--site-ms", "20", "--slow-from-s", str(slow_from_s)]
    if slow_rank is not None:
        job += ["--slow-rank", str(slow_rank), "--slow-site", site, "--slowdown", str(slowdown)]
    return sets, job


_ONSET = re.compile(r"slowed \S+ from step \d+: compute ([\d.]+) ms per step, .* at unix ([\d.]+)")
_WORST = re.compile(r"rank (\d+) rel ([\d.]+)")


def _reports(out: str) -> list[dict[int, float]]:
    """Each straggler report's relative scores from the job's output (its ``worst:``
    line lists every rank of a 4-rank job); reports over one rank (the start) left out."""
    reports = []
    for line in out.splitlines():
        if line.lstrip().startswith("worst: rank"):
            scores = {int(r): float(v) for r, v in _WORST.findall(line)}
            if len(scores) > 1:
                reports.append(scores)
    return reports


def _failslow_result(
    run_dir: Path,
    slow_rank: int | None,
    site: str,
    slowdown: float,
    slow_from_s: float,
    out: str = "",
) -> dict[str, Any]:
    found = [f for f in _findings(run_dir) if f.get("finding_type") == "straggler_detected"]
    named = sorted({int(f["rank"]) for f in found})
    onset = _ONSET.search(out)
    start = _start_ns(run_dir)
    latency = None
    if found and slow_rank in named:
        at = min(int(f["detected_at_unix_ns"]) for f in found if f["rank"] == slow_rank) / 1e9
        if onset is not None:  # the slow rank's own onset time
            latency = round(at - float(onset.group(2)), 1)
        elif start is not None:
            latency = round(at - start / 1e9 - slow_from_s, 1)
    reports = _reports(out)
    healthy = [v for r in reports for rank, v in r.items() if rank != slow_rank]
    slow = [r[slow_rank] for r in reports if slow_rank in r]
    return {
        "slow_rank": slow_rank,
        "site": site,
        "slowdown": slowdown,
        "named": named,
        "onset_to_finding_s": latency,
        "slowdowns": [f.get("slowdown") for f in found],
        "base_compute_ms": float(onset.group(1)) if onset else None,
        # the relative scores seen: the healthy ranks' lowest, the slow rank's last
        "healthy_min_rel": min(healthy) if healthy else None,
        "slow_last_rel": slow[-1] if slow else None,
        "reports": reports,
    }


def named_at(reports: list[dict[int, float]], threshold: float, in_a_row: int) -> set[int]:
    """The ranks the relative rule would name from a run's reports at ``threshold``
    (``in_a_row`` reports below it): the detector's rule replayed on its own scores."""
    run: dict[int, int] = {}
    named = set()
    for report in reports:
        run = {r: run.get(r, 0) + 1 for r, v in report.items() if v < threshold}
        named |= {r for r, n in run.items() if n >= in_a_row}
    return named


def failslow_case(
    base: Path,
    k: int,
    slow_rank: int | None,
    site: str,
    slowdown: float,
    seconds: float,
    nproc: int = 4,
    slow_from_s: float = 5.0,
    in_a_row: int | None = None,
) -> dict[str, Any]:
    run_id = f"slow-{k}-{os.getpid()}"
    log_dir = base / run_id
    sets, slow_job = _failslow_args(slow_rank, site, slowdown, slow_from_s, in_a_row)
    job = ["--seconds", str(seconds), *slow_job]
    proc = _launch(_cmd(run_id, log_dir, nproc, sets, job))
    try:
        out, _ = proc.communicate(timeout=seconds + 90)
    except subprocess.TimeoutExpired:
        out = _stop(proc)
    run_dir = log_dir / "heartbeat" / run_id
    return _failslow_result(run_dir, slow_rank, site, slowdown, slow_from_s, out)


_COST_JOB = r"""
import os, sys, time, threading, statistics
import torch, torch.distributed as dist
from rankguard.ft.collectives import CollectiveSampler
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
t = torch.ones(4)
for _ in range(100):
    dist.all_reduce(t)
s = CollectiveSampler()
n = %d
looks = []
for _ in range(n):
    c0 = time.thread_time_ns()
    s.sample()
    looks.append((time.thread_time_ns() - c0) / 1000)

def loop(steps):  # the training thread's CPU per all-reduce, and its wall time
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(steps):
        dist.all_reduce(t)
    return (time.thread_time_ns() - c0) / steps / 1000, (time.perf_counter_ns() - t0) / steps / 1000

def python_ms():  # ~100 ms of work holding the GIL (a step's worth): wall ms
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        sum(range(1000))
    return (time.perf_counter_ns() - t0) / 1e6

steps, lows = %d, %d
cpu, off, on, py_off, py_on = [], [], [], [], []
for _ in range(lows):
    c, w = loop(steps)
    cpu.append(c); off.append(w)
    py_off += [python_ms() for _ in range(lows)]
    s2 = CollectiveSampler(); s2.start(); time.sleep(0.1)
    on.append(loop(steps)[1])
    py_on += [python_ms() for _ in range(lows)]
    s2.stop(); time.sleep(0.1)
print(statistics.median(looks), min(cpu), min(off), min(on), s2.samples, min(py_off), min(py_on))
dist.destroy_process_group()
"""


def _cost_job(looks: int, steps: int, recorder: bool, lows: int = 5) -> list[float]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    if recorder:  # what ``rankguard run`` sets
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    res = subprocess.run(
        [sys.executable, "-c", _COST_JOB % (port, looks, steps, lows)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return [float(v) for v in res.stdout.split()[-7:]]


def cost(looks: int, steps: int, rounds: int = 1, lows: int = 5) -> dict[str, float]:
    """The sampler's look (its thread's CPU time, median); the training thread's CPU per
    1-rank all-reduce; the wall time of an all-reduce loop and of Python work holding the
    GIL (~100 ms a block: a step's worth) with the sampler thread off and on; all with
    and without the flight recorder, ``rounds`` interpreters each way, alternating. Each
    loop's figure is its lowest of ``lows`` (5: 25 blocks; ``--smoke`` 1: 1 block): a
    loaded machine only adds to it."""
    with_fr, without = [], []
    for _ in range(rounds):
        with_fr.append(_cost_job(looks, steps, True, lows))
        without.append(_cost_job(looks, steps, False, lows))
    look, cpu, off, on, samples, py_off, py_on = (min(c) for c in zip(*with_fr, strict=True))
    no_cpu, no_off = (min(c[i] for c in without) for i in (1, 2))
    return {
        "sampler_look_cpu_us": round(look, 2),
        "all_reduce_cpu_us": round(cpu, 2),
        "all_reduce_cpu_us_without_recorder": round(no_cpu, 2),
        "all_reduce_us_sampler_off": round(off, 2),
        "all_reduce_us_sampler_on": round(on, 2),
        "all_reduce_us_without_recorder": round(no_off, 2),
        "sampler_looks_in_last_on_loop": int(samples),
        "python_block_ms_sampler_off": round(py_off, 3),
        "python_block_ms_sampler_on": round(py_on, 3),
    }


#: ``--smoke``'s fail-slow case, in the attribution job: rank 1 slowed 3x in backward
#: from 1 s on (its stall there at step 20 comes at least 1 s later: a step is 5 sites of
#: 20 ms at least)
SMOKE_SLOW = (1, "backward", 3.0, 1.0)


def attribution_part(
    base: Path,
    smoke: bool,
    say: Callable[[str], None],
    with_failslow: bool = False,
    ranks: tuple[int, ...] = (2, 4),
    shape: Shape | None = None,
    sites: tuple[str, ...] = SITES,
    healthy: bool = False,
) -> None:
    """``with_failslow`` (``--smoke``): the fail-slow part's case is carried by the
    attribution job (one job for both parts) and reported as that part's. ``healthy``:
    a run of the shape with no stall on each size first (no finding is right)."""
    shape = shape or Shape()
    if healthy and not smoke:
        clean = [healthy_case(base, n, shape) for n in ranks]
        for r in clean:
            say(json.dumps(r))
        say(f"healthy: no finding in {sum(r['right'] for r in clean)} of {len(clean)}")
    cases = [(2, "backward")] if smoke else [(n, s) for n in ranks for s in sites]
    right = 0
    slow_results = []
    for nproc, site in cases:
        slow = SMOKE_SLOW if with_failslow else None
        culprit = shape.culprit(nproc)
        r = attribution_case(base, nproc, site, culprit, 1.0 if smoke else 8.0, slow, shape)
        if "failslow" in r:
            slow_results.append(r.pop("failslow"))
        right += r["right"]
        say(json.dumps(r))
    say(
        f"attribution: culprit alone in {right} of {len(cases)} ({shape.model}"
        f"{', ' + shape.p2p if shape.model == 'pipeline' else ''}, sections {shape.sections})"
    )
    for r in slow_results:
        say(json.dumps(r))
        found = r["slow_rank"] in r["named"]
        fp = len(set(r["named"]) - {r["slow_rank"]})
        precision = int(found) / (int(found) + fp) if found or fp else 1.0
        say(
            f"fail-slow: 1 runs, precision {precision:.2f}, recall {float(found):.2f} "
            f"(tp {int(found)}, fp {fp}, fn {int(not found)}; in the attribution job)"
        )


FAILSLOW_SITES = ("backward", "forward", "data")
FAILSLOW_FACTORS = (1.2, 1.5, 2.0, 3.0)


def failslow_plan(
    rng: random.Random, runs: int, clean: int, nproc: int = 4
) -> list[tuple[int | None, str, float, float]]:
    """(slow rank, site, slowdown, onset s) per run: ``runs`` slowed runs, the factors in
    turn, a random rank, site and onset (5-10 s after the first step), then ``clean``
    runs with no slow rank."""
    plan: list[tuple[int | None, str, float, float]] = []
    for k in range(runs):
        factor = FAILSLOW_FACTORS[k % len(FAILSLOW_FACTORS)]
        site = rng.choice(FAILSLOW_SITES)
        plan.append((rng.randrange(nproc), site, factor, round(rng.uniform(5.0, 10.0), 1)))
    plan += [(None, "backward", 1.0, 5.0)] * clean
    return plan


def failslow_part(
    base: Path,
    smoke: bool,
    rng: random.Random,
    say: Callable[[str], None],
    runs: int = 40,
    clean: int = 10,
    in_a_row: int | None = None,
) -> None:
    if smoke:  # 2 ranks, slowed from 2 s of a 6 s run: the part runs, no figure
        plan: list[tuple[int | None, str, float, float]] = [(1, "backward", 3.0, 2.0)]
    else:
        plan = failslow_plan(rng, runs, clean)
    settings = dict(FAILSLOW_SETS)
    if in_a_row is not None:
        settings["straggler.consecutive_reports"] = str(in_a_row)
    say(
        f"fail-slow: {len(plan)} runs, detector "
        + " ".join(f"{k}={v}" for k, v in settings.items())
    )
    tp = fp = fn = 0
    latencies: list[float] = []
    by_factor: dict[float, list[int]] = {}
    healthy: list[float] = []
    results: list[dict[str, Any]] = []
    for k, (slow, site, x, onset) in enumerate(plan):
        if smoke:
            r = failslow_case(base, k, slow, site, x, 6.0, nproc=2, slow_from_s=onset)
        else:
            r = failslow_case(base, k, slow, site, x, 25.0, slow_from_s=onset, in_a_row=in_a_row)
        named = set(r["named"])
        hit = slow is not None and slow in named
        tp += int(hit)
        fn += int(slow is not None and not hit)
        fp += len(named - ({slow} if slow is not None else set()))
        if slow is not None:
            by_factor.setdefault(x, []).append(int(hit))
        if r["onset_to_finding_s"] is not None:
            latencies.append(r["onset_to_finding_s"])
        if r["healthy_min_rel"] is not None:
            healthy.append(r["healthy_min_rel"])
        results.append(r)
        say(json.dumps(r))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    say(
        f"fail-slow: {len(plan)} runs, precision {precision:.2f}, recall {recall:.2f} "
        f"(tp {tp}, fp {fp}, fn {fn})"
    )
    say(
        "  found per slowdown: "
        + ", ".join(f"{x}x {sum(v)}/{len(v)}" for x, v in sorted(by_factor.items()))
    )
    if latencies:
        say(
            f"  onset -> finding: median {statistics.median(latencies):.1f} s, "
            f"{min(latencies):.1f}-{max(latencies):.1f} s "
            f"(reports every {FAILSLOW_SETS['straggler.report_time_interval']} s)"
        )
    if healthy:
        say(f"  lowest relative score of a healthy rank: {min(healthy):.3f}")
    for line in replay(results):
        say(line)


def replay(results: list[dict[str, Any]]) -> list[str]:
    """The relative rule replayed on the runs' own report scores at other thresholds
    and 1 or 2 reports in a row: precision and recall of each."""
    lines = []
    for in_a_row in (1, 2):
        for threshold in (0.8, 0.85, 0.9):
            tp = fp = fn = 0
            for r in results:
                named = named_at(r["reports"], threshold, in_a_row)
                slow = r["slow_rank"]
                tp += int(slow in named)
                fn += int(slow is not None and slow not in named)
                fp += len(named - {slow})
            lines.append(
                f"  replayed at relative threshold {threshold}, {in_a_row} in a row: "
                f"precision {tp / (tp + fp) if tp + fp else 1.0:.2f}, recall "
                f"{tp / (tp + fn) if tp + fn else 1.0:.2f} (tp {tp}, fp {fp}, fn {fn})"
            )
    return lines


def cost_part(smoke: bool, say: Callable[[str], None]) -> None:
    say(
        json.dumps(
            cost(200 if smoke else 5000, 2000 if smoke else 20000, *((1, 1) if smoke else (3, 5)))
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one case of each part, short")
    p.add_argument("--part", choices=("attribution", "failslow", "cost", "all"), default="all")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=40, help="fail-slow: runs with a slow rank")
    p.add_argument("--clean", type=int, default=10, help="fail-slow: runs without")
    p.add_argument(
        "--in-a-row",
        type=int,
        default=None,
        help="fail-slow: reports in a row before a rank is named (default: FAILSLOW_SETS')",
    )
    p.add_argument("--ranks", default="2,4", help="attribution: the jobs' sizes, comma-separated")
    p.add_argument(
        "--model",
        choices=("ddp", "fsdp", "mesh", "mesh3", "pipeline"),
        default="ddp",
        help="attribution: DDP, FSDP2, a 2-D mesh (tensor-parallel groups of 2), a 3-D "
        "mesh (data- x context- x tensor-parallel, groups of 2), or a pipeline (a stage "
        "per rank)",
    )
    p.add_argument(
        "--p2p",
        choices=("batch", "irecv", "send"),
        default="batch",
        help="attribution, --model pipeline: batch_isend_irecv, isend/irecv + wait, or "
        "blocking send/recv",
    )
    p.add_argument(
        "--sections",
        choices=("none", "nvrx"),
        default="none",
        help="attribution: the loop in NVRx's client sections (nvrx) or not",
    )
    p.add_argument(
        "--sites",
        default=",".join(SITES),
        help="attribution: the stall sites, comma-separated (--model pipeline: also send, "
        "a stage skips sending a gradient back)",
    )
    p.add_argument(
        "--healthy",
        action="store_true",
        help="attribution: first a run with no stall on each size (no finding is right)",
    )
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="rankguard-attribution-"))
    print(f"logs under {base}", flush=True)
    parts: list[Callable[[Callable[[str], None]], None]] = []
    # --smoke: one job carries the attribution and the fail-slow parts
    both = args.smoke and args.part == "all"
    if args.part in ("attribution", "all"):
        ranks = tuple(int(n) for n in args.ranks.split(","))
        if args.model == "mesh" and any(n % 2 for n in ranks):
            p.error("--ranks: --model mesh takes even sizes (tensor-parallel groups of 2)")
        if args.model == "mesh3" and any(n % 4 for n in ranks):
            p.error("--ranks: --model mesh3 takes multiples of 4 (groups of 2 in two dims)")
        sites = tuple(args.sites.split(","))
        allowed = (*SITES, "send") if args.model == "pipeline" else SITES
        if set(sites) - set(allowed):
            p.error(f"--sites: each one of {', '.join(allowed)}")
        shape = Shape(args.model, args.sections, args.p2p)
        parts.append(
            lambda say: attribution_part(
                base, args.smoke, say, both, ranks, shape, sites, args.healthy
            )
        )
    if args.part == "failslow" or (args.part == "all" and not both):
        parts.append(
            lambda say: failslow_part(
                base, args.smoke, rng, say, args.runs, args.clean, args.in_a_row
            )
        )
    if args.part in ("cost", "all"):
        parts.append(lambda say: cost_part(args.smoke, say))
    if not args.smoke:  # one part after the other: no job shares the machine with another
        for part in parts:
            part(lambda line: print(line, flush=True))
        return 0
    # --smoke: the parts side by side (its figures are not results), printed in order
    said: list[list[str]] = [[] for _ in parts]
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        for f in [pool.submit(part, out.append) for part, out in zip(parts, said, strict=True)]:
            f.result()
    for out in said:
        for line in out:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
