"""The checkpoint's own process group: a gloo group beside the training one, so the
background writer's collectives (DCP's plan and write steps, the commit's gather, the
replicas' send/recv) never interleave with the training loop's collectives. Without
torch.distributed (one process) every call is local.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CheckpointGroup"]


class CheckpointGroup:
    """Rank, world size and the few collectives the checkpoint layer uses."""

    def __init__(self, process_group: Any = None, *, timeout_s: float = 600.0) -> None:
        self.pg: Any = None
        self.rank = 0
        self.world = 1
        if not (dist.is_available() and dist.is_initialized()):
            return
        ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
        # collective over the default group: every rank builds its manager at the same time
        self.pg = dist.new_group(ranks=ranks, backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.rank = dist.get_rank(self.pg)
        self.world = dist.get_world_size(self.pg)
        self.global_ranks = dist.get_process_group_ranks(self.pg)

    @property
    def distributed(self) -> bool:
        return self.pg is not None and self.world > 1

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.global_ranks[0], group=self.pg)
        return box[0]

    def errors(self, error: str | None) -> list[str]:
        """Every rank's error (None: fine), gathered: a decision all ranks share."""
        return [e for e in self.all_gather(error) if e]

    def exchange(self, send_to: list[int], recv_from: list[int], data: bytes) -> list[bytes]:
        """Send ``data`` to each rank of ``send_to`` and receive one buffer from each of
        ``recv_from`` (group ranks, same length, in lockstep: a ring)."""
        out = []
        for dst, src in zip(send_to, recv_from, strict=True):
            size = torch.tensor([len(data)], dtype=torch.int64)
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
            reqs = [dist.isend(size, self.global_ranks[dst], group=self.pg)]
            if payload is not None:
                reqs.append(dist.isend(payload, self.global_ranks[dst], group=self.pg))
            assert all(r is not None for r in reqs)
            got = torch.empty(1, dtype=torch.int64)
            dist.recv(got, self.global_ranks[src], group=self.pg)
            buf = torch.empty(int(got.item()), dtype=torch.uint8)
            if buf.numel():
                dist.recv(buf, self.global_ranks[src], group=self.pg)
            for req in reqs:
                req.wait()  # type: ignore[union-attr]
            out.append(buf.numpy().tobytes())
        return out

    def send(self, dst: int, data: bytes) -> None:
        dist.send(
            torch.tensor([len(data)], dtype=torch.int64), self.global_ranks[dst], group=self.pg
        )
        if data:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            dist.send(payload, self.global_ranks[dst], group=self.pg)

    def recv(self, src: int) -> bytes:
        got = torch.empty(1, dtype=torch.int64)
        dist.recv(got, self.global_ranks[src], group=self.pg)
        buf = torch.empty(int(got.item()), dtype=torch.uint8)
        if buf.numel():
            dist.recv(buf, self.global_ranks[src], group=self.pg)
        return buf.numpy().tobytes()

    def destroy(self) -> None:
        if self.pg is not None and dist.is_initialized():
            with contextlib.suppress(RuntimeError, ValueError):
                dist.destroy_process_group(self.pg)
        self.pg = None
