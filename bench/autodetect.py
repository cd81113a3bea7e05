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

import torch
from torch import nn

from rankguard.demo.model import GPT, NanoGPTConfig
from rankguard.perf.autodetect import InputProbe, PerfDetector
from rankguard.perf.config import PerfConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.timeline import ProgressTracker


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


def _paired(install: Callable[[nn.Module], Callable[[], None]]) -> float:
    return _paired_ns(install, n=_size[0], rounds=_size[1])


# Sizes: (calls per timing, ABBA rounds, repeats of the one-time cost); --smoke shrinks them.
SIZES = {"full": (5000, 41, 3), "smoke": (200, 3, 1)}
_size = SIZES["full"]


def per_call() -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook

    def probe(model: nn.Module) -> Callable[[], None]:
        return InputProbe(model).remove

    def global_hook(model: nn.Module) -> Callable[[], None]:
        return register_module_forward_pre_hook(lambda m, a: None).remove

    def nothing(model: nn.Module) -> Callable[[], None]:
        return lambda: None

    print("1. per forward call of a module, ns above a bare nn.Identity call (ABBA medians)")
    print(f"   control (no hook either side)   {_paired(nothing):+8.0f} ns")
    print(f"   root probe (one step only)      {_paired(probe):+8.0f} ns")
    print(f"   global pre-hook (one forward)   {_paired(global_hook):+8.0f} ns per module call")


def _nano(config: bool) -> nn.Module:
    model = GPT(NanoGPTConfig())
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
        base = [_steps(_nano(config), 3, False)[0] for _ in range(_size[2])]
        runs = [_steps(_nano(config), 3, True) for _ in range(_size[2])]
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
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny loops (seconds): it runs")
    _size = SIZES["smoke" if ap.parse_args().smoke else "full"]
    torch.set_num_threads(1)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    per_call()
    one_time()
    after_retire()
