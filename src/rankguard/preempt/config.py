"""Preemption configuration, with Megatron Bridge's names.

``PreemptionPlugin(preempt_time=60, enable_exit_handler=True,
enable_exit_handler_for_data_loader=False)`` and ``train.exit_signal_handler``,
``train.exit_signal``, ``train.exit_signal_handler_for_dataloader`` are both accepted:
the ``train.*`` names are aliases that set the plugin's fields (both given and different
is an error, never a silent choice).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from rankguard.util.validate import check_number

__all__ = ["EXIT_SIGNALS", "PreemptionConfig", "parse_exit_signal"]

EXIT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")
"""The signals a scheduler sends before it stops a job (Slurm's ``--signal``)."""


def parse_exit_signal(value: str | int) -> signal.Signals:
    """``"SIGTERM"``, ``"TERM"``, ``"usr1"`` or a number -> the signal; ValueError unless
    it is one of :data:`EXIT_SIGNALS`."""
    sig: signal.Signals | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            sig = signal.Signals(value)
        except ValueError:
            sig = None
    elif isinstance(value, str):
        name = value.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        sig = getattr(signal, name, None) if name in EXIT_SIGNALS else None
    if sig is None or sig.name not in EXIT_SIGNALS:
        raise ValueError(f"exit_signal: one of {', '.join(EXIT_SIGNALS)}, got {value!r}")
    return sig


@dataclass(kw_only=True, slots=True)
class PreemptionConfig:
    """Save one agreed step and exit to be requeued when the scheduler sends the exit signal."""

    enable_exit_handler: bool = field(
        default=False,
        metadata={
            "help": "Ranks catch the exit signal (a flag only); at one agreed step every "
            "rank saves and leaves, and rankguard run exits with the requeue code (14)."
        },
    )
    preempt_time: float = field(
        default=60.0,
        metadata={
            "help": "Seconds between the exit signal and the end of the grace window: the "
            "launcher then kills what is left. Also sets Slurm's --signal time."
        },
    )
    exit_signal: str | int = field(
        default="SIGTERM", metadata={"help": "SIGTERM | SIGUSR1 | SIGUSR2 (name or number)."}
    )
    enable_exit_handler_for_data_loader: bool = field(
        default=False,
        metadata={
            "help": "DataLoader workers given session.worker_init_fn ignore the exit "
            "signal, so none dies mid-batch and breaks the rank's loop."
        },
    )
    exit_signal_handler: bool | None = field(
        default=None, metadata={"help": "Megatron Bridge's train.* name of enable_exit_handler."}
    )
    exit_signal_handler_for_dataloader: bool | None = field(
        default=None,
        metadata={"help": "train.* name of enable_exit_handler_for_data_loader."},
    )

    def __post_init__(self) -> None:
        check_number("preempt_time", self.preempt_time, gt=0)
        self.exit_signal = parse_exit_signal(self.exit_signal).name
        for alias, name in (
            ("exit_signal_handler", "enable_exit_handler"),
            ("exit_signal_handler_for_dataloader", "enable_exit_handler_for_data_loader"),
        ):
            value = getattr(self, alias)
            if value is None:
                continue
            default = PreemptionConfig.__dataclass_fields__[name].default
            if getattr(self, name) != default and getattr(self, name) != value:
                raise ValueError(f"{alias}={value} contradicts {name}={getattr(self, name)}")
            setattr(self, name, value)
            setattr(self, alias, None)  # one source of truth once applied

    @property
    def signum(self) -> signal.Signals:
        return parse_exit_signal(self.exit_signal)
