"""Checkpointing configuration (root key ``checkpoint``; Megatron Bridge's key names).

``save``/``load``/``save_interval``/``async_save``/``ckpt_format``/``most_recent_k`` and the
``non_persistent_*`` keys are the names of Megatron Bridge's ``CheckpointConfig``;
``replication``, ``replication_jump`` and ``replication_factor`` are Megatron-LM's (NVRx's
clique replication of local checkpoints). The rest are rankguard's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rankguard.util.validate import check_number

if TYPE_CHECKING:
    from rankguard.rank.runenv import RunEnv

__all__ = [
    "ASYNC_TYPES",
    "CHECKSUMS",
    "FORMATS",
    "LOCAL_ALGOS",
    "WRITE_PRIORITIES",
    "CheckpointConfig",
]

FORMATS = ("torch_dist", "torch")
LOCAL_ALGOS = ("fully_parallel", "atomic")
ASYNC_TYPES = ("thread", "process")
CHECKSUMS = ("crc32", "blake2b")
WRITE_PRIORITIES = ("normal", "idle")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Where, how often and how checkpoints are written; validated at construction."""

    save: str | None = field(
        default=None, metadata={"help": "Directory of the persistent checkpoints (shared)."}
    )
    load: str | None = field(
        default=None, metadata={"help": "Directory to resume from; default: save."}
    )
    save_interval: int | None = field(
        default=None, metadata={"help": "Persistent checkpoint every N steps (maybe_save)."}
    )
    async_save: bool = field(
        default=False,
        metadata={"help": "Write in the background; the loop waits only for the host copy."},
    )
    ckpt_format: str = field(
        default="torch_dist",
        metadata={"help": "torch_dist (DCP, sharded, async) | torch (one torch.save file)."},
    )
    async_checkpointer_type: str = field(
        default="thread",
        metadata={"help": "DCP's background writer for async saves: thread | process."},
    )
    async_write_priority: str = field(
        default="normal",
        metadata={
            "help": "CPU priority of the thread writer's write (async_checkpointer_type: "
            "thread): normal (the training's) | idle (Linux SCHED_IDLE: the write runs "
            "when a core would idle, for at most async_idle_max_s, then at the "
            "training's priority; needs CAP_SYS_NICE or RLIMIT_NICE, else normal with "
            "a warning)."
        },
    )
    async_idle_max_s: float = field(
        default=30.0,
        metadata={
            "help": "async_write_priority=idle, and the process writer (always in "
            "SCHED_IDLE): seconds of a write in SCHED_IDLE before it goes on at the "
            "training's priority (bounds the time to a durable checkpoint when the "
            "training leaves no core idle)."
        },
    )
    most_recent_k: int | None = field(
        default=3, metadata={"help": "Persistent checkpoints kept (null: all)."}
    )
    non_persistent_ckpt_type: str | None = field(
        default=None, metadata={"help": "local: node-local checkpoints (with replicas); null."}
    )
    non_persistent_local_ckpt_dir: str | None = field(
        default=None, metadata={"help": "Node-local directory of the local tier."}
    )
    non_persistent_save_interval: int | None = field(
        default=None, metadata={"help": "Local checkpoint every N steps (1: every step)."}
    )
    non_persistent_local_ckpt_algo: str = field(
        default="fully_parallel",
        metadata={
            "help": "fully_parallel: every rank writes its own shard at once | atomic: "
            "the same, one rank after another on a node (less disk contention)."
        },
    )
    non_persistent_most_recent_k: int | None = field(
        default=2, metadata={"help": "Local checkpoints kept per rank (null: all)."}
    )
    replication: bool = field(
        default=False, metadata={"help": "Copy each rank's local shard to peer ranks."}
    )
    replication_jump: int | None = field(
        default=None,
        metadata={"help": "Rank distance to a replica holder; default the local world size."},
    )
    replication_factor: int = field(
        default=2, metadata={"help": "Copies of each local shard, the rank's own included."}
    )
    checksum: str = field(
        default="crc32", metadata={"help": "Per-file checksum of the manifest: crc32 | blake2b."}
    )
    stage_in_background: bool = field(
        default=False,
        metadata={
            "help": "No effect (true: a warning): an async save returns once the state "
            "is copied to host memory, so it holds the state at the save call."
        },
    )
    pin_memory: bool = field(
        default=True, metadata={"help": "Pinned host buffers for async staging (CUDA only)."}
    )
    dist_timeout_s: float = field(
        default=600.0, metadata={"help": "Timeout of the checkpoint process group's calls."}
    )

    def __post_init__(self) -> None:
        if self.ckpt_format not in FORMATS:
            raise ValueError(f"ckpt_format: one of {list(FORMATS)}, got {self.ckpt_format!r}")
        if self.async_save and self.ckpt_format != "torch_dist":
            raise ValueError(
                f"async_save=true needs checkpoint.ckpt_format=torch_dist, got "
                f"checkpoint.ckpt_format={self.ckpt_format!r} (an async save of another "
                "format would not be written in the background): set "
                "checkpoint.ckpt_format=torch_dist or checkpoint.async_save=false"
            )
        if self.async_checkpointer_type not in ASYNC_TYPES:
            raise ValueError(
                f"async_checkpointer_type: one of {list(ASYNC_TYPES)}, "
                f"got {self.async_checkpointer_type!r}"
            )
        if self.async_write_priority not in WRITE_PRIORITIES:
            raise ValueError(
                f"async_write_priority: one of {list(WRITE_PRIORITIES)}, "
                f"got {self.async_write_priority!r}"
            )
        check_number("async_idle_max_s", self.async_idle_max_s, gt=0)
        if self.non_persistent_ckpt_type not in (None, "local"):
            raise ValueError(
                f"non_persistent_ckpt_type: 'local' or null, got {self.non_persistent_ckpt_type!r}"
            )
        if self.non_persistent_local_ckpt_algo not in LOCAL_ALGOS:
            raise ValueError(
                f"non_persistent_local_ckpt_algo: one of {list(LOCAL_ALGOS)}, "
                f"got {self.non_persistent_local_ckpt_algo!r}"
            )
        if self.checksum not in CHECKSUMS:
            raise ValueError(f"checksum: one of {list(CHECKSUMS)}, got {self.checksum!r}")
        for name in (
            "save_interval",
            "non_persistent_save_interval",
            "replication_jump",
            "most_recent_k",
            "non_persistent_most_recent_k",
        ):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), ge=1)
        check_number("replication_factor", self.replication_factor, ge=1)
        check_number("dist_timeout_s", self.dist_timeout_s, gt=0)
        if self.save_interval is not None and not self.save:
            raise ValueError("save_interval: set, but save (the directory) is not")
        if self.non_persistent_ckpt_type == "local" and not self.non_persistent_local_ckpt_dir:
            raise ValueError("non_persistent_ckpt_type='local' needs non_persistent_local_ckpt_dir")
        if self.non_persistent_save_interval is not None and self.non_persistent_ckpt_type is None:
            raise ValueError(
                "non_persistent_save_interval: set, but non_persistent_ckpt_type is null "
                "(set it to 'local')"
            )

    @classmethod
    def from_run(cls, env: RunEnv | None = None) -> CheckpointConfig | None:
        """The ``checkpoint`` section of the config ``rankguard run`` gave this rank
        (``env``: default, this process's environment), or None outside the launcher."""
        from rankguard.rank.runenv import current

        return (env or current()).section("checkpoint", cls)

    @property
    def local_enabled(self) -> bool:
        return self.non_persistent_ckpt_type == "local"

    @property
    def load_dir(self) -> str | None:
        return self.load or self.save

    def warnings(self) -> list[str]:
        """Valid settings that do not do what they seem to."""
        out = []
        if self.replication and not self.local_enabled:
            out.append(
                "checkpoint.replication=true has NO effect without "
                "checkpoint.non_persistent_ckpt_type=local"
            )
        if self.local_enabled and self.non_persistent_save_interval is None:
            out.append(
                "checkpoint.non_persistent_ckpt_type=local but "
                "checkpoint.non_persistent_save_interval is unset: maybe_save() writes no "
                "local checkpoint (call save(step, tier='local') yourself)"
            )
        if self.stage_in_background:
            out.append(
                "checkpoint.stage_in_background=true has NO effect: an async save copies "
                "the whole state before save() returns (a write through param.data or a "
                "NumPy view is invisible to a tensor's version counter, so no copy may "
                "overlap the loop)"
            )
        return out
