"""A rank that records what torchrun gives it: a JSON file per global rank.

``--out DIR``: where ``rank_<RANK>.json`` goes. ``--init env|tcp``: the process group's
init method (gloo; ``tcp``: ``tcp://MASTER_ADDR:MASTER_PORT``, the store the launcher
provides, as under torchrun), then one all-reduce over every rank. ``--fail-rank
R``: that rank raises after writing its file. Prints one line to stdout and one to
stderr (for the launcher's log files and prefixes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

NAMES = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "OMP_NUM_THREADS",
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--init", default="env")
    p.add_argument("--fail-rank", type=int, default=-1)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init = "env://"
    if args.init == "tcp":
        init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    total = torch.ones(1)
    dist.all_reduce(total)
    record = {name: os.environ.get(name) for name in NAMES}
    record["is_torchelastic_launched"] = dist.is_torchelastic_launched()
    record["all_reduce"] = float(total.item())
    record["argv"] = sys.argv[1:]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank_{rank}.json"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / f"rank_{rank}.json")
    print(f"hello-stdout from rank {rank}", flush=True)
    print(f"hello-stderr from rank {rank}", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")


if __name__ == "__main__":
    main()
