"""In-process restart: fault -> first step after the re-entry, 2 CPU ranks on gloo.

    python bench/inprocess.py [--faults 10] [--nvrx-python /path/to/venv/bin/python]

Runs ``bench/inprocess_job.py`` on 2 ranks (processes on loopback): rank 1 raises every
few steps; the figure is the time from the raise to the first step completed after every
rank re-entered, as seen by the rank that raised (median and max over the faults). With
``--nvrx-python`` (a Python where nvidia-resiliency-ext is installed), the same job runs
under NVRx's ``inprocess.Wrapper`` too, and the ratio is printed. NVRx's automatic GPU,
NVLink and NIC health checks are built when ``LOCAL_RANK`` is set; on a CPU machine its
ranks run without ``LOCAL_RANK`` (the workaround), ours with it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).resolve().parent / "inprocess_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(python: str, wrapper: str, faults: int) -> list[float]:
    import torch.distributed as dist

    store = None
    if wrapper == "rankguard":  # the launcher's store, as torch elastic would host it
        store = dist.TCPStore(
            "127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        port = store.port
    else:  # NVRx hosts its own stores on rank 0 (MASTER_PORT+1, +2+iteration)
        port = _free_port()
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        PYTHONPATH=str(ROOT / "src"),
        TORCH_CPP_LOG_LEVEL="error",
    )
    procs = []
    for rank in range(2):
        renv = {**env, "RANK": str(rank)}
        if wrapper == "rankguard":
            renv["LOCAL_RANK"] = str(rank)
        else:
            renv.pop("LOCAL_RANK", None)
        procs.append(
            subprocess.Popen(
                [python, str(JOB), "--wrapper", wrapper, "--faults", str(faults)],
                env=renv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    del store
    for line in outs[1].splitlines():
        if line.startswith("LATENCIES "):
            return [float(x) for x in json.loads(line.removeprefix("LATENCIES "))]
    raise RuntimeError(f"{wrapper}: no figures (exit codes {[p.returncode for p in procs]})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--nvrx-python", default=None)
    args = ap.parse_args()
    figures = {}
    t0 = time.monotonic()
    figures["rankguard"] = run(sys.executable, "rankguard", args.faults)
    if args.nvrx_python:
        figures["nvrx"] = run(args.nvrx_python, "nvrx", args.faults)
    for name, values in figures.items():
        print(
            f"{name:9s} fault -> first step after re-entry: median {statistics.median(values):.3f}s"
            f"  max {max(values):.3f}s  ({len(values)} faults)"
        )
    if "nvrx" in figures:
        ratio = statistics.median(figures["nvrx"]) / statistics.median(figures["rankguard"])
        print(f"NVRx / rankguard (median): {ratio:.1f}x")
    print(f"(bench took {time.monotonic() - t0:.0f}s)")


if __name__ == "__main__":
    main()
