"""Flight recorder cost: small all-reduces on 2 gloo ranks, recorder on vs off.

``rankguard run`` sets ``TORCH_FR_BUFFER_SIZE=2000`` for its ranks (``docs/
flight_recorder.md``); every collective is then recorded. Two processes on loopback run
``--calls`` all-reduces of 8 floats (the collective's own cost is smallest there, so the
recording's share is largest), alternately without and with the recorder, a few rounds
each; the figure is the median time per all-reduce of each.

Run: ``python bench/flightrec.py`` (``--smoke``: 1 round of 200 calls).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import tempfile
import time


def _ranks(rank: int, store: str, calls: int, out: mp.Queue, fr: bool, world: int = 2) -> None:
    if fr:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    else:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    t = torch.ones(8)
    for _ in range(50):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    us = (time.perf_counter() - t0) / calls * 1e6
    if rank == 0:
        out.put(us)
    dist.destroy_process_group()


def _round(calls: int, fr: bool, world: int = 2) -> float:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [
            ctx.Process(target=_ranks, args=(r, os.path.join(d, "store"), calls, q, fr, world))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        us = q.get(timeout=300)
        for p in procs:
            p.join(60)
    return float(us)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="1 round of 200 calls, 1 rank")
    args = ap.parse_args()
    calls, rounds, world = (200, 1, 1) if args.smoke else (args.calls, args.rounds, 2)
    off, on = [], []
    for _ in range(rounds):
        off.append(_round(calls, False, world))
        on.append(_round(calls, True, world))
    m_off, m_on = statistics.median(off), statistics.median(on)
    ranks = f"{world} gloo rank" + ("s" if world != 1 else "")
    print(f"== flight recorder: all_reduce of 8 floats, {ranks}, {calls} calls x {rounds} ==")
    for name, median, samples in (("off", m_off, off), ("on ", m_on, on)):
        each = ", ".join(f"{x:.1f}" for x in samples)
        print(f"  recorder {name}   {median:8.1f} us per all-reduce  (rounds: {each})")
    print(f"  on - off       {m_on - m_off:+8.1f} us ({100 * (m_on - m_off) / m_off:+.1f} %)")


if __name__ == "__main__":
    main()
