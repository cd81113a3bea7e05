"""`enable_gpu_health_check`: the launcher refuses to start on an unhealthy GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import rankguard_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

FAKE_BIN = Path(__file__).parents[1] / "fakes" / "bin"

SICK_GPU = {
    "index": "0",
    "uuid": "GPU-11111111-2222-3333-4444-555555555555",
    "pci.bus_id": "00000000:18:00.0",
    "name": "NVIDIA H100 80GB HBM3",
    "driver_version": "550.54.15",
    "temperature.gpu": "41",
    "utilization.gpu": "0",
    "memory.used": "1",
    "memory.total": "81559",
    "power.draw": "70.1",
    "power.limit": "700.00",
    "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
    "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
    "ecc.errors.corrected.volatile.total": "0",
    "ecc.errors.uncorrected.volatile.total": "2",
    "retired_pages.pending": "No",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
}


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


def test_unhealthy_gpu_refuses_to_launch(tmp_path: Path) -> None:
    res = launch(tmp_path, [SICK_GPU])
    assert res.returncode == 3, res.stderr
    assert "UNHEALTHY" in res.stderr and "ecc_uncorrected_volatile=2" in res.stderr
    assert not (tmp_path / "never.py.ran").exists()
    snap = json.loads((tmp_path / "heartbeat" / "pre" / "preflight_node_0.json").read_text())
    assert snap["status"] == "unhealthy" and snap["source"] == "nvidia-smi"


def test_healthy_gpu_launches(tmp_path: Path) -> None:
    healthy = {**SICK_GPU, "ecc.errors.uncorrected.volatile.total": "0"}
    res = launch(tmp_path, [healthy])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "never.py.ran").exists()
    assert "1 GPU(s) ok via nvidia-smi" in res.stderr


def test_no_gpu_says_unavailable_and_launches(tmp_path: Path) -> None:
    res = launch(tmp_path, None)
    assert res.returncode == 0, res.stderr
    assert "GPU health check: unavailable" in res.stderr
    assert (tmp_path / "never.py.ran").exists()
