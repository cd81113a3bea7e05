"""``python -m tests.cost``: which interpreters it counts as launcher jobs, and how it
sums them per test file."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cost import count, launcher_of

PY = "/usr/bin/python3"


def test_the_launchers_are_told_from_other_interpreters() -> None:
    assert launcher_of([PY, "-u", "-m", "rankguard.cli.main", "run", "x.py"]) == "rankguard run"
    assert launcher_of([PY, "/venv/bin/rankguard", "run", "--standalone"]) == "rankguard run"
    assert launcher_of([PY, "-X", "dev", "-m", "torch.distributed.run", "a.py"]) == "torchrun"
    assert launcher_of([PY, "/venv/bin/torchrun", "--standalone", "a.py"]) == "torchrun"
    assert launcher_of([PY, "bench/fault_matrix_launcher.py", "run", "a.py"]) == "rankguard run"
    # not a launcher: another subcommand, a rank, a bench script, a snippet
    assert launcher_of([PY, "-m", "rankguard.cli.main", "status", "d"]) is None
    assert launcher_of([PY, "-u", "-m", "rankguard.launcher.worker", "-m", "x"]) is None
    assert launcher_of([PY, "bench/soak.py", "--smoke"]) is None
    assert launcher_of([PY, "-c", "import torch"]) is None
    assert launcher_of([PY]) is None


def test_interpreters_and_launchers_are_summed_per_test_file(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [
        {"test": "tests/e2e/test_a.py::test_x (call)", "pid": 1, "argv": [PY, "-m", "pytest"]},
        {
            "test": "tests/e2e/test_a.py::test_x (call)",
            "pid": 2,
            "argv": [PY, "-m", "rankguard.cli.main", "run", "s.py"],
        },
        {"test": "tests/e2e/test_a.py::test_y (setup)", "pid": 3, "argv": [PY, "s.py"]},
        {"test": "", "pid": 4, "argv": [PY, "-m", "torch.distributed.run", "s.py"]},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn line\n", encoding="utf-8")
    files = count(log)
    assert set(files) == {"tests/e2e/test_a.py", "(outside a test)"}
    a = files["tests/e2e/test_a.py"]
    assert a.interpreters == 3 and dict(a.launchers) == {"rankguard run": 1}
    assert dict(files["(outside a test)"].launchers) == {"torchrun": 1}
    assert count(tmp_path / "missing.jsonl") == {}
