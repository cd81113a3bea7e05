"""tests/conftest.py: what the suite's own set-up does in each pytest process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFIGURE = """
import sys
from types import SimpleNamespace

import tests.conftest as conftest

registered = []
config = SimpleNamespace(
    getoption=lambda name, default=None: {numprocesses} if name == "numprocesses" else default,
    pluginmanager=SimpleNamespace(register=lambda plugin, name: registered.append(name)),
)
conftest.pytest_configure(config)
torch = sys.modules.get("torch")
print("torch" if torch else "-", torch.get_num_threads() if torch else "-", registered)
"""


def test_the_controller_of_workers_imports_no_torch_and_records_nothing(tmp_path: Path) -> None:
    """The controller of ``-n 4`` runs no test: no torch, no timeline of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["RANKGUARD_TEST_TIMELINE"] = str(tmp_path / "timeline")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", CONFIGURE.format(numprocesses=4)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "- - []"
    assert not (tmp_path / "timeline").exists()


def test_where_tests_run_torch_has_one_intra_op_thread() -> None:
    """This test's own process (a worker, or pytest alone) was configured."""
    import torch

    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_what_collection_left_is_frozen() -> None:
    """torch and the collected test modules are in the collector's permanent generation
    (a full collection walks only what the tests made since)."""
    import gc

    assert gc.get_freeze_count() > 50_000
