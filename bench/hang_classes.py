"""The four kinds of hang, classified on one and on two agents (real launches).

Each case is a real ``rankguard run`` of ``hang_classes_job.py`` (gloo, CPU ranks, 2 per
agent): one agent (``--standalone``), or two agents on loopback (two ``rankguard run``
processes, ``--nnodes 2`` on a c10d rendezvous on 127.0.0.1, each with its own log
directory; the rendezvous numbers them and node 0's monitor compares every node's
ranks). The job hangs one way at a drawn step (8-14) and, for the kinds of one rank, a
drawn rank (``--seed``): a rank that did not join an all-reduce, a mismatch (one rank in
an all-gather, the others in the all-reduce), a communication stall (every rank in the
same reduce, none completes) and a compute hang (every rank in its own work). The run is
stopped :data:`SETTLE_S` after the first hang finding on node 0's ``findings.jsonl``.

Scored from that file and the job's mark (the injection's wall time and the
collective's number; the job's one collective per step makes it the step):

- class: every hang finding's ``hang.kind`` is the injected kind;
- rank: did_not_join: the missing rank alone, and the only rank named; mismatch: the
  drawn rank alone on one side, every other rank on the other; communication_stall:
  every rank waiting; compute_hang: every rank named (each hangs in its own work);
- collective: the group's sequence number is the injected one, and the operation
  (``all_reduce``; both sides' ``all_reduce`` and ``all_gather``; ``reduce``); for a
  compute hang, no collective named;
- latency: the first hang finding's detection time minus the injection's.

``--kinds stall_sigstop`` (not by default): the communication stall made the other way,
a rank stopped (SIGSTOP) once inside the all-reduce, its peers joining after it; scored
as a communication stall, its rank right when the stopped rank is named alone and as the
one that stopped publishing (``hang.silent_ranks``), the collective as ``all_reduce``
and its number.

``--smoke``: one case (a rank that did not join, 2 ranks, one agent), the same timeouts
(a waiting rank names its collective 2 s after entering it, then one publish and one scan
bring it to node 0: a shorter progress timeout finds the hang before the collective's
name is there); its figures are not results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE / "hang_classes_job.py"
KINDS = ("did_not_join", "mismatch", "communication_stall", "compute_hang")
#: ``--kinds stall_sigstop``: a communication stall made by stopping a rank (SIGSTOP) once
#: it is inside the all-reduce, its peers joining after; scored as a communication stall
STALL_SIGSTOP = "stall_sigstop"
EXPECTED = {STALL_SIGSTOP: "communication_stall"}
#: progress timeout 4 s: the waiting rank names its collective after 2 s at one position
#: (``STUCK_AFTER_S``), then a publish and a scan (0.5 s each) and the load's delays
FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
]
HANG_TYPES = ("gpu_progress_timeout", "rank_process_heartbeat_timeout", "rank_section_timeout")
SETTLE_S = 2.0  # after the first hang finding: the same scan's other findings land
SMOKE_SETTLE_S = 0.2
DEADLINE_S = 90.0  # a case with no hang finding by then is a miss
NPROC = 2  # ranks per agent


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    nodes: int
    rank: int  # the injecting rank (kinds of one rank); -1: every rank
    step: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cmds(
    case: Case, base: Path, run_id: str, mark: Path, fast: list[str]
) -> list[tuple[list[str], Path]]:
    """One ``rankguard run`` per agent, with its log directory."""
    job = [str(JOB), "--kind", case.kind, "--rank", str(case.rank)]
    job += ["--at-step", str(case.step), "--mark", str(mark)]
    sets = [a for item in fast for a in ("--set", item)]
    run = [sys.executable, "-m", "rankguard.cli.main", "run", "--nproc-per-node", str(NPROC)]
    if case.nodes == 1:
        log = base / run_id
        return [
            ([*run, "--standalone", "--rdzv-id", run_id, "--log-dir", str(log), *sets, *job], log)
        ]
    port = _free_port()
    rdzv = ["--nnodes", str(case.nodes), "--rdzv-backend", "c10d"]
    rdzv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
    out = []
    for agent in range(case.nodes):
        log = base / f"{run_id}-agent{agent}"
        out.append(([*run, *rdzv, "--log-dir", str(log), *sets, *job], log))
    return out


def _findings(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return [f for f in out if f.get("finding_type") in HANG_TYPES]


def _node0(logs: list[Path], run_id: str) -> Path | None:
    """Node 0's run directory: the one its monitor writes ``status.json`` in."""
    for log in logs:
        if (log / "heartbeat" / run_id / "status.json").exists():
            return log / "heartbeat" / run_id
    return None


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _leftovers(run_id: str) -> list[int]:
    """Processes of this launch still there after its launchers exited (their command
    line names the run): each is killed (a stopped rank included) and counted."""
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if run_id.encode() in (proc / "cmdline").read_bytes():
                left.append(int(proc.name))
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def run_case(base: Path, case: Case, k: int, smoke: bool = False) -> dict[str, Any]:
    """One launch; stopped :data:`SETTLE_S` (``--smoke``: :data:`SMOKE_SETTLE_S`) after
    the first hang finding."""
    run_id = f"hang-{case.kind[:8]}-{case.nodes}-{k}-{os.getpid()}"
    mark = base / f"{run_id}.mark"
    cmds = _cmds(case, base, run_id, mark, FAST)
    settle = SMOKE_SETTLE_S if smoke else SETTLE_S
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        for cmd, _ in cmds
    ]
    logs = [log for _, log in cmds]
    first: float | None = None
    deadline = time.monotonic() + DEADLINE_S
    run_dir: Path | None = None
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            run_dir = run_dir or _node0(logs, run_id)
            if first is None and run_dir is not None and _findings(run_dir / "findings.jsonl"):
                first = time.monotonic()
            if first is not None and time.monotonic() - first >= settle:
                break
            time.sleep(0.25)
    finally:
        _stop(procs)
    left = _leftovers(run_id)
    run_dir = run_dir or _node0(logs, run_id)
    found = _findings(run_dir / "findings.jsonl") if run_dir is not None else []
    injected = json.loads(mark.read_text(encoding="utf-8")) if mark.exists() else None
    return score(case, NPROC * case.nodes, found, injected) | {"leftover_processes": len(left)}


def _expected_rank(case: Case, world: int, found: list[dict[str, Any]]) -> bool:
    hang = found[0].get("hang") or {}
    named = sorted({int(f["rank"]) for f in found})
    everyone = list(range(world))
    if case.kind == "did_not_join":
        return hang.get("missing_ranks") == [case.rank] and named == [case.rank]
    if case.kind == "mismatch":
        sides = sorted(sorted(r) for r in (hang.get("sides") or {}).values())
        others = [r for r in everyone if r != case.rank]
        return sides == sorted([[case.rank], others])
    if case.kind == STALL_SIGSTOP:  # the stopped rank, the culprit, named alone and silent
        return named == [case.rank] and hang.get("silent_ranks") == [case.rank]
    if case.kind == "communication_stall":
        return hang.get("waiting_ranks") == everyone
    return named == everyone


def _expected_collective(case: Case, hang: dict[str, Any]) -> bool:
    if case.kind == "compute_hang":
        return hang.get("group") is None and hang.get("seq") is None
    if hang.get("seq") != case.step:
        return False
    if case.kind == "mismatch":
        ops = sorted(str(w).split()[0] for w in (hang.get("sides") or {}))
        return ops == ["all_gather", "all_reduce"]
    return hang.get("op") == ("reduce" if case.kind == "communication_stall" else "all_reduce")


def score(
    case: Case, world: int, found: list[dict[str, Any]], injected: dict[str, Any] | None
) -> dict[str, Any]:
    """One run's result from node 0's hang findings and the job's mark."""
    out: dict[str, Any] = {"kind": case.kind, "nodes": case.nodes, "rank": case.rank}
    out |= {"step": case.step, "findings": len(found)}
    found = sorted(found, key=lambda f: int(f.get("detected_at_unix_ns", 0)))
    hangs = [f.get("hang") for f in found]
    out["said"] = [
        (f["finding_type"], f["rank"], (h or {}).get("kind"))
        for f, h in zip(found, hangs, strict=True)
    ]
    if not found or injected is None:
        return out | {"class": False, "rank_ok": False, "collective": False, "latency_s": None}
    first = hangs[0] if isinstance(hangs[0], dict) else {}
    want = EXPECTED.get(case.kind, case.kind)
    out["class"] = all(isinstance(h, dict) and h.get("kind") == want for h in hangs)
    out["rank_ok"] = _expected_rank(case, world, found)
    out["collective"] = _expected_collective(case, first)
    out["latency_s"] = round(int(found[0]["detected_at_unix_ns"]) / 1e9 - injected["at_unix"], 2)
    out["line"] = first.get("line")
    return out


def _cases(kinds: list[str], nodes: list[int], runs: int, rng: random.Random) -> list[Case]:
    out = []
    for kind in kinds:
        for n in nodes:
            for _ in range(runs):
                every = kind in ("communication_stall", "compute_hang")
                rank = -1 if every else rng.randrange(NPROC * n)
                out.append(Case(kind, n, rank, rng.randint(8, 14)))
    return out


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'kind':<20} {'agents':>6} {'runs':>4} {'class':>5} {'rank':>5} {'coll.':>5} "
        f"{'latency s (median, max)':>24}"
    ]
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["kind"], r["nodes"]), []).append(r)
    for (kind, nodes), rs in cells.items():
        lat = [r["latency_s"] for r in rs if r["latency_s"] is not None]
        said = f"{statistics.median(lat):.1f}, {max(lat):.1f}" if lat else "-"
        lines.append(
            f"{kind:<20} {nodes:>6} {len(rs):>4} {sum(r['class'] for r in rs):>5} "
            f"{sum(r['rank_ok'] for r in rs):>5} {sum(r['collective'] for r in rs):>5} {said:>24}"
        )
    for kind in dict.fromkeys(r["kind"] for r in results):
        rs = [r for r in results if r["kind"] == kind]
        right = sum(r["class"] and r["rank_ok"] and r["collective"] for r in rs)
        verdict = "met" if right == len(rs) else "NOT met"
        lines.append(
            f"verdict {kind}: class, rank and collective right in {right} of {len(rs)}: {verdict}"
        )
    return lines


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2, help="runs per kind and agent count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", default="1,2", help="agent counts (1 and/or 2)")
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"kinds to inject, comma-separated; also {STALL_SIGSTOP} (not by default)",
    )
    p.add_argument("--smoke", action="store_true", help="one case, 2 ranks, one agent")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    if bad := [k for k in kinds if k not in (*KINDS, STALL_SIGSTOP)]:
        p.error(f"--kinds: unknown {bad} (of {', '.join(KINDS)}, {STALL_SIGSTOP})")
    nodes = [int(n) for n in args.nodes.split(",")]
    if args.runs < 1 or any(n not in (1, 2) for n in nodes):
        p.error("--runs must be >= 1 and --nodes 1 and/or 2")
    rng = random.Random(args.seed)
    # SIGTERM (a background run's stop) raises here: each launch is stopped in its finally
    signal.signal(signal.SIGTERM, _raise_interrupt)
    cases = [Case("did_not_join", 1, 1, 3)] if args.smoke else _cases(kinds, nodes, args.runs, rng)
    results = []
    with tempfile.TemporaryDirectory(prefix="rg-hangs-") as tmp:
        for k, case in enumerate(cases):
            r = run_case(Path(tmp), case, k, args.smoke)
            print(json.dumps(r), flush=True)
            results.append(r)
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    for line in table(results):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
