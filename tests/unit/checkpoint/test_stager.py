"""The host stager: a DTensor is staged as a DTensor (its local shard copied, its mesh and
placements kept), found without importing DTensor's module in a rank that has none."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = """
import os, sys, tempfile
import torch, torch.distributed as dist
from rankguard.checkpoint.stager import HostStager, dtensor_type
assert dtensor_type() is None and "torch.distributed.tensor" not in sys.modules
with tempfile.TemporaryDirectory() as d:
    dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh("cpu", (1,))
    dt = distribute_tensor(torch.arange(6.0).reshape(2, 3), mesh, [Shard(0)])
    stager = HostStager()
    staged = stager.stage({"w": dt, "plain": torch.ones(2), "n": 3})
    w = staged["w"]
    assert dtensor_type() is DTensor and isinstance(w, DTensor), type(w)
    assert w.placements == dt.placements and w.device_mesh == mesh and w.shape == dt.shape
    assert torch.equal(w.to_local(), dt.to_local())
    assert w.to_local().data_ptr() != dt.to_local().data_ptr()  # a copy, not the shard
    assert torch.equal(staged["plain"], torch.ones(2)) and staged["n"] == 3
    dist.destroy_process_group()
print("ok")
"""


def test_a_dtensor_is_staged_with_its_placement() -> None:
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok"), res.stdout
