"""A user's mistake on ``rankguard run``'s line: one line naming it, exit 2, no rank.

Configuration mistakes are found before torch is imported: the test measures the CPU
time of the whole command (interpreter start included), which does not depend on how
loaded the machine is, and bounds the wall time generously. The other mistakes (an
unknown key, a missing script, a busy port, ``--no-python -m``) are tested in-process
through ``run_main`` in ``tests/tier2/test_run_errors_tier2.py``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import rankguard_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# torch's own import prints this warning in some environments (not rankguard's)
_FOREIGN = ("The pynvml package is deprecated", "import pynvml")


def _run(args: list[str], cwd: Path) -> tuple[int, list[str], float, float]:
    """Exit code, stderr lines (torch's import warnings left out), wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(
        rankguard_cmd(*args),
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stderr.splitlines() if not any(f in ln for f in _FOREIGN)]
    assert proc.stdout == "", proc.stdout
    return proc.returncode, lines, wall, cpu


def _nothing_started(log_dir: Path) -> None:
    assert not list(log_dir.rglob("rank_*")), sorted(log_dir.rglob("*"))


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a rank must not start')\n")
    return script


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["--config", "{bad}"], "not valid YAML"),
        # a directory nothing can be created in, though access() calls it writable for
        # root: torch's own makedirs of its log-spec directory ended in a traceback
        pytest.param(
            ["--set", "log_dir=/proc/x"],
            "log_dir /proc/x: cannot be created",
            marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc"),
        ),
        # torchrun's --log-dir, where the configuration roots rankguard's files elsewhere
        pytest.param(
            ["--log-dir", "/proc/x"],
            "--log-dir /proc/x: cannot be created",
            marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc"),
        ),
        (["--nproc-per-node", "0"], "--nproc-per-node: must be >= 1, got 0"),
        # the learned timeouts' directory: written at the end of the run (a traceback)
        pytest.param(
            [
                "fault_tolerance.calc_ft_timeouts=true",
                "fault_tolerance.state_dir=/proc/y",
            ],
            "fault_tolerance.state_dir /proc/y: cannot be created",
            marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc"),
        ),
    ],
    ids=[
        "malformed-yaml",
        "log-dir-in-proc",
        "torch-log-dir-in-proc",
        "nproc-0",
        "ft-state-dir-in-proc",
    ],
)
def test_a_config_error_is_one_line_at_once(words: list[str], says: str, tmp_path: Path) -> None:
    """A real command: the CPU time of the whole process (interpreter start included)
    shows that torch is not imported before a config error is said."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("heartbeat: [1,\nperf: 2\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    script = _script(tmp_path)
    words = [w.format(bad=bad, file=afile) for w in words]
    log = ["--set", f"log_dir={tmp_path / 'rg'}"] if "log_dir" not in " ".join(words) else []
    code, lines, wall, cpu = _run(["run", *log, *words, str(script)], tmp_path)
    assert code == 2 and len(lines) == 1 and says in lines[0], lines
    assert lines[0].startswith("rankguard run: ")
    assert "Traceback" not in lines[0]
    assert cpu < 1.0, f"{cpu:.2f} s of CPU: torch was imported?"
    assert wall < 6.0, wall
    print(f"config error: {wall:.2f} s wall, {cpu:.2f} s CPU")
    _nothing_started(tmp_path)
