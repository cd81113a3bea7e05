"""``tests.factories.run_ranks`` does not depend on what ran before it in the worker.

Its ranks come from a forkserver, not from a fork of the test process: a test process
holding a busy thread pool and a grown OpenMP pool (earlier tests on the same xdist
worker) must not hang the ranks it starts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.factories import run_ranks

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(90)]


def _matmul_then_all_reduce(rank: int, world: int) -> float:
    import torch.distributed as dist

    torch.set_num_threads(2)  # a parallel region in the rank: OpenMP starts its pool
    x = torch.ones(256, 256) @ torch.ones(256, 256)
    t = torch.tensor([float(x[0, 0]) + rank])
    dist.all_reduce(t)
    return float(t)


@pytest.fixture
def busy_process() -> Iterator[None]:
    """What an earlier test may leave: an OpenMP pool grown by a parallel matmul, and a
    thread pool whose workers hold a lock (here: a lock in a loop) while ranks start."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    for _ in range(3):
        torch.ones(512, 512) @ torch.ones(512, 512)
    stop = threading.Event()
    lock = threading.Lock()

    def churn() -> None:
        while not stop.is_set():
            with lock:
                torch.ones(64, 64) @ torch.ones(64, 64)

    pool = ThreadPoolExecutor(2)
    futures = [pool.submit(churn) for _ in range(2)]
    try:
        yield
    finally:
        stop.set()
        for f in futures:
            f.result(timeout=10)
        pool.shutdown(wait=True)
        torch.set_num_threads(threads)


def test_ranks_start_cleanly_after_threads_and_an_openmp_pool(
    busy_process: None, tmp_path: Path
) -> None:
    results = run_ranks(2, _matmul_then_all_reduce, store_dir=tmp_path, timeout_s=60)
    assert results == [2 * 256.0 + 1] * 2


def test_ranks_run_twice_in_one_process(tmp_path: Path) -> None:
    """The forkserver outlives a call: a second call reuses it."""
    for _ in range(2):
        assert run_ranks(2, _matmul_then_all_reduce, store_dir=tmp_path) == [513.0, 513.0]
