"""bench/stragglers.py's verdicts speak only of what was run: ``--skip-runs`` (overhead
only) and ``--smoke`` (no clean run) print no false-positive verdict."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
OVERHEAD = {"per_step": 500.0, "session_delta": 400.0, "section_delta": 500.0}


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_stragglers", BENCH / "stragglers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_false_positive_verdict_only_with_clean_runs(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    args = argparse.Namespace(report_interval=2.0)
    bench.verdicts(args, [], [], OVERHEAD)
    out = capsys.readouterr().out
    assert "false positives" not in out
    assert "overhead per step < 1000 ns -> MEETS" in out
    bench.verdicts(args, [], [bench.DemoRun("clean1", None, 0.7)], OVERHEAD)
    assert "no false positives -> MEETS (0 straggler finding(s) in 1 clean run(s)" in (
        capsys.readouterr().out
    )
