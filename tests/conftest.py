"""Fixtures shared by the unit and end-to-end tests (builders live in tests/factories.py).

The suite runs on several workers (pytest-xdist, ``-n 4 --dist loadgroup``: the README's
test command): the long tests (``e2e``, ``bench``, and the unit tests that start gloo
ranks, ``ranks``: mostly waiting on timeouts and child processes) are handed out first,
longest first by the durations of an earlier run (``tests/durations.json``; a test not in
it counts as a typical long one), so that the last minutes are not one long test alone;
the short unit tests fill the gaps. ``--record-durations`` rewrites that file from the
run. Tests that must not run at the same time as each other (a fixed port, a shared
directory) take the same ``@pytest.mark.xdist_group("name")``; every test gets its own
``tmp_path`` and binds port 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import FAKE_BIN, Children

LONG_MARKERS = ("e2e", "bench", "ranks")
DURATIONS = Path(__file__).parent / "durations.json"
TYPICAL_LONG_S = 12.0  # a long test the durations file does not know yet


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json with this run's long tests (their call time)",
    )


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
    if config.getoption("--record-durations"):
        config.pluginmanager.register(_DurationRecorder(), "rankguard-durations")


def _long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in LONG_MARKERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first, the longest of them first (a stable sort on what every xdist
    worker reads alike: the same order everywhere), so that the last minutes of a parallel
    run are not one long test alone."""
    try:
        known: dict[str, float] = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}

    def key(item: pytest.Item) -> tuple[bool, float]:
        if not _long(item):
            return (True, 0.0)
        return (False, -float(known.get(item.nodeid, TYPICAL_LONG_S)))

    items.sort(key=key)


class _DurationRecorder:
    """``--record-durations``: the call time of every long test that passed, written to
    ``tests/durations.json`` at the end (by the xdist controller, which sees every
    report; a report's keywords carry the test's markers)."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed and set(LONG_MARKERS) & set(report.keywords):
            self.seen[report.nodeid] = round(report.duration, 1)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seen:
            return  # an xdist worker: the controller writes the file
        try:
            old = json.loads(DURATIONS.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        merged = dict(sorted({**old, **self.seen}.items()))
        DURATIONS.write_text(json.dumps(merged, indent=0) + "\n", encoding="utf-8")


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
