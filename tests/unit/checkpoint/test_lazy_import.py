"""DCP is imported at a rank's first checkpoint save or load, not when the checkpoint
layer is imported: a rank that never checkpoints (or checks for one and finds none)
starts without paying for DCP's import (DTensor, sympy: about as long as torch's).
The host stager asks whether a value is a DTensor without importing DTensor's module."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = """
import sys, tempfile, torch
from pathlib import Path
from rankguard.checkpoint import CheckpointConfig, CheckpointManager, RNGState
import rankguard.demo.train  # the demo imports the whole checkpoint layer
print("dtensor", "torch.distributed.tensor" in sys.modules)  # (an optimizer imports it)
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with tempfile.TemporaryDirectory() as d:
    cfg = CheckpointConfig(save=str(Path(d) / "ckpt"), save_interval=1)
    ckpt = CheckpointManager(cfg, {"model": model, "optim": opt, "rng": RNGState()})
    assert ckpt.load_latest() is None  # nothing saved yet
    print("before", "torch.distributed.checkpoint" in sys.modules)
    ckpt.save(1)
    ckpt.close()
    print("after", "torch.distributed.checkpoint" in sys.modules)
"""


def test_dcp_is_imported_at_the_first_save_not_before() -> None:
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "before False" in res.stdout and "after True" in res.stdout, res.stdout
    assert "dtensor False" in res.stdout, res.stdout  # nor DTensor's
