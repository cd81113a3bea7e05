"""Fixtures shared by the unit and end-to-end tests (builders live in tests/factories.py).

The suite runs on several workers (pytest-xdist, ``-n 4 --dist loadgroup``: the README's
test command; four rather than three: the long tests wait on timeouts about a tenth of
the time, and a fourth worker fills it, 6 % less wall time on 2 cores): the long tests
(``e2e``, ``bench``, and the unit tests that start gloo ranks, ``ranks``: mostly waiting
on timeouts and child processes) are handed out first, the short unit tests fill the
gaps. Tests that must not run at the same time as each other (a fixed port, a shared
directory) take the same ``@pytest.mark.xdist_group("name")``; every test gets its own
``tmp_path`` and binds port 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.factories import FAKE_BIN, Children

LONG_MARKERS = ("e2e", "bench", "ranks")
# Unit tests that mostly wait on a timer (a grace period, a timeout): spread among the
# long tests, they sleep while those keep the cores busy, instead of idling the cores
# at the end of the run (about 60 s of waiting; the last minute of a run had the CPU
# 30-44 % idle while they ran there).
WAITS_MARKER = "waits"


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread in the test processes themselves: a test process that grew an
    OpenMP/BLAS thread pool (a matmul in an earlier test on the same worker) can hang the
    ranks it forks later (``tests.factories.run_ranks``).

    And one in every rank the tests launch (``OMP_NUM_THREADS=1``, unless set): the
    simulated nodes of a multi-node test share this machine's cores, and a rank alone on
    its "node" (``--nproc-per-node 1``, where torchrun leaves the variable alone) would
    run one OpenMP thread per core, spinning between operations: on 2 cores a two-node
    job's ranks burned 2.6 times the CPU they needed (16.9 s against 6.4 s each, for 60
    steps). Several ranks on one node get 1 from the launcher anyway, as with torchrun;
    the tests that check that rule remove the variable first."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first, so that the last minutes of a parallel run are not one long test
    alone; the tests that mostly wait spread evenly among them; the rest after. The same
    order on every xdist worker (a deterministic function of the collection)."""
    long = [i for i in items if any(i.get_closest_marker(m) for m in LONG_MARKERS)]
    taken = {id(i) for i in long}
    waits = [i for i in items if id(i) not in taken and i.get_closest_marker(WAITS_MARKER)]
    taken |= {id(i) for i in waits}
    rest = [i for i in items if id(i) not in taken]
    first: list[pytest.Item] = []
    for n, item in enumerate(long):  # waits[k] after long item (k + 1) * len(long) / (W + 1)
        first.append(item)
        lo = n * (len(waits) + 1) // max(len(long), 1)
        hi = (n + 1) * (len(waits) + 1) // max(len(long), 1)
        first.extend(waits[lo : min(hi, len(waits))])
    first.extend(waits[len(first) - len(long) :])  # no long test collected: all of them
    items[:] = first + rest


@pytest.fixture
def fake_smi(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Put the fake nvidia-smi (tests/fakes/bin) first on PATH and clear its knobs."""
    for name in list(os.environ):
        if name.startswith("FAKE_SMI_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return monkeypatch


@pytest.fixture
def children() -> Iterator[Children]:
    """Start child processes; every one is killed and reaped at the end."""
    kids = Children()
    try:
        yield kids
    finally:
        kids.close()
