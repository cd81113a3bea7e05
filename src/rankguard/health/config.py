"""GPU health collection settings (``heartbeat.hardware_health``), beside the collector
that uses them; :mod:`rankguard.monitor.config` nests them in ``HeartbeatConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.util.validate import check_number

__all__ = ["HardwareHealthConfig"]


@dataclass(kw_only=True, slots=True)
class HardwareHealthConfig:
    """Per-node GPU health collection (NVML first, nvidia-smi as fallback)."""

    enabled: bool = field(default=False, metadata={"help": "Collect GPU health on every node."})
    interval_s: float = field(default=60.0, metadata={"help": "Seconds between collections."})
    command_timeout_s: float = field(
        default=10.0, metadata={"help": "Timeout of one nvidia-smi call; < interval_s."}
    )
    stale_after_s: float | None = field(
        default=None,
        metadata={"help": "Health data older than this is stale; default 3 x interval_s."},
    )

    def __post_init__(self) -> None:
        check_number("interval_s", self.interval_s, gt=0)
        check_number("command_timeout_s", self.command_timeout_s, gt=0)
        if self.stale_after_s is not None:
            check_number("stale_after_s", self.stale_after_s, gt=0)
        if self.command_timeout_s <= 0 or self.command_timeout_s >= self.interval_s:
            raise ValueError(
                f"command_timeout_s: must be > 0 and < interval_s ({self.interval_s}), "
                f"got {self.command_timeout_s}"
            )
        if self.stale_after_s is None:
            self.stale_after_s = 3.0 * self.interval_s
        elif self.stale_after_s <= self.interval_s:
            raise ValueError(
                f"stale_after_s: must be > interval_s ({self.interval_s}), got {self.stale_after_s}"
            )
