"""A user-style training script wrapped for in-process restart, with injected faults.

Each rank trains a tiny linear model by hand (all_reduce of the gradient), so the result
is deterministic: after any number of re-entries the final weights must equal a run
without faults. State lives in memory across rounds; after a re-entry the ranks agree on
the step with an ``all_reduce(MIN)`` and take that step's in-memory copy (the pattern for
"restore from memory where intact", else load the latest checkpoint).

``--faults ROUND:RANK:STEP:KIND,...`` (KIND: raise, hang, hang_blocked, exit, stop: the
process stopped with SIGSTOP for ``STOP_S`` seconds, stop_setup: raise, then stop for
``STOP_S`` seconds as the rank starts to set up the next round's process group, once
every peer has published its address there, its own held back) or ``--random N`` (N
random faults, one per round, seeded). Results go to ``--out DIR/rank_<r>.json``.
Without ``rankguard run`` (``--standalone``), the config comes from the flags.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import rankguard
import rankguard.inprocess as ip

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--faults", default="")
p.add_argument("--random", type=int, default=0)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--out", required=True)
p.add_argument("--standalone", action="store_true")
p.add_argument("--soft", type=float, default=10.0)
p.add_argument("--hard", type=float, default=30.0)
p.add_argument("--per-window", type=int, default=50)
p.add_argument("--step-s", type=float, default=0.0)
p.add_argument("--late", type=float, default=0.0, help="rank 1 starts this much later")
args = p.parse_args()

session = rankguard.init()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

faults: dict[tuple[int, int], tuple[int, str]] = {}  # (round, rank) -> (step, kind)
for item in filter(None, args.faults.split(",")):
    r_, k_, s_, kind = item.split(":")
    faults[(int(r_), int(k_))] = (int(s_), kind)
if args.random:
    rng = random.Random(args.seed)
    at = sorted(rng.sample(range(1, args.steps - 1), args.random))  # one fault per round
    for r_, step_ in enumerate(at):
        faults[(r_, rng.randrange(world))] = (step_, rng.choice(["raise", "raise", "hang"]))

if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
    faults.clear()  # the launcher restarted the processes: this attempt runs clean

DIM = 8
STOP_S = 6  # a "stop" fault: twice the heartbeat_timeout below, within hard_timeout
state = {"step": 0, "w": torch.zeros(DIM), "snapshots": {0: torch.zeros(DIM)}}
log: dict[str, object] = {"losses": {}, "rounds": [], "fault_to_step": []}
target = torch.arange(DIM, dtype=torch.float32) / DIM


def loss_and_grad(w: torch.Tensor, step: int) -> tuple[float, torch.Tensor]:
    x = torch.linspace(-1, 1, DIM) * (1 + (rank + step) % 3)
    err = float((w - target) @ x)
    return err * err, 2 * err * x


def resources() -> dict[str, int]:
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_kb": rss_pages * os.sysconf("SC_PAGE_SIZE") // 1024,
    }


fault_time: list[float] = []


def stop_for(seconds: float) -> None:
    """The whole process held up (its watcher too), then resumed."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


class StopAtSetup(dist.Store):
    """The job's store, through which this rank stops as it starts to set up round
    ``round_``'s process group: its peers, past the barrier, wait for it there."""

    def __init__(self, round_: int) -> None:
        super().__init__()
        self.inner = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=30),
        )
        self.round = round_
        self.marker = f"/{round_}/pg/"
        self.stopped = False

    def set(self, key: str, value: bytes | str) -> None:
        if not self.stopped and self.marker in key:
            self.stopped = True
            # Held up only once every peer has published its own address and waits for
            # this rank's: stopped earlier, a peer slower to get here (its CPU taken by
            # the machine's other work) would begin its wait late enough to see this
            # rank resume within it, and the round would form.
            head = key[: key.index(self.marker)]
            peers = [
                f"{head}/{self.round}/setup/here/{p}"
                for p in range(int(os.environ["WORLD_SIZE"]))
                if p != int(os.environ["RANK"])
            ]
            deadline = time.monotonic() + 30.0
            while not self.inner.check(peers) and time.monotonic() < deadline:
                time.sleep(0.02)
            stop_for(STOP_S)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def train() -> torch.Tensor:
    round_ = ip.restart_count()
    info = ip.current()
    log["rounds"].append(  # type: ignore[attr-defined]
        {
            "round": round_,
            "at": time.time(),
            "cause": info.cause if info else None,
            "culprit": info.culprit if info else None,
            "message": info.message if info else None,
            **resources(),
        }
    )
    # Agree on the step every rank still holds, and take that step's in-memory copy.
    step = torch.tensor([state["step"]], dtype=torch.int64)
    dist.all_reduce(step, op=dist.ReduceOp.MIN)
    start = int(step.item())
    state["w"] = state["snapshots"][start].clone()  # type: ignore[index]
    state["step"] = start
    first = True
    while state["step"] < args.steps:
        s = int(state["step"])  # type: ignore[call-overload]
        plan = faults.get((round_, rank))
        if plan is not None and plan[0] == s:
            fault_time.append(time.time())
            kind = plan[1]
            if kind in ("raise", "stop_setup"):
                raise RuntimeError(f"injected fault at step {s} on rank {rank}")
            if kind == "hang":
                time.sleep(3600)  # stuck before the collective: the soft timeout ends it
            if kind == "hang_blocked":  # the interrupt cannot land: the hard timeout ends it
                signal.pthread_sigmask(signal.SIG_BLOCK, {ip.interrupt.INTERRUPT_SIGNAL})
                time.sleep(3600)
            if kind == "exit":
                os._exit(3)
            if kind == "stop":
                stop_for(STOP_S)
        loss, grad = loss_and_grad(state["w"], s)  # type: ignore[arg-type]
        dist.all_reduce(grad)
        w = state["w"] - 0.01 * grad / world  # type: ignore[operator]
        with ip.atomic():  # an interrupt between these lines would leave the step torn
            state["w"], state["step"] = w, s + 1
            state["snapshots"] = {s + 1: w, s: state["snapshots"].get(s, w)}  # type: ignore[attr-defined]
            log["losses"][str(s)] = loss  # type: ignore[index]
        if first and round_ > 0:
            log["fault_to_step"].append(time.time())  # type: ignore[attr-defined]
            first = False
        session.step_end(s + 1)
        if args.step_s:
            time.sleep(args.step_s)
    return state["w"]  # type: ignore[return-value]


config = None
if args.standalone or os.environ.get("RANKGUARD_LAUNCHER") != "1":
    config = ip.InProcessRestartConfig(
        enabled=True,
        soft_timeout=args.soft,
        hard_timeout=args.hard,
        monitor_thread_interval=0.1,
        heartbeat_interval=0.2,
        heartbeat_timeout=3.0,
        barrier_timeout=30.0,
        max_restarts_per_window=args.per_window,
        restart_window=600.0,
    )
setup_stops = [
    r_ + 1 for (r_, k_), (_, kind_) in faults.items() if k_ == rank and kind_ == "stop_setup"
]
factory = (lambda: StopAtSetup(setup_stops[0])) if setup_stops else None
wrapped = ip.wrap(train, config=config, store_factory=factory)
if rank == 1 and args.late:
    time.sleep(args.late)  # still starting: its peers must wait, not declare it lost
error = None
try:
    final = wrapped()
except ip.InProcessRestartError as exc:
    error = str(exc)
    final = None
os.makedirs(args.out, exist_ok=True)
result = {
    "rank": rank,
    "pid": os.getpid(),
    "error": error,
    "restarts": len(log["rounds"]) - 1,  # type: ignore[arg-type]
    "final_w": final.tolist() if final is not None else None,
    "losses": log["losses"],
    "rounds": log["rounds"],
    "fault_time": fault_time,
    "first_step_after": log["fault_to_step"],
    "after": resources(),
}
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump(result, f)
if error is not None:
    raise SystemExit(f"in-process restart gave up: {error}")
