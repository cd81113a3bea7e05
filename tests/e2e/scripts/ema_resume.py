"""DDP training with async checkpoints (the ``checkpoint`` section ``rankguard run`` was
given) and an EMA-style update at the start of every step, right after the previous
step's save returned: the weights move toward the EMA model (through ``.data``) and
the EMA model toward the weights, in place (``lerp_``; 4 M parameters: a copy that
takes a while). Rank ``--crash-rank``
dies right after the save of ``--crash-step`` returns (first attempt only). Prints
``[ema] step N loss X`` with the loss's full repr, and ``[ema] resumed from step N``."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.checkpoint import CheckpointConfig, CheckpointManager, DataPosition

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--crash-step", type=int, default=0)
parser.add_argument("--crash-rank", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 2048),
        torch.nn.Tanh(),
        torch.nn.Linear(2048, 2048),
        torch.nn.Linear(2048, 1),
    )


net, ema = mlp(), mlp()
ema.load_state_dict(net.state_dict())
model = DDP(net)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = DataPosition()
config = CheckpointConfig.from_run()
assert config is not None and config.async_save, "run under rankguard with async_save=true"
ckpt = CheckpointManager(config, {"model": model, "ema": ema, "optim": opt, "data": data})
resumed = ckpt.load_latest()
if resumed is not None and rank == 0:
    print(f"[ema] resumed from step {resumed}", flush=True)
start = (resumed or 0) + 1
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(start, args.steps + 1):
    if step > 1:  # the EMA-style update of the previous step, right after its save
        with torch.no_grad():
            pairs = list(zip(net.parameters(), ema.parameters(), strict=True))
            for p, e in reversed(pairs):  # the last layer first
                p.data.lerp_(e.data, 0.5)
                e.lerp_(p, 0.25)
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(32, 64, generator=gen)
    loss = (model(x) - x[:, :1]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    data.index = step
    total = loss.detach().clone()
    dist.all_reduce(total)
    if rank == 0:
        print(f"[ema] step {step} loss {float(total)!r}", flush=True)
    ckpt.maybe_save(step)
    if step == args.crash_step and rank == args.crash_rank and restart == 0:
        os._exit(1)  # right after the save returned: its write dies with the rank
ckpt.close()
if rank == 0:
    print(f"[ema] done: {args.steps} steps", flush=True)
dist.destroy_process_group()
