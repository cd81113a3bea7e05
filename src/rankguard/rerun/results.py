"""Results of a check, compared: pure helpers of the state machine (torch only)."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["gpu_name", "not_finite", "relative_diff", "scalar", "truth"]


def not_finite(value: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(value).all()


def truth(flag: Any) -> bool:
    return bool(flag.item()) if isinstance(flag, torch.Tensor) else bool(flag)


def relative_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """The largest elementwise relative difference of two results; NaN equals NaN and
    an infinity equals itself (the same wrong result is the same result)."""
    if a is None or b is None:
        return math.inf  # the re-run never reached the check: not the same result
    a64, b64 = a.double().cpu(), b.to(a.device).double().cpu()
    if a64.shape != b64.shape:
        return math.inf
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    equal = (a64 == b64) | both_nan
    if bool(equal.all()):
        return 0.0
    if not bool((torch.isfinite(a64) | equal).all() and (torch.isfinite(b64) | equal).all()):
        return math.inf  # a NaN or an infinity on one side only
    scale = torch.maximum(a64.abs(), b64.abs())
    rel = torch.where(equal, torch.zeros_like(a64), (a64 - b64).abs() / scale)
    return float(rel.max())


def scalar(value: torch.Tensor | None) -> float | None:
    if value is None:
        return None
    flat = value.detach().double().reshape(-1).cpu()
    if flat.numel() == 0:
        return None
    if bool(torch.isnan(flat).any()):
        return math.nan
    return float(flat.abs().max()) if flat.numel() > 1 else float(flat[0])


def gpu_name() -> str:
    """``cpu``, or ``cuda:<ordinal> <uuid>`` of the current device."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return "cpu"
    ordinal = torch.cuda.current_device()
    try:
        uuid = str(torch.cuda.get_device_properties(ordinal).uuid)
    except Exception:
        uuid = ""
    return f"cuda:{ordinal} {uuid}".strip()
