"""The rerun state machine's collectives on the training process group: every rank takes
the same decision. Alone (no process group, or a group of one) each is a local no-op.

Per iteration only :meth:`Agreement.any_true` runs (``agreement="all_reduce"``): the
local flags are combined on the device and one small MAX all-reduce carries them; the
host reads its result once. The others run once (:meth:`same_int`, at the first
iteration) or only after a failed check (:meth:`max`, :meth:`gather`, :meth:`barrier`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Agreement"]


class Agreement:
    def __init__(self, group: Any = None) -> None:
        on = dist.is_available() and dist.is_initialized()
        self.group = group
        self.rank = dist.get_rank() if on else 0
        self.world_size = dist.get_world_size(group) if on else 1
        self.distributed = on and self.world_size > 1
        self.device = torch.device("cpu")
        if on and dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def any_true(self, flags: list[Any]) -> bool:
        """Is any flag (a bool or a bool tensor) true on any rank?"""
        tensors = [f for f in flags if isinstance(f, torch.Tensor)]
        local_true = any(f is True for f in flags)
        if not self.distributed:
            if local_true:
                return True
            return bool(torch.stack(tensors).any()) if tensors else False
        t = torch.full((), int(local_true), dtype=torch.int32, device=self.device)
        if tensors:
            t = t + torch.stack([f.to(self.device) for f in tensors]).any().int()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t)

    def max(self, flags: list[bool]) -> list[bool]:
        """Each flag, true if it is true on any rank."""
        if not self.distributed:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in t.tolist()]

    def same_int(self, value: int) -> tuple[int, int]:
        """The lowest and the highest ``value`` over the ranks."""
        if not self.distributed:
            return value, value
        t = torch.tensor([value, -value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return -int(t[1]), int(t[0])

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (a small picklable object; the rare exit 17 path)."""
        if not self.distributed:
            return [obj]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, obj, group=self.group)
        return everyone

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)
