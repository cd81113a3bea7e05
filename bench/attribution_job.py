"""An unmodified DDP training script for ``attribution.py`` (it never imports rankguard).

``--stall-rank R --stall-site SITE``: at ``--stall-step`` rank R sleeps ``--stall-s``
seconds in its ``forward`` (a forward pre-hook), ``backward`` (a backward hook of the
first layer), ``optimizer`` (an optimizer step pre-hook), ``data`` (the data iterator)
or ``outside`` (the loop, between steps). ``--slow-rank R --slowdown X --slow-site
SITE``: from ``--slow-from-s`` seconds on, rank R's compute per step is X times as long,
the extra time spent in that site: it sleeps (X - 1) times the rank's own compute per
step, measured over its steps before the onset but the first :data:`WARMUP` (the time
in data loading, forward, the
backward hook, the optimizer and between steps: each site sleeps ``--site-ms`` on every
rank, plus the model's own work; the collectives' waiting is not in it). A 1.5x slower
rank is 1.5x slower, whichever site holds it. The onset counts from the first step; the
slow rank prints it (``slowed ... at unix T``). The job runs ``--seconds`` and every rank
stops at the same step.

``--model pipeline``: one pipeline stage per rank (:class:`Pipeline`), ``--p2p`` its
point-to-point operations; ``--stall-site send``: at ``--stall-step`` the stalled
stage does not sleep but skips sending its input's gradient back (its previous stage
waits for it for ever, the others go on to the next step's all-reduce). ``--model
mesh3``: a 3-D mesh (:func:`mesh3_wrap`); its ``forward`` stall is after the
tensor-parallel all-reduce, before the context-parallel one (``data`` stops the rank
before the tensor-parallel one, ``backward`` before the data-parallel one).

``--model fsdp``: the model is sharded with torch's FSDP2 (``fully_shard`` on each
linear layer and on the whole, on a 1-D CPU device mesh): each step all-gathers the
parameters in forward and backward and reduce-scatters the gradients (``--model ddp``,
the default: DDP's all-reduce). ``--model mesh``: a 2-D mesh (``init_device_mesh("cpu",
(world // 2, 2))``, data-parallel x tensor-parallel): the first layer's output is
all-reduced in its tensor-parallel group of 2 (Megatron's reduce from the
tensor-parallel region: an all-reduce forward, the identity backward) and the gradients
in the rank's data-parallel group (DDP on that group); a rank stalled in ``forward``
stops before its tensor-parallel all-reduce (its peer waits in it, the other pairs go on
to their data-parallel all-reduce and wait there), one stalled in ``backward`` never
joins its data-parallel all-reduce. ``--sections nvrx``: the loop is wrapped in NVRx's
client sections as a Megatron-style loop does (``RankMonitorClient``: ``setup`` from
start to the first step, each step after the first in a ``step`` section, the
between-steps site outside any section); the script imports NVRx's client, not rankguard.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

WARMUP = 5  # first steps not measured (a loaded machine's start-up)
SITES = ("forward", "backward", "optimizer", "data", "outside")
STALLS = (*SITES, "send")  # send: a pipeline stage skips one send (below)
MODELS = ("ddp", "fsdp", "mesh", "mesh3", "pipeline")
P2P = ("batch", "irecv", "send")
SECTIONS = ("none", "nvrx")


class TPReduce(torch.autograd.Function):
    """Megatron's reduce from the tensor-parallel region: all-reduce forward, identity
    backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def mesh_wrap(net: torch.nn.Sequential) -> torch.nn.Module:
    """The 2-D mesh: the first layer's output all-reduced in the tensor-parallel group,
    DDP over the data-parallel group."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    net[0].register_forward_hook(lambda _m, _i, out: TPReduce.apply(out, tp))
    return DDP(net, process_group=mesh.get_group("dp"))


def mesh3_wrap(net: torch.nn.Sequential) -> torch.nn.Module:
    """The 3-D mesh (data-parallel x context-parallel x tensor-parallel, groups of 2 in
    the last two): the first layer's output all-reduced in the tensor-parallel group,
    the last layer's input in the context-parallel group, DDP over the data-parallel
    group."""
    from torch.distributed.device_mesh import init_device_mesh

    dims = (dist.get_world_size() // 4, 2, 2)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=("dp", "cp", "tp"))
    tp, cp = mesh.get_group("tp"), mesh.get_group("cp")
    net[0].register_forward_hook(lambda _m, _i, out: TPReduce.apply(out, tp))
    net[1].register_forward_hook(lambda _m, _i, out: TPReduce.apply(out, cp))
    return DDP(net, process_group=mesh.get_group("dp"))


def wrap(net: torch.nn.Sequential, model: str) -> torch.nn.Module:
    """DDP, FSDP2 (each linear layer and the whole sharded over every rank), the 2-D
    mesh (:func:`mesh_wrap`) or the 3-D one (:func:`mesh3_wrap`)."""
    if model == "ddp":
        return DDP(net)
    if model == "mesh":
        return mesh_wrap(net)
    if model == "mesh3":
        return mesh3_wrap(net)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


class Pipeline:
    """One pipeline stage per rank (rank r is stage r of the world's ranks): the
    activations go forward to the next stage and the gradients back to the previous one
    by point-to-point operations (``p2p``: ``batch``, ``batch_isend_irecv`` as Megatron
    and torch's pipelining schedules do; ``irecv``, ``isend``/``irecv`` and
    ``wait()``; ``send``, the blocking ``send``/``recv``)."""

    def __init__(self, stage: torch.nn.Module, p2p: str) -> None:
        self.stage, self.p2p = stage, p2p
        self.skip = False  # this step: do not send the input's gradient back
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _recv(self, shape: tuple[int, ...], src: int) -> torch.Tensor:
        t = torch.empty(shape)
        if self.p2p == "batch":
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, src)]):
                w.wait()
        elif self.p2p == "irecv":
            dist.irecv(t, src).wait()
        else:
            dist.recv(t, src)
        return t

    def _send(self, t: torch.Tensor, dst: int) -> None:
        if self.p2p == "batch":
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, dst)]):
                w.wait()
        elif self.p2p == "irecv":
            dist.isend(t, dst).wait()
        else:
            dist.send(t, dst)

    def step(self, batch: torch.Tensor) -> None:
        """One micro-batch forward through every stage and back."""
        first, last = self.rank == 0, self.rank == self.world - 1
        x = batch if first else self._recv(tuple(batch.shape), self.rank - 1)
        x.requires_grad_(not first)
        y = self.stage(x)
        if not last:
            self._send(y.detach(), self.rank + 1)
            y.backward(self._recv(tuple(y.shape), self.rank + 1))
        else:
            y.pow(2).mean().backward()
        if not first and not self.skip:
            assert x.grad is not None
            self._send(x.grad, self.rank - 1)


def nvrx_client(sections: str) -> RankMonitorClient | None:
    """NVRx's client, set up as Megatron-LM does before training (``--sections nvrx``)."""
    if sections == "none":
        return None
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.start_section("setup")
    return client


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--site-ms", type=float, default=10.0)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-site", choices=STALLS, default="outside")
    p.add_argument("--stall-step", type=int, default=20)
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-site", choices=SITES, default="backward")
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-from-s", type=float, default=0.0)
    p.add_argument("--model", choices=MODELS, default="ddp")
    p.add_argument("--sections", choices=SECTIONS, default="none")
    p.add_argument("--p2p", choices=P2P, default="batch")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    client = nvrx_client(args.sections)
    start = time.monotonic()  # again at the first step
    state = {"step": 0}
    slow_rank = rank == args.slow_rank
    healthy: list[float] = []  # the slow rank's compute per step (s) before the onset
    busy = [0.0]  # this step's compute so far (s)

    def extra_s() -> float:
        """The slowed site's extra sleep: (X - 1) x the rank's compute per step."""
        if not slow_rank or time.monotonic() - start < args.slow_from_s or not healthy[WARMUP:]:
            return 0.0
        return (args.slowdown - 1.0) * statistics.median(healthy[WARMUP:][-50:])

    def pause(site: str) -> None:
        ms = args.site_ms
        time.sleep(ms / 1000)
        if site == args.slow_site:
            time.sleep(extra_s())
        if rank == args.stall_rank and site == args.stall_site and state["step"] == args.stall_step:
            print(f"[attribution rank {rank}] stalls in {site} at step {state['step']}", flush=True)
            time.sleep(args.stall_s)

    def backward_hook(*_: object) -> None:
        t0 = time.perf_counter()
        pause("backward")
        busy[0] += time.perf_counter() - t0

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if args.model == "pipeline":  # each stage one 64 x 64 layer
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    # a 3-D mesh's forward stall comes between its tensor- and context-parallel
    # all-reduces (each site then stops the rank before another dimension's group)
    (net[1] if args.model == "mesh3" else net).register_forward_pre_hook(
        lambda *_: pause("forward")
    )
    net[0].register_full_backward_hook(backward_hook)
    pipe = Pipeline(net, args.p2p) if args.model == "pipeline" else None
    model = net if pipe is not None else wrap(net, args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.register_step_pre_hook(lambda *_: pause("optimizer"))

    def batches() -> Iterator[torch.Tensor]:
        while True:
            pause("data")
            yield torch.randn(8, 64)

    data = batches()
    end = start + args.seconds
    onset_unix = 0.0
    while True:
        done = torch.tensor([float(time.monotonic() > end)])
        dist.all_reduce(done)  # every rank stops at the same step
        if done.item():
            break
        state["step"] += 1
        if state["step"] == 1:
            start = time.monotonic()
            end = start + args.seconds
            if client is not None:
                client.end_section("setup")
        elif client is not None:  # after one warm-up step, as Megatron-LM does
            client.start_section("step")
        onset = time.monotonic() - start >= args.slow_from_s
        if not onset:
            onset_unix = time.time() + args.slow_from_s - (time.monotonic() - start)
        busy[0] = 0.0
        t0 = time.perf_counter()
        opt.zero_grad()
        if pipe is not None:  # the stages' waits for each other count as compute here
            pipe.skip = args.stall_site == "send" and rank == args.stall_rank
            pipe.skip = pipe.skip and state["step"] == args.stall_step
            if pipe.skip:
                print(f"[attribution rank {rank}] skips a send at step {state['step']}", flush=True)
            pipe.step(next(data))
        else:
            loss = model(next(data)).pow(2).mean()
            busy[0] += time.perf_counter() - t0
            loss.backward()  # the backward hook adds its own time
        t0 = time.perf_counter()
        opt.step()
        if client is not None and state["step"] > 1:
            client.end_section("step")
        pause("outside")
        busy[0] += time.perf_counter() - t0
        if slow_rank and not onset:
            healthy.append(busy[0])
        elif slow_rank and healthy[WARMUP:] and not state.get("said"):
            state["said"] = 1
            base = statistics.median(healthy[WARMUP:][-50:])
            print(
                f"[attribution rank {rank}] slowed {args.slowdown}x from step {state['step']}: "
                f"compute {base * 1000:.1f} ms per step, +{extra_s() * 1000:.1f} ms in "
                f"{args.slow_site}, at unix {onset_unix:.3f}",
                flush=True,
            )
    dist.barrier()
    if client is not None:
        client.shutdown_workload_monitoring()
    if rank == 0:
        print(f"[attribution] done: {state['step']} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
