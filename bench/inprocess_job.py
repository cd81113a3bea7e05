"""One rank of the in-process restart benchmark (started by ``bench/inprocess.py``).

The same training loop (a manual gradient all_reduce on gloo, state kept in memory)
under either wrapper: ``--wrapper rankguard`` (``rankguard.inprocess.wrap``) or
``--wrapper nvrx`` (NVRx's ``inprocess.Wrapper``, its own store on MASTER_PORT+1 and, as
in NVRx's example, the application's store on MASTER_PORT+2+iteration). Rank 1 raises at
``--every`` steps into each round, ``--faults`` times; rank 1 prints, as JSON, the time
from each raise to the first step completed after the re-entry. ``--interval S`` sets
every monitoring interval and wait of the wrapper to S seconds (rankguard: the watcher
thread's interval and the store heartbeat; NVRx: its monitor thread, monitor process,
heartbeat and progress watchdog intervals and ``last_call_wait``); without it each
wrapper runs at its own defaults (1 s for all of these in both).
"""

# No `from __future__ import annotations`: NVRx reads the real annotation of call_wrapper.
import argparse
import datetime
import json
import os
import time
from typing import Any, Optional

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "error")
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--wrapper", choices=["rankguard", "nvrx"], required=True)
p.add_argument("--faults", type=int, default=5)
p.add_argument("--every", type=int, default=5)
p.add_argument(
    "--interval",
    type=float,
    default=None,
    help="every monitoring interval and wait of the wrapper, in seconds (default: its own)",
)
args = p.parse_args()

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
state: dict[str, Any] = {"step": 0, "w": torch.zeros(64), "faults": 0}
raised_at: list[float] = []
latencies: list[float] = []


def body(round_: int) -> None:
    start = state["step"]
    first = True
    while True:
        if RANK == 1 and state["faults"] < args.faults and state["step"] == start + args.every:
            state["faults"] += 1
            raised_at.append(time.perf_counter())
            raise RuntimeError(f"injected fault {state['faults']}")
        grad = torch.ones(64) * (state["step"] % 7)
        dist.all_reduce(grad)
        state["w"] = state["w"] - 0.01 * grad
        state["step"] += 1
        if first and round_ > 0 and RANK == 1:
            latencies.append(time.perf_counter() - raised_at[-1])
            first = False
        # rank 1 decides (it counts the faults): done after 3 clean steps past the last
        done = RANK == 1 and state["faults"] >= args.faults and state["step"] >= start + 3
        stop = torch.tensor([int(done)])
        dist.all_reduce(stop)
        if stop.item():
            return


if args.wrapper == "rankguard":
    import rankguard.inprocess as ip

    tuned = (
        {}
        if args.interval is None
        else {"monitor_thread_interval": args.interval, "heartbeat_interval": args.interval}
    )

    @ip.wrap(
        config=ip.InProcessRestartConfig(
            enabled=True,
            soft_timeout=10.0,
            hard_timeout=20.0,
            max_restarts_per_window=1000,
            **tuned,
        )
    )
    def train() -> None:
        body(ip.restart_count())

    train()
else:
    import nvidia_resiliency_ext.inprocess as inprocess

    interval = None if args.interval is None else datetime.timedelta(seconds=args.interval)
    nvrx_tuned = (
        {}
        if interval is None
        else {
            "monitor_thread_interval": interval,
            "monitor_process_interval": interval,
            "heartbeat_interval": interval,
            "progress_watchdog_interval": interval,
            "last_call_wait": interval,
        }
    )

    @inprocess.Wrapper(
        store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1},
        soft_timeout=datetime.timedelta(seconds=10),
        hard_timeout=datetime.timedelta(seconds=20),
        **nvrx_tuned,
    )
    def train(call_wrapper: Optional[inprocess.CallWrapper] = None) -> None:  # noqa: UP045
        assert call_wrapper is not None
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]) + 2 + call_wrapper.iteration,
            WORLD,
            is_master=RANK == 0,
            multi_tenant=True,
            wait_for_workers=True,
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=RANK,
            world_size=WORLD,
            timeout=datetime.timedelta(seconds=10),
        )
        body(call_wrapper.iteration)

    train()

if RANK == 1:
    print("LATENCIES " + json.dumps(latencies), flush=True)
