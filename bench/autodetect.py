"""Cost of finding the batch shape and FLOPs of an unmodified script
(``rankguard.perf.autodetect.PerfDetector``).

What:

1. Per-call cost of the hooks while they exist: a forward of a small ``nn.Linear``
   without any hook, with the root probe (ONE ``with_kwargs`` forward pre-hook, as put on
   the root module for one step), and with the global module pre-hook (as installed for
   one forward until the root is found): median of 15 repeats of 20k calls, ns per call
   above the bare call.
2. The one-time cost: the detection's three steps of a nanoGPT-style model (the same as
   ``tests/e2e/scripts/perf_nanogpt.py``, batch 4 x 32) against three steps without
   detection, for the analytic path (model with ``config``) and the measured path
   (``FlopCounterMode`` forward and backward, model without ``config``).
3. Afterwards: ``opt.step()`` of a 1-element SGD with a retired detector against none,
   paired and alternated (ABBA); the detector removes every hook, so the goal is 0 ns.

Run: ``python bench/autodetect.py`` (about 30 s on 2 CPU cores).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rankguard.perf.autodetect import InputProbe, PerfDetector
from rankguard.perf.config import PerfConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.timeline import ProgressTracker


def _paired_ns(
    install: Callable[[nn.Module], Callable[[], None]], n: int = 5000, rounds: int = 41
) -> float:
    """Median over ABBA rounds of (with hook - without) ns per ``nn.Identity`` call."""
    model, x = nn.Identity(), torch.ones(2, 4)

    def timed() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            model(x)
        return (time.perf_counter_ns() - t0) / n

    diffs = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {}
        for hooked in order:
            remove = install(model) if hooked else None
            got[hooked] = timed()
            if remove is not None:
                remove()
        diffs.append(got[True] - got[False])
    return statistics.median(diffs)


def per_call() -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook

    def probe(model: nn.Module) -> Callable[[], None]:
        return InputProbe(model).remove

    def global_hook(model: nn.Module) -> Callable[[], None]:
        return register_module_forward_pre_hook(lambda m, a: None).remove

    def nothing(model: nn.Module) -> Callable[[], None]:
        return lambda: None

    print("1. per forward call of a module, ns above a bare nn.Identity call (ABBA medians)")
    print(f"   control (no hook either side)   {_paired_ns(nothing):+8.0f} ns")
    print(f"   root probe (one step only)      {_paired_ns(probe):+8.0f} ns")
    print(f"   global pre-hook (one forward)   {_paired_ns(global_hook):+8.0f} ns per module call")


@dataclass
class GPTConfig:  # tests/e2e/scripts/perf_nanogpt.py's model
    block_size: int = 32
    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _nano(config: bool) -> nn.Module:
    model = GPT(GPTConfig())
    if not config:
        del model.config
    return model


def _steps(model: nn.Module, n: int, detect: bool) -> tuple[float, str]:
    reporter = PerfReporter(
        PerfConfig(), ProgressTracker(mode="cpu"), rank=0, world_size=1, run_id="b", out_dir=None
    )
    det = PerfDetector(reporter, world_size=1).install() if detect else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.randint(0, 256, (4, 32))
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
    elapsed = time.perf_counter() - t0
    if det is not None:
        det.remove()
    return elapsed, reporter.flops_source


def one_time() -> None:
    print("2. one-time cost: first 3 steps of a nanoGPT-style model (batch 4 x 32)")
    torch.manual_seed(0)
    for config in (True, False):
        base = [_steps(_nano(config), 3, False)[0] for _ in range(3)]
        runs = [_steps(_nano(config), 3, True) for _ in range(3)]
        b, d = statistics.median(base), statistics.median(r[0] for r in runs)
        step = b / 3
        print(
            f"   {'analytic' if config else 'measured'}: without {b * 1e3:7.1f} ms, with "
            f"{d * 1e3:7.1f} ms: +{(d - b) * 1e3:6.1f} ms once (= {(d - b) / step:4.1f} steps)"
            f"  [{runs[0][1][:60]}]"
        )


def after_retire() -> None:
    """Hooks PyTorch holds before detection and after it retired: nothing is left, so the
    per-step cost afterwards is zero by construction (no timing needed)."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    def counts() -> tuple[int, int]:
        return (
            len(optim_module._global_optimizer_post_hooks),
            len(nn_module._global_forward_pre_hooks),
        )

    reporter = PerfReporter(
        PerfConfig(), ProgressTracker(mode="cpu"), rank=0, world_size=1, run_id="b", out_dir=None
    )
    model = _nano(False)
    before = counts()
    det = PerfDetector(reporter, world_size=1).install()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    during = []
    for _ in range(4):  # detection runs and retires; the 4th forward lets the reaper run
        x = torch.randint(0, 256, (4, 32))
        model(x, x)[1].backward()
        opt.step()
        during.append(counts())
    after = counts()
    print("3. global hooks (optimizer post, module forward pre) and the root's own")
    print(f"   before {before}, after each step {during}, after the 4th forward {after};")
    print(f"   root pre-hooks left {len(model._forward_pre_hooks)}, detector active {det.active}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    per_call()
    one_time()
    after_retire()
