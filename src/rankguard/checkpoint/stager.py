"""Staging: the copy of the state into host memory, the only part of an async save the
training loop waits for.

:class:`HostStager` implements DCP's ``AsyncStager`` protocol. Its host buffers are
allocated at the first save and reused by every later one (pinned when the state is on
a GPU and ``pin_memory`` is set), so a save costs one memcpy of the state and no
allocation or page fault; the next save only starts once the previous write finished
with the buffers (the manager waits). DTensors keep their placement: the local shard is
copied and wrapped again. Non-tensor leaves are deep-copied (they are small).

The copy is complete when :meth:`HostStager.stage` returns (GPU copies are issued
non-blocking and synchronized once at the end), so what is written is the state at
the save call whatever the loop does next. Overlapping the copy with the next
forward/backward cannot be made safe: a write through ``param.data``, a NumPy view or
a raw pointer (a collective's output, an extension's kernel) does not move the
tensor's version counter, so no check at the end of a background copy could see it.
"""

from __future__ import annotations

import copy
import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["HostStager", "dtensor_type"]


def dtensor_type() -> type[DTensor] | None:
    """``DTensor`` if a DTensor can exist here: its module is imported (a state dict
    holds one only then). Importing it to ask would cost a rank that never shards a
    second at every start (it imports ``torch._dynamo``)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


class HostStager:
    """Cached host-memory copy of a state dict (DCP ``AsyncStager``), complete at return."""

    _synchronize_after_execute = False

    def __init__(self, *, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._buffers: dict[str, torch.Tensor] = {}
        self._cuda = False
        self.bytes = 0

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A host copy of ``state_dict`` (tensors into the cached buffers, everything
        else deep-copied), complete when this returns."""
        self._cuda = False
        with torch.no_grad():
            out = self._copy(state_dict, "")
        if self._cuda:
            torch.cuda.synchronize()
        return out

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` returns a complete copy."""

    def close(self) -> None:
        self._buffers.clear()
        self.bytes = 0

    def _buffer(self, key: str, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(
                src.shape,
                dtype=src.dtype,
                device="cpu",
                pin_memory=self.pin_memory and src.device.type == "cuda",
            )
            self._buffers[key] = buf
            self.bytes = sum(b.numel() * b.element_size() for b in self._buffers.values())
        return buf

    def _copy(self, obj: Any, key: str) -> Any:
        dtensor = dtensor_type()
        if dtensor is not None and isinstance(obj, dtensor):
            local = obj.to_local()
            staged = self._tensor(local, key)
            return dtensor.from_local(
                staged,
                obj.device_mesh,
                obj.placements,
                run_check=False,
                shape=obj.shape,
                stride=obj.stride(),
            )
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, key)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}.{k}") for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, f"{key}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, f"{key}.{i}") for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, src: torch.Tensor, key: str) -> torch.Tensor:
        src = src.detach()
        buf = self._buffer(key, src)
        if src.device.type == "cuda":
            self._cuda = True
            buf.copy_(src, non_blocking=True)
        else:
            buf.copy_(src)
        return buf
