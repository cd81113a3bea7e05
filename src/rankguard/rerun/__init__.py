"""Rerun state machine (Megatron-LM's, tested end to end): re-run an iteration whose
result failed a check (NaN/Inf loss, spiky loss, a script's own check) to tell a
transient fault, a faulty GPU and a data or model problem apart. See ``docs/rerun.md``.

The config is torch-free (``rankguard.rerun.config``); the machine imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankguard.rerun.config import RerunStateMachineConfig

if TYPE_CHECKING:
    from rankguard.rerun.machine import (
        Checkpointer,
        ReproducibleFaultError,
        RerunStateMachine,
    )

__all__ = [
    "Checkpointer",
    "ReproducibleFaultError",
    "RerunStateMachine",
    "RerunStateMachineConfig",
]


def __getattr__(name: str) -> Any:  # the machine imports torch: only when asked for
    if name in ("Checkpointer", "ReproducibleFaultError", "RerunStateMachine"):
        from rankguard.rerun import machine

        return getattr(machine, name)
    raise AttributeError(name)
