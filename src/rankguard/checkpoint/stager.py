"""Staging: the copy of the state into host memory, the only part of an async save the
training loop may wait for.

:class:`HostStager` implements DCP's ``AsyncStager`` protocol. Its host buffers are
allocated at the first save and reused by every later one (pinned when the state is on
a GPU and ``pin_memory`` is set), so a save costs one memcpy of the state and no
allocation or page fault; the next save only starts once the previous write finished
with the buffers (the manager waits). DTensors keep their placement: the local shard is
copied and wrapped again. Non-tensor leaves are deep-copied (they are small).

Background staging: tensors whose storage is in ``deferred`` (the parameters an
optimizer steps and that optimizer's state: they change only in ``optimizer.step()``)
are copied by a staging thread while the loop runs the next forward and backward;
``stage`` then returns a Future that DCP's writer waits for, and the manager's
optimizer pre-step hook makes the next ``optimizer.step()`` wait until the copy is done.
Everything else (buffers such as BatchNorm statistics, which the forward pass changes)
is copied before ``stage`` returns.
"""

from __future__ import annotations

import concurrent.futures
import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["HostStager"]

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch without distributed tensors
    DTensor = None  # type: ignore[assignment,misc]


class HostStager:
    """Cached host-memory copy of a state dict (DCP ``AsyncStager``)."""

    _synchronize_after_execute = False

    def __init__(self, *, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._buffers: dict[str, torch.Tensor] = {}
        self._cuda = False
        self.bytes = 0
        self.deferred: set[int] = set()  # storage pointers the staging thread may copy
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._pool: ThreadPoolExecutor | None = None
        self.future: Future[dict[str, Any]] | None = None  # the copy in flight

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | Future[dict[str, Any]]:
        self._cuda = False
        self._pending = []
        out = self._copy(state_dict, "")
        if self._cuda:
            torch.cuda.synchronize()
        if not self._pending:
            return out
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankguard-stage")
        pending, self._pending = self._pending, []
        self.future = self._pool.submit(_copy_all, pending, out)
        return self.future

    def wait_copy(self) -> float:
        """Wait for the background copy (not its error: the writer reports that) and
        forget it; the seconds waited."""
        future, self.future = self.future, None
        if future is None or future.done():
            return 0.0
        t0 = time.monotonic()
        concurrent.futures.wait([future])
        return time.monotonic() - t0

    def synchronize_staging(self) -> None:
        """Wait for the background copy (re-raising its error)."""
        future = self.future
        if future is not None:
            future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
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
        if DTensor is not None and isinstance(obj, DTensor):
            local = obj.to_local()
            staged = self._tensor(local, key)
            return DTensor.from_local(
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
        if not src.is_contiguous():
            src = src.contiguous()
        buf = self._buffer(key, src)
        if self.deferred and src.untyped_storage().data_ptr() in self.deferred:
            self._pending.append((buf, src))
        elif src.device.type == "cuda":
            self._cuda = True
            buf.copy_(src, non_blocking=True)
        else:
            buf.copy_(src)
        return buf


def _copy_all(
    pending: list[tuple[torch.Tensor, torch.Tensor]], out: dict[str, Any]
) -> dict[str, Any]:
    with torch.no_grad():
        for dst, src in pending:
            dst.copy_(src)
    if any(src.device.type == "cuda" for _, src in pending):
        torch.cuda.synchronize()
    return out
