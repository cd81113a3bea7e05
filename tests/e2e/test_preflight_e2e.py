"""`enable_gpu_health_check`: the launcher starts the job on a healthy GPU and on a machine
without one (real launches: the job's rank runs). The refusal on an unhealthy GPU is
tested in-process in ``tests/tier2/test_preflight_tier2.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import SICK_GPU

from .conftest import rankguard_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

FAKE_BIN = Path(__file__).parents[1] / "fakes" / "bin"


def launch(tmp_path: Path, gpus: list[dict[str, str]] | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_SMI_")}
    if gpus is not None:
        env["PATH"] = f"{FAKE_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["FAKE_SMI_GPUS"] = json.dumps(gpus)
    else:  # no nvidia-smi at all
        env["PATH"] = os.path.dirname(sys.executable)
    script = tmp_path / "never.py"
    script.write_text("open(__file__ + '.ran', 'w').write('ran')\n")
    return subprocess.run(
        rankguard_cmd(
            "run",
            "--standalone",
            "--rdzv-id",
            "pre",
            "--log-dir",
            str(tmp_path),
            "enable_gpu_health_check=true",
            str(script),
        ),
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_healthy_gpu_launches(tmp_path: Path) -> None:
    """A real launch: the check passes and the job's rank runs."""
    healthy = {**SICK_GPU, "ecc.errors.uncorrected.volatile.total": "0"}
    res = launch(tmp_path, [healthy])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "never.py.ran").exists()
    assert "1 GPU(s) ok via nvidia-smi" in res.stderr


def test_no_gpu_says_unavailable_and_launches(tmp_path: Path) -> None:
    """A real launch: without nvidia-smi on PATH the check says so and the rank runs."""
    res = launch(tmp_path, None)
    assert res.returncode == 0, res.stderr
    assert "GPU health check: unavailable" in res.stderr
    assert (tmp_path / "never.py.ran").exists()
