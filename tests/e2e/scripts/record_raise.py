"""torch elastic's usual entry point (``@record`` on ``main``) whose rank 1 raises at
step 3; rank 0 then fails in its next all-reduce."""

import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def check_batch(step: int) -> None:
    if dist.get_rank() == 1 and step == 3:
        raise ValueError("bad batch at step 3")


@record
def main() -> None:
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(400):
        check_batch(step)
        dist.all_reduce(t)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
