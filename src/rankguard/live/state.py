"""``live_state(model=..., optimizer=..., step=...)``: the one line a script adds so that
a standby can take a lost rank's place.

Called at the start of the wrapped training function, once the model and the optimizer
are built (every round). In a round that follows a live replacement it agrees on the
step and brings every rank the replicated state of one survivor, the one that completed
the most steps (the lowest rank among them): the model's ``state_dict`` tensors, the
optimizer's state and torch's RNG state (CPU, and CUDA where there is CUDA), broadcast
over the round's new process group. It returns the step every rank continues after; a
rank whose own step differs (the newcomer, a survivor one step behind) positions its
per-rank data there. Elsewhere (round 0, an ordinary in-process restart, no standbys,
outside the wrapper) it returns ``step`` unchanged and moves nothing; with standbys it
also records, once per process, that the script declared its state.

Replicated state (data parallelism: DDP, HSDP's replicate dimension) comes from a live
peer; what only the lost process held (its data iterator's position, a per-rank RNG) is
not transferable then: derive it from the rank and the returned step. The optimizer's
state crosses as JSON plus tensors, never pickled. Sharded state (FSDP2, tensor
parallelism) is declared with ``checkpoint=`` (the checkpoint manager and its state
plan): it comes from the newest complete local checkpoint step, per-rank state
included, the newcomer's shard from a peer's replica where the lost process's own files
are not on this node's disk (:mod:`.sharded`).
"""

from __future__ import annotations

import json
from typing import Any

from rankguard.live.link import current

__all__ = ["decode_state", "encode_state", "live_state"]

MAX_SKELETON_BYTES = 64 << 20


def live_state(
    *, model: Any = None, optimizer: Any = None, step: int, checkpoint: Any = None
) -> int:
    """Declare the replicated state (see the module doc); the step to continue after.
    ``checkpoint``: a :class:`~rankguard.checkpoint.CheckpointManager` whose state
    (model, optimizer, per-rank RNG and data position) is sharded: at every re-entry
    (after a replacement or any in-process restart) it is loaded from the newest
    complete checkpoint instead (:mod:`.sharded`); ``model`` and ``optimizer`` are then
    left out (the manager's state names them)."""
    if checkpoint is not None:
        if model is not None or optimizer is not None:
            raise ValueError(
                "live_state: checkpoint= declares the state (the manager's model and "
                "optimizer); leave model= and optimizer= out"
            )
        from rankguard.live.sharded import restore_sharded

        return restore_sharded(checkpoint, step)
    if model is None:
        raise ValueError(
            "live_state: model= (replicated state: DDP) or checkpoint= (sharded state: a "
            "CheckpointManager with a local tier)"
        )
    link = current()
    if link is None:
        return step
    link.declare()
    shrunk = link.shrunk_round == link.current_round  # the first round without a rank
    if (not link.newcomers and not shrunk) or link.synced_round == link.current_round:
        return step
    link.synced_round = link.current_round
    # a newcomer that got the state in an earlier round holds it now, as a survivor
    fresh = link.awaits_state
    agreed, source, redone, same = _agree(-1 if fresh else step)
    if shrunk and _dist().get_rank() == 0 and optimizer is not None:  # the shrink's cost
        _arm_resumed(link, optimizer, agreed, redone, tuple(link.dropped_pids))
    if same and not link.newcomers:  # a shrink: every survivor holds the same step's state
        return step
    if source is None:  # no survivor holds the state (a world of newcomers): its own
        if fresh and optimizer is not None:
            _arm_resumed(link, optimizer, step, 0)
        link.received = link.newcomer
        return step
    _broadcast_model(model, source)
    if optimizer is not None:
        _broadcast_optimizer(optimizer, source)
    _broadcast_rng(source, _device_of(model))
    if fresh and optimizer is not None:
        _arm_resumed(link, optimizer, agreed, redone, source=f"replica on rank {source}")
    link.received = link.newcomer
    return agreed


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _device_of(model: Any) -> Any:
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _comm_device(t: Any) -> Any:
    """NCCL moves CUDA tensors only; gloo any tensor."""
    import torch

    dist = _dist()
    if dist.get_backend() == "nccl" and t.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def _bcast(t: Any, src: int) -> None:
    dev = _comm_device(t)
    if dev == t.device:
        _dist().broadcast(t, src)
        return
    moved = t.to(dev)
    _dist().broadcast(moved, src)
    t.copy_(moved.to(t.device))


def _agree(step: int) -> tuple[int, int | None, int, bool]:
    """(agreed step, source rank, survivors' completed steps rolled back, every rank
    said the same step): every rank's step gathered; the newcomers say -1."""
    import torch

    dist = _dist()
    mine = torch.tensor([step], dtype=torch.int64)
    world = dist.get_world_size()
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dev = _comm_device(mine)
    if dev != mine.device:
        moved = [s.to(dev) for s in steps]
        dist.all_gather(moved, mine.to(dev))
        steps = [s.cpu() for s in moved]
    else:
        dist.all_gather(steps, mine)
    values = [int(s.item()) for s in steps]
    best = max(values)
    same = len(set(values)) == 1
    if best < 0:
        return step, None, 0, same
    return best, values.index(best), 0, same


def _bcast_many(tensors: list[Any], src: int) -> None:
    """Broadcast ``tensors`` from ``src`` in one collective per (dtype, device): each
    group flattened into one buffer and copied back on the receivers. One broadcast per
    tensor was a round trip each (a model and its Adam state: over a hundred)."""
    import torch

    me = _dist().get_rank()
    groups: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for items in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in items])
            _bcast(flat, src)
            if me == src:
                continue
            offset = 0
            for t in items:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view(t.shape))
                offset += n


def _broadcast_model(model: Any, src: int) -> None:
    import torch

    _bcast_many([t for t in model.state_dict().values() if isinstance(t, torch.Tensor)], src)


def encode_state(value: Any, tensors: list[Any]) -> Any:
    """``value`` (an optimizer's state dict) as JSON-able data; its tensors appended to
    ``tensors`` and replaced by their index, shape, dtype and device kind."""
    import torch

    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {
            "t": len(tensors) - 1,
            "shape": list(value.shape),
            "dtype": str(value.dtype).removeprefix("torch."),
            "cpu": value.device.type == "cpu",
        }
    if isinstance(value, dict):
        return {
            "d": [[encode_state(k, tensors), encode_state(v, tensors)] for k, v in value.items()]
        }
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "u": [encode_state(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"live_state: cannot send a {type(value).__name__} in the optimizer's state")


def decode_state(data: Any, tensors: list[Any]) -> Any:
    """The inverse of :func:`encode_state` (tensors already filled in by index)."""
    if not isinstance(data, dict) or not data:
        raise ValueError("live_state: malformed optimizer state")
    if "t" in data:
        return tensors[int(data["t"])]
    if len(data) != 1:
        raise ValueError("live_state: malformed optimizer state")
    ((kind, body),) = data.items()
    if kind == "d":
        return {decode_state(k, tensors): decode_state(v, tensors) for k, v in body}
    if kind == "l":
        return [decode_state(v, tensors) for v in body]
    if kind == "u":
        return tuple(decode_state(v, tensors) for v in body)
    if kind == "v":
        return body
    raise ValueError(f"live_state: unknown entry {kind!r}")


def _tensor_specs(data: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(data, dict):
        if "t" in data and "shape" in data:
            out.append(data)
            return
        for v in data.values():
            _tensor_specs(v, out)
    elif isinstance(data, list):
        for v in data:
            _tensor_specs(v, out)


def _broadcast_optimizer(optimizer: Any, src: int) -> None:
    import torch

    dist = _dist()
    me = dist.get_rank()
    tensors: list[Any] = []
    skeleton = b""
    if me == src:
        skeleton = json.dumps(encode_state(optimizer.state_dict(), tensors)).encode()
    size = torch.tensor([len(skeleton)], dtype=torch.int64)
    _bcast(size, src)
    n = int(size.item())
    if not 0 < n <= MAX_SKELETON_BYTES:
        raise ValueError(f"live_state: optimizer state of {n} bytes")
    buf = (
        torch.frombuffer(bytearray(skeleton), dtype=torch.uint8)
        if me == src
        else torch.empty(n, dtype=torch.uint8)
    )
    _bcast(buf, src)
    data = json.loads(bytes(buf.numpy()).decode())
    specs: list[dict[str, Any]] = []
    _tensor_specs(data, specs)
    device = next(
        (p.device for g in optimizer.param_groups for p in g["params"]), torch.device("cpu")
    )
    received: list[Any] = [None] * len(specs)
    for spec in sorted(specs, key=lambda s: int(s["t"])):
        i = int(spec["t"])
        if me == src:
            t = tensors[i]
        else:
            dtype = getattr(torch, str(spec["dtype"]))
            where = torch.device("cpu") if spec["cpu"] else device
            t = torch.empty([int(d) for d in spec["shape"]], dtype=dtype, device=where)
        received[i] = t
    _bcast_many(received, src)
    if me != src:
        optimizer.load_state_dict(decode_state(data, received))


def _broadcast_rng(src: int, device: Any) -> None:
    import torch

    state = torch.get_rng_state()
    _bcast(state, src)
    torch.set_rng_state(state)
    if device.type == "cuda":
        cuda_state = torch.cuda.get_rng_state(device)
        _bcast(cuda_state, src)
        torch.cuda.set_rng_state(cuda_state, device)


def _arm_resumed(
    link: Any,
    optimizer: Any,
    agreed: int,
    redone: int,
    pids: tuple[int, ...] = (),
    *,
    source: str | None = None,
) -> None:
    """The newcomer's first optimizer step from here (``pids``: the first step of a
    shrunk world, for the dropped processes' records; ``source``: where its state came
    from): when it completes (a one-shot hook, removed as it fires; the watcher writes
    the time)."""
    handle: Any = None

    def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
        link.note_resumed(agreed + 1, redone, pids=pids, source=source)
        if handle is not None:
            handle.remove()

    handle = optimizer.register_step_post_hook(hook)
