"""In-process restart, N runs in a row of random faults (exceptions and hangs).

    python bench/inprocess_loop.py [--runs 20] [--faults 3]

Each run: 2 ranks on gloo (processes on loopback, a TCPStore on port 0) train the test
script ``tests/e2e/scripts/inprocess_train.py`` for 20 steps with ``--faults`` random
faults (a different seed each run: which rank, which step, raise or hang); a run passes
when both ranks exit 0, re-entered once per fault, ran every step exactly once and end
with the weights of a run without faults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "e2e" / "scripts" / "inprocess_train.py"
STEPS = 20


def reference() -> list[float]:
    dim, world = 8, 2
    target = torch.arange(dim, dtype=torch.float32) / dim
    w = torch.zeros(dim)
    for s in range(STEPS):
        grad = torch.zeros(dim)
        for rank in range(world):
            x = torch.linspace(-1, 1, dim) * (1 + (rank + s) % 3)
            grad += 2 * float((w - target) @ x) * x
        w = w - 0.01 * grad / world
    return w.tolist()


def one(seed: int, faults: int, out: Path) -> tuple[bool, str]:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        WORLD_SIZE="2",
        PYTHONPATH=str(ROOT / "src"),
        TORCH_CPP_LOG_LEVEL="error",
    )
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--steps", str(STEPS)]
    cmd += ["--random", str(faults), "--seed", str(seed), "--soft", "2", "--hard", "20"]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(2)
    ]
    try:
        rcs = [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if rcs != [0, 0]:
        return False, f"exit codes {rcs}"
    ref = reference()
    for r in range(2):
        res = json.loads((out / f"rank_{r}.json").read_text())
        if res["restarts"] != faults:
            return False, f"rank {r}: {res['restarts']} re-entries, expected {faults}"
        if sorted(map(int, res["losses"])) != list(range(STEPS)):
            return False, f"rank {r}: steps {sorted(res['losses'])}"
        if max(abs(a - b) for a, b in zip(res["final_w"], ref, strict=True)) > 1e-5:
            return False, f"rank {r}: weights differ from the run without faults"
    return True, "ok"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--faults", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="one run, one fault (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.faults = 1, 1
    passed = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.runs):
            ok, why = one(seed, args.faults, Path(tmp) / str(seed))
            passed += ok
            print(f"run {seed + 1:2d} (seed {seed}): {'pass' if ok else 'FAIL'} {why}", flush=True)
    print(
        f"{passed}/{args.runs} runs passed ({args.faults} random faults each), "
        f"{time.monotonic() - t0:.0f}s"
    )
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
