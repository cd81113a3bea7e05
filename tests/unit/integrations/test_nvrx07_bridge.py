"""NVRx 0.7.0's own ``RankMonitorClient`` against rankguard's bridge: the client and the
bridge run in one child process that imports NVRx 0.7.0 (the release's files first on
``PYTHONPATH``, see tests/nvrx_release.py), as a rank does where 0.7 is installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.nvrx_release import VERSION, release_env, release_path

pytestmark = pytest.mark.timeout(120)

# a Megatron-LM-like loop: 4,000 steps, each a step section and a heartbeat (12,000
# messages the 0.7 client sends without reading a reply), the iteration read from
# Megatron's global args as 0.7's client reads it
_CHILD = textwrap.dedent(
    """
    import json, os, sys, tempfile, types
    from pathlib import Path

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.pop("FT_RANK_MONITOR_IPC_SOCKET", None)
    args = types.SimpleNamespace(curr_iteration=100)
    sys.modules["megatron.training.global_vars"] = types.SimpleNamespace(_GLOBAL_ARGS=args)

    import nvidia_resiliency_ext.fault_tolerance as nvrx_ft
    from rankguard.ft.config import FaultToleranceConfig
    from rankguard.ft.launcher_flags import nvrx_version
    from rankguard.monitor.config import HeartbeatConfig
    from rankguard.integrations.nvrx import RankMonitorBridge, nvrx_config_from
    from rankguard.rank.timeline import ProgressTracker

    class Session:
        def __init__(self):
            self.tracker = ProgressTracker()
            self.steps = 0
        def step_end(self, iteration=None):
            self.steps += 1
        def set_phase(self, name):
            self.tracker.set_phase(name)
        def checkpoint_start(self, checkpoint_id=None):
            self.tracker.checkpoint_start(checkpoint_id)
        def checkpoint_end(self):
            self.tracker.checkpoint_end()

    ft = FaultToleranceConfig(
        rank_section_timeouts={"setup": 600.0, "step": 180.0, "checkpointing": 420.0},
        rank_out_of_section_timeout=300.0,
    )
    cfg = nvrx_config_from(ft, HeartbeatConfig(enabled=True))
    session = Session()
    bridge = RankMonitorBridge(
        session, cfg, rank=0, socket_dir=Path(tempfile.mkdtemp())
    ).start()
    client = nvrx_ft.RankMonitorClient()
    client.init_workload_monitoring(num_warmup_iters=5)
    client.start_section("setup")
    client.end_section("setup")
    for i in range(4000):
        args.curr_iteration = 101 + i
        client.start_section("step")
        client.end_section("step")
        client.send_heartbeat()
    client.start_section("checkpointing")
    client.end_section("checkpointing")
    import torch.distributed as dist  # the timeouts calculation agrees across ranks
    dist.init_process_group(
        "gloo", init_method=f"file://{tempfile.mkdtemp()}/pg", rank=0, world_size=1
    )
    client.calculate_and_set_hb_timeouts()  # reads its reply: the one it waits for
    block = bridge.heartbeat_block()
    client.shutdown_workload_monitoring()
    bridge.close()
    dist.destroy_process_group()
    print(json.dumps({
        "version": ".".join(map(str, nvrx_version() or ())),
        "module": nvrx_ft.__file__,
        "skip": cfg.skip_section_response,
        "steps": session.steps,
        "fields": {"nvrx": block.to_dict()} if block is not None else None,
    }))
    """
)


def test_nvrx_07_client_healthy_loop_is_served() -> None:
    path = release_path()
    src = Path(__file__).resolve().parents[3] / "src"
    env = release_env(path)
    env["PYTHONPATH"] = f"{path}:{src}"
    res = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["version"] == VERSION and out["module"].startswith(str(path)), out
    assert out["skip"] is True  # 0.7's default: no reply to heartbeats and sections
    assert out["steps"] == 4000
    nvrx = out["fields"]["nvrx"]
    assert nvrx["heartbeats"] == 4000
    assert nvrx["open_sections"] == []
    assert nvrx["init_iteration"] == 100 and nvrx["num_warmup_iters"] == 5
    assert nvrx["iteration"] == 4100
    assert "calculated_timeouts" in nvrx
    assert not nvrx.get("errors"), nvrx
    # rank 0 says the timeouts as NVRx writes them (Megatron Bridge's check greps these)
    sections = (
        "SectionTimeouts(out_of_section=300.00, sections=[setup=600.00, step=180.00, "
        "checkpointing=420.00, ], calculated_sections=set(), is_out_of_section_calculated=False)"
    )
    assert f"[FaultTolerance] rank monitor serving the client (rankguard): Timeouts={sections}" in (
        res.stderr
    )
    assert f"[RankMonitorServer] section timeouts: {sections} heartbeat timeouts: " in res.stderr
