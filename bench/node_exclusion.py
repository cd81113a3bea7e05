"""Bad-node exclusion: a node whose GPU reports an XID error is excluded before its
ranks start, and the others train without it.

What: three ``rankguard run`` agents on 127.0.0.1 (``--nnodes 2:3``, one CPU rank each,
gloo, the demo ``rankguard.demo.train``), ``fault_tolerance.exclude_bad_nodes=true``.
Each agent gets the fake NVML of the test suite (``tests/fakes/fake_nvml``, through its
``PYTHONPATH``): agents 0 and 1 a healthy GPU, agent 2 a GPU with XID 79 (fallen off the
bus) pending. Times, from the moment the three agents are started (``time.time()`` just
before the first ``Popen``), of lines stamped on arrival by a reader thread per agent:

- exclusion decision: agent 2's ``excluded:`` line (its check before the first round),
  and the part of it after the launcher's first line (its start-up, torch imported);
- group formed: the first ``rank(s) on node`` line of agents 0 and 1 (their round);
- first step: the first ``[demo] step`` line (rank 0, ``--log-every 1``).

Baseline, same run: agents 0 and 1 alone (same ``--nnodes 2:3``, no third agent): what
the remaining group costs without any exclusion. The round of two forms after torch
elastic's ``last_call_timeout`` in both cases (``--last-call``, 2 s here); a run is
correct when agent 2 exits 15, the others 0, and agent 2 started no rank.

Run: ``python bench/node_exclusion.py [--repeats 3]`` (about 30-60 s per run here);
``--smoke``: one run with the bad node, 3 steps, no baseline (it proves the script
runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE_NVML = ROOT / "tests" / "fakes" / "fake_nvml"

FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
    "fault_tolerance.exclude_bad_nodes=true",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu(index: int, xids: list[int]) -> dict[str, object]:
    """One GPU as the fake NVML reports it (its healthy defaults, plus XID events)."""
    return {"index": index, "uuid": f"GPU-{index:08d}-bench", "xid_events": xids}


def nvml_env(tmp: Path, name: str, xids: list[int]) -> dict[str, str]:
    config = tmp / f"{name}.nvml.json"
    defaults = {
        "pci_bus_id": "00000000:18:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "temperature": 35,
        "utilization": 0,
        "memory_used": 0,
        "memory_total": 81559 * 1024 * 1024,
        "power_usage_mw": 70000,
        "power_limit_mw": 700000,
        "clocks_reasons": 0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": 0,
        "remapped_rows": [0, 0, 0, 0],
        "recovery_action": 0,
        "not_supported": [],
        "errors": {},
        "handle_error": None,
    }
    config.write_text(
        json.dumps({"driver_version": "550.54.15", "gpus": [{**defaults, **gpu(0, xids)}]}),
        encoding="utf-8",
    )
    path = os.pathsep.join(
        p for p in (str(FAKE_NVML), str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
    )
    return {"PYTHONPATH": path, "FAKE_NVML_CONFIG": str(config)}


class Agent:
    """One ``rankguard run`` whose output lines are stamped as they arrive."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            # one OpenMP thread per rank unless set: the simulated nodes share the cores
            env={"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, needle: str) -> float | None:
        return next((t for t, line in self.lines if needle in line), None)

    def wait(self, timeout_s: float) -> int | None:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        self.reader.join(5)
        return code


def one_run(
    tmp: Path,
    *,
    bad_node: bool,
    steps: int,
    last_call: float,
    timeout_s: float,
    healthy: int = 2,
) -> dict:
    """``healthy`` agents (--nnodes healthy:healthy+1), then the bad one."""
    port, run_id = free_port(), f"excl-{os.getpid()}-{time.monotonic_ns()}"
    bad = healthy  # the bad node's agent
    agents_xids: dict[int, list[int]] = {a: [] for a in range(healthy)}
    if bad_node:
        agents_xids[bad] = [79]
    agents = {}
    t0 = time.time()
    for a, xids in agents_xids.items():
        cmd = [
            sys.executable,
            "-m",
            "rankguard.cli.main",
            "run",
            "--nnodes",
            f"{healthy}:{healthy + 1}",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            f"last_call_timeout={last_call:g},join_timeout=60",
            "--log-dir",
            str(tmp / f"agent{a}"),
        ]
        for item in FAST:
            cmd += ["--set", item]
        cmd += ["-m", "rankguard.demo.train", "--steps", str(steps), "--log-every", "1"]
        cmd += ["--step-sleep", "0.05"]
        agents[a] = Agent(cmd, nvml_env(tmp, f"agent{a}", xids))
    codes = {a: agent.wait(timeout_s) for a, agent in agents.items()}

    def since(t: float | None) -> float | None:
        return None if t is None else t - t0

    good = [agents[a] for a in range(healthy)]
    formed = [t for t in (a.first("rank(s) on node") for a in good) if t is not None]
    stepped = [t for t in (a.first("[demo] step") for a in good) if t is not None]
    decided = agents[bad].first("excluded:") if bad_node else None
    started = agents[bad].first("[rankguard]") if bad_node else None  # its first line
    out = {
        "codes": codes,
        "decided_s": since(decided),
        "check_s": decided - started if decided is not None and started is not None else None,
        "formed_s": since(min(formed)) if formed else None,
        "first_step_s": since(min(stepped)) if stepped else None,
    }
    ranks_started = bad_node and any((tmp / f"agent{bad}").rglob("rank_*_pid_*.heartbeat.jsonl"))
    expected = {a: 0 for a in range(healthy)} | ({bad: 15} if bad_node else {})
    out["ok"] = codes == expected and not ranks_started and out["first_step_s"] is not None
    if not out["ok"]:
        for a, agent in agents.items():
            tail = "\n".join(line for _, line in agent.lines[-15:])
            print(f"  agent {a} exit {codes[a]}:\n{tail}", file=sys.stderr)
    return out


def fmt(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    return f"{statistics.median(got):.2f} s ({min(got):.2f}-{max(got):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--last-call", type=float, default=2.0, help="last_call_timeout (s)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per run")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="one run with the bad node, 1 healthy agent (--nnodes 1:2), 2 steps, "
        "last_call_timeout 1 s, no baseline",
    )
    args = p.parse_args()
    healthy = 2
    if args.smoke:
        args.repeats, args.steps, args.last_call, healthy = 1, 2, 1.0, 1
    agents = f"{healthy} healthy agent" + ("s" if healthy != 1 else "")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPU(s), load "
        f"{os.getloadavg()[0]:.1f}; {healthy + 1} agents --nnodes {healthy}:{healthy + 1}, "
        f"agent {healthy}'s GPU: XID 79; "
        f"last_call_timeout {args.last_call:g} s; {args.repeats} run(s) each"
    )
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(args.repeats):
        for bad in (True,) if args.smoke else (True, False):
            tmp = Path(tempfile.mkdtemp(prefix="rg-excl-"))
            try:
                r = one_run(
                    tmp,
                    bad_node=bad,
                    steps=args.steps,
                    last_call=args.last_call,
                    timeout_s=args.timeout,
                    healthy=healthy,
                )
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            runs[bad].append(r)
            label = "with the bad node" if bad else f"{agents} alone"
            print(
                f"  run {i + 1} {label}: exit {r['codes']}, decision "
                f"{r['decided_s'] and round(r['decided_s'], 2)} s, group formed "
                f"{r['formed_s'] and round(r['formed_s'], 2)} s, first step "
                f"{r['first_step_s'] and round(r['first_step_s'], 2)} s, ok {r['ok']}"
            )
    bad, alone = runs[True], runs[False]
    print(
        f"launch -> exclusion decision: {fmt([r['decided_s'] for r in bad])} (of which the "
        f"launcher's first line -> decision: {fmt([r['check_s'] for r in bad])}); "
        f"launch -> group of {healthy} formed: {fmt([r['formed_s'] for r in bad])}; "
        f"launch -> first step of the remaining group: {fmt([r['first_step_s'] for r in bad])}"
    )
    print(
        f"baseline, {agents} alone: group formed "
        f"{fmt([r['formed_s'] for r in alone])}"
        f", first step {fmt([r['first_step_s'] for r in alone])}"
    )
    ok = sum(r["ok"] for r in bad + alone)
    print(f"correct runs: {ok}/{len(bad) + len(alone)} (exit 15 for the bad node, 0 others)")
    if ok != len(bad) + len(alone):
        sys.exit(1)


if __name__ == "__main__":
    main()
