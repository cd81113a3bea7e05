"""Builders and fakes shared by the tests: one place for what several test files need.

Heartbeat records, the monitor's configuration and rules, rank identities, fake clocks,
the paths of the fake binaries (``tests/fakes``) and a realistic run directory for the
report. Test modules import from here and never from one another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.rules import HeartbeatRules
from rankguard.rank.identity import RankIdentity
from rankguard.schema.findings import Finding
from rankguard.schema.layout import STATUS_FILE, heartbeat_file_name

#: The fake ``nvidia-smi``/``sbatch``/``srun``/``scontrol`` and the fake ``pynvml``.
FAKES = Path(__file__).resolve().parent / "fakes"
FAKE_BIN = FAKES / "bin"
FAKE_PYNVML = FAKES / "fake_nvml" / "pynvml.py"

RUN_ID = "run-1"
#: The publishers' wall clock at ``t = 0`` (nanoseconds).
BASE_NS = 1_700_000_000_000_000_000
#: Fields only a full publisher record carries; the rules' tests leave them out.
PUBLISHER_FIELDS = ("monotonic_ns", "last_progress_monotonic_ns", "progress_source")


# -- heartbeat records --------------------------------------------------------------------


def heartbeat_record(
    rank: int,
    seq: int = 1,
    pid: int | None = None,
    *,
    run_id: str = RUN_ID,
    event: str = "heartbeat",
    t: float = 0.0,
    seq_step_ns: int = 0,
    pid_base: int = 1000,
    hostname: str | None = None,
    node_rank: int = 0,
    local_rank: int | None = None,
    ranks_per_node: int | None = None,
    world_size: int = 2,
    progress_seq: int | None = None,
    progress_lead: int | None = None,
    since: float = 0.5,
    phase: str = "train",
    phase_elapsed: float | None = None,
    checkpoint_active: bool = False,
    gpu_token: str | None = "GPU-{rank}",
    publisher_fields: bool = False,
    exit: dict[str, Any] | None = None,
    perf: dict[str, Any] | None = None,
    omit: Collection[str] = (),
    **fields: Any,
) -> dict[str, Any]:
    """One heartbeat record as a rank's publisher writes it.

    Derived defaults: ``pid`` is ``pid_base + rank``; ``hostname`` is ``host<rank>``;
    ``local_rank`` is ``rank`` (``rank % ranks_per_node`` when given); the wall clock is
    ``BASE_NS + t`` seconds plus ``seq * seq_step_ns`` (the same step drives
    ``monotonic_ns``); ``progress_seq`` is 1 (``seq + progress_lead`` when given).
    ``gpu_token`` is formatted with the rank (``None``: no GPU assigned); the GPU's
    ordinal is the local rank and its uuid the token when that is a ``GPU-`` uuid.
    ``publisher_fields`` adds :data:`PUBLISHER_FIELDS`; keys in ``omit`` are left out;
    ``fields`` are set last, as given.
    """
    if local_rank is None:
        local_rank = rank % ranks_per_node if ranks_per_node else rank
    if progress_seq is None:
        progress_seq = 1 if progress_lead is None else seq + progress_lead
    gpu: dict[str, Any] | None = None
    if gpu_token is not None:
        token = gpu_token.format(rank=rank)
        gpu = {
            "ordinal": local_rank,
            "token": token,
            "uuid": token if token.startswith("GPU-") else None,
        }
    r: dict[str, Any] = {
        "schema_version": 1,
        "event": event,
        "run_id": run_id,
        "seq": seq,
        "wall_time_ns": BASE_NS + int(t * 1e9) + seq * seq_step_ns,
        "hostname": hostname or f"host{rank}",
        "node_rank": node_rank,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "pid": pid_base + rank if pid is None else pid,
        "gpu": gpu,
        "progress_seq": progress_seq,
        "iteration": progress_seq,
        "phase": phase,
        "checkpoint_active": checkpoint_active,
        "checkpoint_id": "c1" if checkpoint_active else None,
        "since_progress_s": since,
    }
    if publisher_fields:
        r["monotonic_ns"] = seq * seq_step_ns
        r["last_progress_monotonic_ns"] = None
        r["progress_source"] = "api"
    if phase_elapsed is not None:
        r["phase_elapsed_s"] = phase_elapsed
    if exit is not None:
        r["exit"] = exit
    if perf is not None:
        r["perf"] = perf
    for key in omit:
        r.pop(key, None)
    r.update(fields)
    return r


def publisher_record(rank: int, *args: Any, **kw: Any) -> dict[str, Any]:
    """A record as a GPU rank's publisher writes it (every field it sets), on host
    ``node-a``, pid ``4000 + rank``, two ranks a node, one second a seq."""
    defaults: dict[str, Any] = {
        "seq_step_ns": 1_000_000_000,
        "hostname": "node-a",
        "pid_base": 4000,
        "ranks_per_node": 2,
        "since": 0.2,
        "gpu_token": "{rank}",
        "publisher_fields": True,
    }
    return heartbeat_record(rank, *args, **{**defaults, **kw})


def write_heartbeats(run_dir: Path, *records: dict[str, Any], raw_tail: str = "") -> None:
    """Append each record to its rank's heartbeat file; ``raw_tail`` goes after the last."""
    for r in records:
        path = run_dir / heartbeat_file_name(r["rank"], r["pid"])
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(r) + "\n")
    if raw_tail:
        r = records[-1]
        with open(run_dir / heartbeat_file_name(r["rank"], r["pid"]), "a", encoding="utf-8") as fh:
            fh.write(raw_tail)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, blank lines skipped; none if it does not exist."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_status(run_dir: Path) -> dict[str, Any]:
    """The monitor's status.json of a run directory."""
    return json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every line of a heartbeat file, each one JSON object (a blank line is an error)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rank_identity(**overrides: Any) -> RankIdentity:
    """Rank 0 of a one-rank run on ``host``, this process's pid, no GPU."""
    fields: dict[str, Any] = {
        "run_id": RUN_ID,
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "node_rank": 0,
        "hostname": "host",
        "pid": os.getpid(),
        "gpu": None,
    }
    fields.update(overrides)
    return RankIdentity(**fields)


# -- the monitor's configuration and rules -------------------------------------------------


def heartbeat_config(**overrides: Any) -> HeartbeatConfig:
    """Timeouts: process 10 s, initial process 10 s, progress 20 s, initial progress 60 s,
    checkpoint 100 s; heartbeats every second."""
    fields: dict[str, Any] = {
        "publish_interval_s": 1.0,
        "initial_process_timeout_s": 10.0,
        "process_timeout_s": 10.0,
        "initial_progress_timeout_s": 60.0,
        "progress_timeout_s": 20.0,
        "checkpoint_timeout_s": 100.0,
    }
    fields.update(overrides)
    return HeartbeatConfig(**fields)


def heartbeat_rules(
    world: int | None = 2, started_at: float = 0.0, *, run_id: str = RUN_ID, **kw: Any
) -> HeartbeatRules:
    """Rules over :func:`heartbeat_config`; ``kw`` goes to :class:`HeartbeatRules`."""
    return HeartbeatRules(
        heartbeat_config(), run_id, expected_world_size=world, started_at=started_at, **kw
    )


def types_of(findings: list[Finding]) -> list[tuple[int, str]]:
    return [(f.rank, f.finding_type.value) for f in findings]


class Feed:
    """Publishes a heartbeat for each rank every second, like the real publisher.

    ``record`` builds each record (``record(rank, seq, t=now, **kw)``).
    """

    def __init__(
        self,
        rules: HeartbeatRules,
        record: Callable[..., dict[str, Any]] = heartbeat_record,
    ) -> None:
        self.rules = rules
        self.record = record
        self.seq: dict[int, int] = {}

    def beat(self, rank: int, now: float, **kw: Any) -> None:
        seq = self.seq.get(rank, -1) + 1
        self.seq[rank] = seq
        assert self.rules.ingest(self.record(rank, seq, t=now, **kw), now)


# -- fakes ----------------------------------------------------------------------------------


class FakeClock:
    """A monitor clock in seconds; tests set ``t``."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeNsClock:
    """A monotonic clock in nanoseconds, advanced by hand."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.ns = start_ns

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)

    def advance_ms(self, ms: float) -> None:
        self.ns += int(ms * 1_000_000)


def load_fake_pynvml() -> ModuleType:
    """A fresh copy of the fake ``pynvml`` module (its state is per copy)."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_PYNVML)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proc_state(pid: int) -> str:
    """The one-letter state of a process from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()


# -- a run directory for the report ---------------------------------------------------------

REPORT_RUN_ID = "20241129-105400-ab12cd"
REPORT_T0 = datetime(2024, 11, 29, 10, 54, 0, tzinfo=timezone.utc)
EVIL_MESSAGE = "rank 1 <b>stalled</b> & nobody noticed"


def _report_iso(seconds: float) -> str:
    return (REPORT_T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def report_finding(
    rank: int | None, ftype: str, reason: str, message: str, at: float
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": REPORT_RUN_ID,
        "finding_type": ftype,
        "reason": reason,
        "rank": rank,
        "pid": None if rank is None else 4100 + rank,
        "hostname": "node-a",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "stalled",
        "phase": "train",
        "iteration": 30,
        "checkpoint_active": False,
        "timeout_s": 60.0,
        "observed_s": 61.4,
        "gpu": None,
        "gpu_health": None,
        "exit": None,
        "message": message,
        "detected_wall_time": _report_iso(at),
    }


REPORT_FINDINGS = [
    report_finding(
        1, "gpu_progress_timeout", "rank_alive_but_gpu_progress_not_advancing", EVIL_MESSAGE, 30.0
    ),
    report_finding(
        None, "gpu_hardware_health_warning", "gpu_warning", "GPU 3 thermal slowdown", 42.5
    ),
]


def _report_perf_entry(it: int, ms: float) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": REPORT_RUN_ID,
        "rank": 0,
        "iteration": it,
        "step": it,
        "timestamp": _report_iso(5 + it * ms / 1000),
        "step_time_ms": ms,
        "gpu_step_time_ms": ms * 0.98,
        "samples_per_sec": round(256_000 / ms, 2),
        "tokens_per_sec": round(256_000 * 2048 / ms, 2),
        "TFLOPS_per_GPU": round(400 * 100 / ms, 4),
        "TFLOPS_total": round(8 * 400 * 100 / ms, 4),
        "MFU": round(400 * 100 / ms / 989, 4),
        "memory_GB": 61.2,
        "peak_memory_GB": 63.9,
        "memory_kind": "cuda_allocated",
        "data_loading_share": 0.01,
        "steps_in_window": 10,
    }


def _report_summary(entries: list[dict[str, Any]], world: int) -> dict[str, Any]:
    return {
        "session_info": {
            "start_time": _report_iso(1),
            "end_time": _report_iso(60),
            "total_iterations": entries[-1]["iteration"],
            "run_id": REPORT_RUN_ID,
            "world_size": world,
            "device": "NVIDIA H100 80GB HBM3",
            "dtype": "bf16",
            "peak_tflops_per_gpu": 989.0,
            "peak_source": "table:H100 SXM",
            "flops_per_step": 3.2e15,
            "flops_source": "analytic: Megatron GPT formula",
            "batch_source": "detected: GPT input 8 x 2048 x 4 micro-batches x 8 replicas",
            "warmup_iterations": 3,
            "steps_in_statistics": 77,
            "log_interval": 10,
        },
        "final_statistics": {
            "avg_tflops_per_gpu": 401.2,
            "avg_tflops_total": 3209.6,
            "avg_mfu": 0.4057,
            "avg_step_time_ms": 99.7,
            "median_step_time_ms": 99.1,
            "min_step_time_ms": 97.0,
            "max_step_time_ms": 181.0,
            "avg_samples_per_sec": 2567.7,
            "avg_tokens_per_sec": 5258650.0,
            "peak_memory_gb": 63.9,
        },
        "iteration_logs": entries,
    }


def _report_rank_row(rank: int, slow: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "pid": 4100 + rank,
        "hostname": "node-a",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "stalled" if rank == slow else "progressing",
        "iteration": 80,
        "progress_seq": 80,
        "phase": "train",
        "checkpoint_active": False,
        "heartbeat_age_s": 0.4,
        "progress_age_s": 61.4 if rank == slow else 0.2,
        "gpu": {"ordinal": rank, "token": str(rank), "uuid": None},
        "gpu_health": {"index": rank, "health": "ok", "problems": []},
        "exit": None,
        "active_findings": ["gpu_progress_timeout"] if rank == slow else [],
        "blocked_by": [] if rank == slow else [slow],
    }


def _report_gpu(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:04d}",
        "name": "NVIDIA H100 80GB HBM3",
        "temperature_c": 61 + index,
        "utilization_gpu_pct": 97,
        "memory_used_mib": 62000,
        "memory_total_mib": 81559,
        "power_draw_w": 650.5,
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_volatile": 0,
        "thermal_slowdown": index == 3,
        "health": "warning" if index == 3 else "ok",
        "problems": ["thermal_slowdown"] if index == 3 else [],
    }


def write_report_run(
    log_dir: Path,
    *,
    run_id: str = REPORT_RUN_ID,
    world: int = 4,
    windows: int = 8,
    slow: int = 1,
    heartbeat: bool = True,
    perf: bool = True,
    findings: list[dict[str, Any]] | None = None,
) -> Path:
    """Write a realistic run under ``log_dir``; returns its heartbeat run directory."""
    hb, pm = log_dir / "heartbeat" / run_id, log_dir / "perf_monitor" / run_id
    iters = [1] + [10 * i for i in range(1, windows)]
    if heartbeat:
        hb.mkdir(parents=True)
        status = {
            "schema_version": 1,
            "run_id": run_id,
            "updated_wall_time": _report_iso(60),
            "state": "degraded",
            "monitor": {"hostname": "node-a", "pid": 4000, "expected_world_size": world},
            "summary": {"ranks_expected": world, "findings_total": 2, "findings_active": 1},
            "ranks": [_report_rank_row(r, slow) for r in range(world)],
            "gpu_health": {"0": {"status": "warning", "source": "nvml", "gpus": 4}},
            "recent_findings": findings if findings is not None else REPORT_FINDINGS,
        }
        (hb / "status.json").write_text(json.dumps(status))
        write_jsonl(hb / "findings.jsonl", findings if findings is not None else REPORT_FINDINGS)
        lines = []
        for it in iters:
            by_rank = {
                str(r): 100.0 + r + (80.0 if r == slow and it == 30 else 0) for r in range(world)
            }
            vals = sorted(by_rank.values())
            lines.append(
                {
                    "schema_version": 1,
                    "run_id": run_id,
                    "step": it,
                    "iteration": it,
                    "n_ranks": world,
                    "world_size": world,
                    "step_time_ms": {
                        "min": vals[0],
                        "median": vals[len(vals) // 2],
                        "max": vals[-1],
                    },
                    "slowest_rank": max(by_rank, key=by_rank.__getitem__),
                    "fastest_rank": 0,
                    "by_rank": by_rank,
                }
            )
        write_jsonl(hb / "perf_ranks.jsonl", lines)
        for r in range(min(world, 8)):
            base = {"run_id": run_id, "rank": r, "pid": 4100 + r, "hostname": "node-a"}
            write_jsonl(
                hb / f"rank_{r}_pid_{4100 + r}.heartbeat.jsonl",
                [
                    {
                        **base,
                        "event": "process_start",
                        "seq": 0,
                        "wall_time_ns": int((REPORT_T0.timestamp() + 1) * 1e9),
                    },
                    {
                        **base,
                        "event": "heartbeat",
                        "seq": 1,
                        "wall_time_ns": int((REPORT_T0.timestamp() + 59) * 1e9),
                    },
                ],
            )
        snap = {
            "schema_version": 1,
            "source": "nvml",
            "status": "warning",
            "error": None,
            "hostname": "node-a",
            "collected_wall_time": _report_iso(40),
            "gpus": [_report_gpu(i) for i in range(4)],
            "node_rank": 0,
        }
        (hb / "gpu_health_node_0.json").write_text(json.dumps(snap))
    if perf:
        entries = [_report_perf_entry(it, 180.0 if it == 30 else 100.0 - it / 100) for it in iters]
        write_jsonl(pm / "perf.jsonl", entries)
        (pm / "perf_summary_20241129_105500.json").write_text(
            json.dumps(_report_summary(entries, world))
        )
    return hb if heartbeat else pm


# -- child processes and an in-memory store ------------------------------------------------

#: A child that says "ready" and sleeps: a process to signal (or to refuse to).
PLAIN_CHILD = 'import time\nprint("ready", flush=True)\ntime.sleep(60)\n'


def alive(proc: subprocess.Popen[str], wait_s: float = 0.3) -> bool:
    """Still running ``wait_s`` seconds from now."""
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return True
    return False


class Children:
    """Python children started with ``-c CODE ARGS`` that print "ready" once set up;
    :meth:`close` kills and reaps every one (the ``children`` fixture calls it)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, code: str = PLAIN_CHILD, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


RESOLVER_TIMEOUT_S = 5.0
"""glibc's wait for one DNS answer (``options timeout:`` in ``/etc/resolv.conf``; 5 s by
default), and how often it asks (``attempts:``, 2 by default)."""
RESOLVER_ATTEMPTS = 2
STORE_CONNECT_TIMEOUT = timedelta(seconds=30)
"""The timeout of a test's ``TCPStore`` on 127.0.0.1, host or client (a host connects to
itself too). Before it connects, torch's client names the server's address with
``getnameinfo``: 127.0.0.1 resolved for IPv6 is ``::ffff:127.0.0.1``, which no hosts file
lists, so that is a reverse DNS query. Where the resolver loses one, glibc waits its
timeout before asking again: a 5 s timeout fails on one lost answer, whatever the load.
30 s (``rankguard run``'s own store clients' timeout) outlasts every attempt."""


def resolver_settings(path: Path = Path("/etc/resolv.conf")) -> tuple[float, int]:
    """(timeout s, attempts) of glibc's resolver here: ``options timeout:N attempts:M``
    (glibc caps them at 30 and 5), :data:`RESOLVER_TIMEOUT_S` and
    :data:`RESOLVER_ATTEMPTS` where unset; ``RES_OPTIONS`` overrides the file."""
    timeout, attempts = RESOLVER_TIMEOUT_S, RESOLVER_ATTEMPTS
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    words = [w for line in text.splitlines() if line.startswith("options") for w in line.split()]
    for word in [*words, *os.environ.get("RES_OPTIONS", "").split()]:
        key, _, value = word.partition(":")
        if key == "timeout" and value.isdigit():
            timeout = float(min(int(value), 30))
        elif key == "attempts" and value.isdigit():
            attempts = min(int(value), 5)
    return timeout, attempts


class DictStore:
    """The few TCPStore calls the relay makes, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value

    def get(self, key: str) -> Any:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


# -- GPU health: a GPU row of the fake nvidia-smi (tests/fakes/bin) ----------------------

# an H100 with 2 uncorrected ECC errors: unhealthy
SICK_GPU = {
    "index": "0",
    "uuid": "GPU-11111111-2222-3333-4444-555555555555",
    "pci.bus_id": "00000000:18:00.0",
    "name": "NVIDIA H100 80GB HBM3",
    "driver_version": "550.54.15",
    "temperature.gpu": "41",
    "utilization.gpu": "0",
    "memory.used": "1",
    "memory.total": "81559",
    "power.draw": "70.1",
    "power.limit": "700.00",
    "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
    "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
    "ecc.errors.corrected.volatile.total": "0",
    "ecc.errors.uncorrected.volatile.total": "2",
    "retired_pages.pending": "No",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
}


# -- ranks as processes on gloo ----------------------------------------------------------


def _rank_main(
    rank: int,
    world: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    store: Path,
    pg_timeout_s: float,
    timeout_s: float,
    queue: Any,
    received: Any,
) -> None:
    """One rank of :func:`run_ranks`, in its own process: join the group, run ``fn``,
    report, stay until the parent has the result."""
    import datetime as _dt
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=_dt.timedelta(seconds=pg_timeout_s),
        )
        result = fn(rank, world, *args)
        queue.put((rank, True, result))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        received.wait(timeout_s)


def rank_context() -> Any:
    """The start method of :func:`run_ranks`'s processes: ``forkserver``, whose server
    is a fresh interpreter (torch imported once, no threads, no OpenMP pool) that forks
    each rank. A plain fork copied the test process as an earlier test had left it: a
    thread holding a lock or a GNU OpenMP pool made the child hang in its first lock or
    parallel region (two rank tests ran to their 90 and 100 s timeouts when the order
    changed). ``spawn`` would be as safe, at an interpreter and a torch import per rank."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    # the server imports these once; each rank forked from it has them (what the rank
    # tests use: without the checkpoint modules each rank imported them itself; every
    # torch.optim optimizer imports torch._dynamo at its construction, 0.65 s of CPU per
    # rank process, as the launcher's ``--preload torch`` knows)
    ctx.set_forkserver_preload(
        [
            "torch",
            "torch._dynamo",
            "torch.distributed",
            "torch.distributed.checkpoint",
            "torch.nn.parallel",
            "rankguard.checkpoint",
            "tests.factories",
        ]
    )
    return ctx


def run_ranks(
    world: int,
    fn: Callable[..., Any],
    *args: Any,
    store_dir: Path,
    timeout_s: float = 60.0,
    pg_timeout_s: float = 20.0,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` processes joined by a gloo process
    group (a FileStore in ``store_dir``, short timeouts); each rank's return value, in
    rank order. A rank that raises fails the call with its traceback; one that dies or
    outlives ``timeout_s`` too. ``fn`` and ``args`` are pickled (a module-level
    function); the ranks start from a fresh forkserver (:func:`rank_context`), so what
    earlier tests left in this process (threads, an OpenMP pool) cannot hang them."""
    ctx = rank_context()
    queue = ctx.Queue()
    # a rank stays until its result was received: tensors travel as shared memory whose
    # file descriptors the sending process must still hold when they are rebuilt
    received = ctx.Event()
    store = store_dir / f"store_{os.getpid()}_{id(fn)}_{world}"
    store.unlink(missing_ok=True)
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, world, fn, args, store, pg_timeout_s, timeout_s, queue, received),
            daemon=True,
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    reported: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(reported) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ranks not done after {timeout_s} s: {results.keys()}")
            try:
                rank, ok, value = queue.get(timeout=min(remaining, 0.2))
            except Exception:  # queue.Empty: a rank may have died without a word
                # every rank that did not report has exited (the others wait for the
                # parent to take their results): no word will come
                silent = [r for r in range(world) if r not in reported]
                if all(procs[r].exitcode is not None for r in silent):
                    codes = [procs[r].exitcode for r in silent]
                    raise RuntimeError(
                        f"ranks died: exit codes {codes}" + "".join(f"\n{e}" for e in errors)
                    ) from None
                continue
            reported.add(rank)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        received.set()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]


def _module_rank(module: str, argv: list[str], env: dict[str, str], out: str) -> None:
    """One rank of :func:`start_module_ranks`: ``python -m module argv`` as ``__main__``
    in this forked process, with the rank's environment, its standard output and error
    to ``out`` (the process exits with the module's code)."""
    import runpy

    os.environ.clear()
    os.environ.update(env)
    target = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def start_module_ranks(module: str, argv: list[str], world: int, out_dir: Path) -> list[Any]:
    """``python -m module argv`` on ``world`` ranks as torch's launchers start them
    (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a store
    hosted by rank 0), without a launcher: each rank a process forked from
    :func:`rank_context`'s forkserver (no interpreter's start or torch's import of its
    own), its output in ``out_dir/rank_<r>.out``. The processes, started; the caller
    joins them (their ``exitcode``) and kills those left."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("RANKGUARD_", "TORCHELASTIC_", "PET_"))
    }
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    ctx = rank_context()
    procs = [
        ctx.Process(
            target=_module_rank,
            args=(
                module,
                argv,
                {**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                str(out_dir / f"rank_{r}.out"),
            ),
            daemon=True,
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    return procs


# ---- rerun state machine --------------------------------------------------------------


class RerunExit(Exception):
    """What a test's ``exit`` raises instead of leaving the process (code in ``.code``)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


def raising_exit(code: int) -> None:
    raise RerunExit(code)


class TorchSaver:
    """A real, small checkpoint: ``torch.save`` of the given state callable, atomically,
    as ``step_<n>.pt`` (only ``rank`` 0 writes); ``saved`` lists the steps."""

    def __init__(self, directory: Path, state: Callable[[], dict[str, Any]], rank: int = 0):
        self.directory = Path(directory)
        self.state = state
        self.rank = rank
        self.saved: list[int] = []
        self.waits = 0

    def save(self, step: int) -> None:
        import torch

        self.saved.append(step)
        if self.rank != 0:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"step_{step}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({**self.state(), "step": step}, tmp)
        os.replace(tmp, path)

    def wait(self) -> None:
        self.waits += 1

    def load_latest(self) -> dict[str, Any] | None:
        import torch

        steps = sorted(int(p.stem[5:]) for p in self.directory.glob("step_*.pt"))
        if not steps:
            return None
        state: dict[str, Any] = torch.load(
            self.directory / f"step_{steps[-1]}.pt", weights_only=True
        )
        return state


# ---- Optional packages -----------------------------------------------------------------


def skip_unless_installed(*names: str) -> None:
    """Skip the calling test unless every package in ``names`` is installed. Unlike
    ``pytest.importorskip``, nothing is imported here: a test that only starts a job
    whose script imports Lightning (seconds of CPU) need not import it itself."""
    import pytest

    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


# ---- Lightning's entry point ---------------------------------------------------------

LIGHTNING_FACTORY = "rankguard.integrations.lightning:callbacks_factory"


def lightning_entry_point_installed() -> bool:
    """Is rankguard's ``lightning.pytorch.callbacks_factory`` entry point registered by
    the installed package (an install from this tree's pyproject.toml)? Tests add a
    stand-in distribution only when it is not, so the callback is never added twice."""
    from importlib.metadata import entry_points

    group = entry_points(group="lightning.pytorch.callbacks_factory")
    return any(ep.value == LIGHTNING_FACTORY for ep in group)
