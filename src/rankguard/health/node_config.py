"""Node health check settings (``node_health``): the checks a node runs on itself
before each rendezvous round (NIC links, storage) and the watch over its workers
(uninterruptible sleep), beside :mod:`rankguard.health.node_checks` that uses them."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.util.validate import check_number

__all__ = ["NodeHealthConfig"]


@dataclass(kw_only=True, slots=True)
class NodeHealthConfig:
    """What each node checks about itself besides its GPUs (NVRx 0.6/0.7's NIC and
    storage checks, torch elastic's uninterruptible-state timeout)."""

    enabled: bool = field(
        default=False,
        metadata={
            "help": "Check the node's NIC links and storage when its services start and "
            "before each later rendezvous round, and watch its workers for uninterruptible "
            "sleep; results in node_health_node_<n>.json, failures as findings (and the "
            "node excluded with fault_tolerance.exclude_bad_nodes)."
        },
    )
    nic: bool = field(
        default=True,
        metadata={
            "help": "Link state of every physical network interface that is up "
            "(/sys/class/net: operstate, carrier, speed) and every InfiniBand port "
            "(/sys/class/infiniband/*/ports/*/state)."
        },
    )
    nics: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Interfaces or InfiniBand devices to check (eth0, mlx5_0); empty: every "
            "physical one. A named one that is missing is a failure."
        },
    )
    min_link_speed_mbps: int = field(
        default=0,
        metadata={"help": "A link slower than this (Mb/s) fails the check; 0: speed not checked."},
    )
    storage: bool = field(
        default=True,
        metadata={
            "help": "log_dir, checkpoint.save and storage_paths: writable, free space above "
            "min_free_mb, a small write's fsync within fsync_timeout_s."
        },
    )
    storage_paths: list[str] = field(
        default_factory=list,
        metadata={"help": "More directories to check (NVRx's --ft-storage-health-check-path)."},
    )
    min_free_mb: float = field(
        default=1024.0, metadata={"help": "Free space each checked directory needs (MiB)."}
    )
    fsync_timeout_s: float = field(
        default=5.0,
        metadata={"help": "Seconds a small write and its fsync may take in each directory."},
    )
    uninterruptible_timeout_s: float = field(
        default=60.0,
        metadata={
            "help": "A worker in uninterruptible sleep (D state) this long is a finding "
            "(torch elastic's TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT); 0: not watched."
        },
    )
    watch_interval_s: float = field(
        default=5.0, metadata={"help": "Seconds between two looks at the workers' states."}
    )
    sysfs_root: str = field(
        default="/sys", metadata={"help": "Where sysfs is mounted (a copy of it in tests)."}
    )
    procfs_root: str = field(
        default="/proc", metadata={"help": "Where procfs is mounted (a copy of it in tests)."}
    )

    def __post_init__(self) -> None:
        check_number("min_link_speed_mbps", self.min_link_speed_mbps, ge=0)
        check_number("min_free_mb", self.min_free_mb, ge=0)
        check_number("fsync_timeout_s", self.fsync_timeout_s, gt=0)
        check_number("uninterruptible_timeout_s", self.uninterruptible_timeout_s, ge=0)
        check_number("watch_interval_s", self.watch_interval_s, gt=0)
        for name in ("nics", "storage_paths"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"{name}: a list of names, got {value!r}")
