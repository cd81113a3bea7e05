"""``bench/checkpoint.py --smoke``: every path saves, every checkpoint passes the
consistency check of the same run, and the table is printed (this bench's smoke run:
``test_bench_smoke.py`` leaves it to this test, which asserts more of it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench import forked

pytestmark = [pytest.mark.bench, pytest.mark.timeout(600)]  # minutes on a loaded machine

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkpoint_bench_smoke_run_checks_every_checkpoint(tmp_path: Path) -> None:
    res = forked.run(
        "checkpoint.py",
        "--smoke",
        "--dir",
        str(tmp_path),
        timeout=580,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for label in (
        "sync",
        "rankguard async (thread)",
        "rankguard async (thread, idle)",
        "DCP async_save, default staging",
        "DCP async_save, use_async_staging",
    ):
        row = [line for line in out.splitlines() if line.strip().startswith(label + " ")]
        assert row and row[-1].endswith("2/2 consistent"), (label, out)
    assert "INCONSISTENT" not in out
    assert "verdict: rankguard async (thread) total stall" in out
    assert "verdict: rankguard async (thread, idle) total stall" in out
    cpu = out[out.index("4. CPU per async save") :].splitlines()
    for label in (
        "rankguard async (thread)",
        "DCP async_save, default staging",
        "DCP async_save, use_async_staging",
    ):
        row = [line for line in cpu if line.strip().startswith(label + " ")]
        assert row and row[-1].endswith("2/2 consistent"), (label, out)
    assert not list(tmp_path.iterdir())  # the scratch directory is removed
