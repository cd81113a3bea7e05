"""A rank's identity and the environment contract with the launcher.

The launcher passes everything a rank needs through environment variables (names in
:data:`ENV`), so a rank started by ``rankguard run`` needs no argument and a script that
never imports rankguard still publishes heartbeats.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from rankguard.schema.records import SCHEMA_VERSION

__all__ = ["ENV", "GpuAssignment", "RankIdentity"]


class ENV:
    """Environment variables set by the launcher for every rank."""

    RUN_ID = "RANKGUARD_RUN_ID"
    RUN_DIR = "RANKGUARD_RUN_DIR"  # node-local heartbeat directory of the run
    NODE_RANK = "RANKGUARD_NODE_RANK"
    CONFIG = "RANKGUARD_CONFIG"  # JSON of the validated RankguardConfig
    LAUNCHER = "RANKGUARD_LAUNCHER"  # "1" under rankguard run
    LOG_DIR = "RANKGUARD_LOG_DIR"  # absolute log_dir of this node
    JOB = "RANKGUARD_JOB"  # the training job: its script (absolute) or module
    LAUNCHER_PID = "RANKGUARD_LAUNCHER_PID"  # the ranks die with it (heartbeat.lifeline)
    # set by the sbatch script: where an exit 17 leaves the hosts to exclude (rerun)
    EXCLUDE_FILE = "RANKGUARD_EXCLUDE_FILE"


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """The GPU a rank uses: visible ordinal and the CUDA_VISIBLE_DEVICES token."""

    ordinal: int
    token: str

    @property
    def uuid(self) -> str | None:
        return self.token if self.token.startswith(("GPU-", "MIG-")) else None

    def to_json(self) -> dict[str, Any]:
        return {"ordinal": self.ordinal, "token": self.token, "uuid": self.uuid}

    @classmethod
    def detect(cls, local_rank: int, environ: dict[str, str] | None = None) -> GpuAssignment | None:
        """The conventional mapping (device = local_rank % visible devices), or None on CPU.

        Only asks torch how many devices exist; never creates a CUDA context.
        """
        env = os.environ if environ is None else environ
        try:
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:
            count = 0
        if count <= 0:
            return None
        ordinal = local_rank % count
        visible = env.get("CUDA_VISIBLE_DEVICES")
        tokens = [t.strip() for t in visible.split(",")] if visible else []
        token = tokens[ordinal] if ordinal < len(tokens) else str(ordinal)
        return cls(ordinal=ordinal, token=token)


@dataclass(frozen=True, slots=True)
class RankIdentity:
    run_id: str
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    hostname: str
    pid: int
    gpu: GpuAssignment | None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RankIdentity:
        env = dict(os.environ if environ is None else environ)
        local_rank = int(env.get("LOCAL_RANK", "0"))
        return cls(
            run_id=env.get(ENV.RUN_ID, "local"),
            rank=int(env.get("RANK", "0")),
            local_rank=local_rank,
            world_size=int(env.get("WORLD_SIZE", "1")),
            node_rank=int(env.get(ENV.NODE_RANK, env.get("GROUP_RANK", "0"))),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu=GpuAssignment.detect(local_rank, env),
        )

    def base_record(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "hostname": self.hostname,
            "node_rank": self.node_rank,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "pid": self.pid,
            "gpu": self.gpu.to_json() if self.gpu else None,
        }
