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
from tests.timeline import ENV as TIMELINE_ENV
from tests.timeline import Recorder, cgroup_clock

LONG_MARKERS = ("e2e", "bench", "ranks")


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread in the test processes themselves: the workers share the cores,
    and an OpenMP pool per worker would spin between operations. (``run_ranks`` no longer
    forks the test process, so a pool grown by an earlier test cannot hang its ranks:
    ``tests/unit/test_run_ranks.py``.)

    And one in every rank the tests launch (``OMP_NUM_THREADS=1``, unless set): the
    simulated nodes of a multi-node test share this machine's cores, and a rank alone on
    its "node" (``--nproc-per-node 1``, where torchrun leaves the variable alone) would
    run one OpenMP thread per core, spinning between operations: on 2 cores a two-node
    job's ranks burned 2.6 times the CPU they needed (16.9 s against 6.4 s each, for 60
    steps). Several ranks on one node get 1 from the launcher anyway, as with torchrun;
    the tests that check that rule remove the variable first.

    Torch is imported only where tests run: in each xdist worker, or in pytest itself
    without workers. The controller of ``-n 4`` runs no test, and its import of torch
    (1.5-2.5 s of CPU) came before it started any worker."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runs_tests = "PYTEST_XDIST_WORKER" in os.environ or not config.getoption("numprocesses", 0)
    if not runs_tests:
        return
    import torch

    torch.set_num_threads(1)
    # When each test ran (tests/timeline.py, with RANKGUARD_TEST_TIMELINE set), recorded
    # where tests run, never in the controller (which hears of the workers' tests late);
    # the CPU of every process a test starts where this worker can have a cgroup of its
    # own (tests/timeline.py), else what it reaped.
    directory = os.environ.get(TIMELINE_ENV)
    if directory:
        recorder = Recorder(directory, clock=cgroup_clock(os.getpid()))
        config.pluginmanager.register(recorder, "rankguard-timeline")


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection left alive (torch, the test modules, their parameters: about
    210,000 objects) lives as long as the process: it goes to the collector's permanent
    generation (``rankguard.util.gcfreeze.freeze_startup``, what each rank does after its
    imports), so the full collections the tests set off, and the ``gc.collect()`` calls
    of pytest's end and of some tests, no longer walk it. What the tests make is
    collected as before. In-process unit tests: 2.2-2.4 s of the cyclic collector's CPU
    in a 500-test run, 1.1-1.3 s frozen (``gc.callbacks``, 2026-12-07)."""
    from rankguard.util.gcfreeze import freeze_startup

    freeze_startup()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first (a stable sort: the same order on every xdist worker), so that the
    last minutes of a parallel run are not one long test alone."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG_MARKERS))


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
