"""A rank's identity, from the environment contract with the launcher.

The launcher passes everything a rank needs through environment variables (names in
:data:`ENV`, parsed by :class:`rankguard.rank.runenv.RunEnv`), so a rank started by
``rankguard run`` needs no argument and a script that never imports rankguard still
publishes heartbeats. ``ENV`` is re-exported here for the callers that import it from
this module.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rankguard.rank.runenv import ENV, RunEnv
from rankguard.schema.records import SCHEMA_VERSION

__all__ = ["ENV", "GpuAssignment", "RankIdentity"]


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
    def detect(
        cls, local_rank: int, environ: Mapping[str, str] | None = None
    ) -> GpuAssignment | None:
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
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankIdentity:
        """This rank's identity from ``environ`` (default: this process's)."""
        return cls.from_runenv(RunEnv.from_environ(environ))

    @classmethod
    def from_runenv(cls, env: RunEnv, *, run_id: str | None = None) -> RankIdentity:
        """This rank's identity from the parsed environment (``run_id`` overrides the
        launcher's; ``local`` when neither names one)."""
        visible = env.cuda_visible_devices
        return cls(
            run_id=run_id or env.run_id or "local",
            rank=env.rank,
            local_rank=env.local_rank,
            world_size=env.world_size,
            node_rank=env.node,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu=GpuAssignment.detect(
                env.local_rank, {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
            ),
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
