"""``enable_gpu_health_check``, in-process (``run_main``): the launcher refuses to start
on an unhealthy GPU (the fake nvidia-smi of ``tests/fakes/bin``), before any rank. The
end-to-end tests beside it launch a job on a healthy GPU and on none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankguard.cli.main import run_main
from tests.factories import SICK_GPU

pytestmark = pytest.mark.timeout(60)


def test_unhealthy_gpu_refuses_to_launch(
    tmp_path: Path, fake_smi: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_smi.setenv("FAKE_SMI_GPUS", json.dumps([SICK_GPU]))
    script = tmp_path / "never.py"
    script.write_text("open(__file__ + '.ran', 'w').write('ran')\n")
    code = run_main(
        [
            "--standalone",
            "--rdzv-id",
            "pre",
            "--log-dir",
            str(tmp_path),
            "enable_gpu_health_check=true",
            str(script),
        ]
    )
    err = capsys.readouterr().err
    assert code == 3, err
    assert "UNHEALTHY" in err and "ecc_uncorrected_volatile=2" in err
    assert not (tmp_path / "never.py.ran").exists()
    snap = json.loads((tmp_path / "heartbeat" / "pre" / "preflight_node_0.json").read_text())
    assert snap["status"] == "unhealthy" and snap["source"] == "nvidia-smi"
