"""Batch shape and FLOPs found without user code: a tiny nanoGPT-style model trained in
process, the detector's hooks, the analytic and measured paths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from rankguard.demo.model import GPT, NanoGPTConfig
from rankguard.perf.autodetect import (
    InputProbe,
    PerfDetector,
    input_shape,
    loss_of,
    measure_call_flops,
    model_shape_from_config,
)
from rankguard.perf.config import PerfConfig
from rankguard.perf.flops import ModelShape, analytic_flops_per_step
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.timeline import ProgressTracker

CFG = NanoGPTConfig(block_size=16, vocab_size=128, n_embd=64)  # nanoGPT's names
ANALYTIC = ModelShape(
    family="gpt",
    num_layers=CFG.n_layer,
    hidden_size=CFG.n_embd,
    seq_length=CFG.block_size,
    vocab_size=CFG.vocab_size,
    num_attention_heads=CFG.n_head,
)


@pytest.fixture
def reporter() -> Iterator[PerfReporter]:
    r = PerfReporter(
        PerfConfig(), ProgressTracker(mode="cpu"), rank=0, world_size=1, run_id="t", out_dir=None
    )
    yield r


def _train(model: nn.Module, steps: int, *, micro: int = 1, batch: int = 4) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    nn.CrossEntropyLoss()(torch.zeros(2, 3), torch.tensor([0, 1]))  # a root without params
    for _ in range(steps):
        for _ in range(micro):
            x = torch.randint(0, CFG.vocab_size, (batch, CFG.block_size))
            _, loss = model(x, x)
            assert loss is not None
            (loss / micro).backward()
        with torch.no_grad():  # an eval forward inside the step is not a micro-batch
            model(x)
        opt.step()
        opt.zero_grad()


def test_retires_next_to_another_optimizer_hook(reporter: PerfReporter) -> None:
    """PyTorch iterates the global optimizer hooks while calling them: the detector must
    not remove its own from inside (another hook after it would fail)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    det = PerfDetector(reporter, world_size=1).install()
    calls: list[int] = []
    after = register_optimizer_step_post_hook(lambda *a: calls.append(1))
    try:
        model = GPT(CFG)
        del model.config  # measured: a forward inside the optimizer hook
        _train(model, 5)
    finally:
        after.remove()
        det.remove()
    assert det.done and len(calls) == 5 and reporter.global_samples == 4
    assert reporter.flops_source.startswith("measured")


def test_input_shape_token_ids_floats_and_keywords() -> None:
    ids = torch.zeros(8, 64, dtype=torch.long)
    assert (input_shape((ids,)).samples, input_shape((ids,)).seq) == (8, 64)  # type: ignore[union-attr]
    floats = input_shape((torch.zeros(8, 16),))
    assert floats is not None and (floats.samples, floats.seq, floats.tokens) == (8, None, None)
    kw = input_shape(
        (), {"attention_mask": torch.ones(2, 5), "input_ids": torch.zeros(2, 7, dtype=torch.int32)}
    )
    assert kw is not None and (kw.samples, kw.seq, kw.tokens) == (2, 7, 14)
    nested = input_shape(({"x": [torch.zeros(3, 9, dtype=torch.long)]},))
    assert nested is not None and nested.tokens == 27
    assert input_shape((1.0,), {"flag": True}) is None


def test_detector_finds_batch_micro_batches_and_analytic_flops(reporter: PerfReporter) -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    det = PerfDetector(reporter, world_size=2).install()
    try:
        _train(model, 2, micro=3)
        assert det.active and not det.done and det.root is model  # root found in step 2
        _train(model, 1, micro=3)  # a new optimizer: the lead is the first one that stepped
    finally:
        det.remove()
    assert det.done is False, det.note  # the lead optimizer never stepped again
    det = PerfDetector(reporter, world_size=2).install()
    opt_model = GPT(CFG)
    _train(opt_model, 3, micro=3)
    assert det.done and det.active and det.root is opt_model  # the reaper waits for a call
    opt_model(torch.zeros(1, 2, dtype=torch.long))
    assert not det.active
    assert reporter.global_samples == 4 * 3 * 2
    assert reporter.global_tokens == 4 * 3 * 2 * CFG.block_size
    assert reporter.batch_source is not None and reporter.batch_source.startswith("detected")
    assert reporter.flops_per_step == analytic_flops_per_step(ANALYTIC, 4 * 3 * 2)
    assert reporter.flops_source.startswith("analytic: gpt formula from GPT.config")


def test_detector_measures_a_model_without_config_within_10_percent(
    reporter: PerfReporter,
) -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    del model.config
    det = PerfDetector(reporter, world_size=1).install()
    _train(model, 3)
    assert det.done
    analytic = analytic_flops_per_step(ANALYTIC, 4)
    assert reporter.flops_source.startswith("measured: FlopCounterMode on GPT")
    assert reporter.flops_per_step == pytest.approx(analytic, rel=0.10)


def test_what_the_user_set_wins(reporter: PerfReporter) -> None:
    reporter.set_batch(samples=5, tokens=50)
    reporter.set_flops(1e9, "user")
    det = PerfDetector(reporter, world_size=1).install()
    _train(GPT(CFG), 3)
    assert det.done
    assert (reporter.global_samples, reporter.batch_source) == (5, "user: set_batch")
    assert (reporter.flops_per_step, reporter.flops_source) == (1e9, "user")


def test_float_inputs_give_samples_only_and_measured_flops(reporter: PerfReporter) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    det = PerfDetector(reporter, world_size=1).install()
    for _ in range(3):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        if det.root is not None and not det.done:
            before = model[1].running_mean.clone()  # type: ignore[index]
            grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        opt.step()
        opt.zero_grad()
    assert det.done
    assert (reporter.global_samples, reporter.global_tokens) == (8, None)
    # Linear 16x32 and 32x1, forward + 2 backward GEMMs each (the first one's input grad is
    # not needed: counted only for the weight)
    assert reporter.flops_per_step == pytest.approx(2 * 8 * (16 * 32 + 32) * 3, rel=0.35)
    assert torch.equal(model[1].running_mean, before)  # type: ignore[index]
    assert all(g is not None for g in grads)


def test_measure_call_flops_restores_buffers_and_grads() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model(torch.randn(6, 4)).sum().backward()
    grad = model[0].weight.grad.clone()  # type: ignore[union-attr]
    mean = model[1].running_mean.clone()  # type: ignore[index]
    flops = measure_call_flops(model, (torch.randn(6, 4),), {})
    assert flops > 0
    assert torch.equal(model[0].weight.grad, grad)  # type: ignore[arg-type]
    assert torch.equal(model[1].running_mean, mean)  # type: ignore[index]


def test_probe_counts_training_calls_and_removes_itself() -> None:
    model = nn.Linear(3, 1)
    probe = InputProbe(model)
    model(torch.ones(2, 3))
    with torch.no_grad():
        model(torch.ones(5, 3))
    model.eval()
    model(torch.ones(7, 3))
    model.train()
    assert probe.calls == 1 and probe.shape is not None and probe.shape.samples == 2
    probe.remove()
    model(torch.ones(2, 3))
    assert probe.calls == 1


def test_model_shape_from_hf_style_configs() -> None:
    class Cfg:
        model_type = "llama"
        num_hidden_layers = 2
        hidden_size = 64
        num_attention_heads = 4
        num_key_value_heads = 2
        intermediate_size = 176
        vocab_size = 100

    holder = nn.Module()
    holder.config = Cfg()  # type: ignore[assignment]
    shape = model_shape_from_config(holder, 32)
    assert shape is not None and shape.family == "llama" and shape.query_groups == 2
    assert shape.ffn_size == 176 and shape.seq_length == 32
    Cfg.model_type = "t5"
    assert model_shape_from_config(holder, 32) is None
    assert model_shape_from_config(nn.Linear(1, 1), 32) is None


def test_loss_of_outputs() -> None:
    w = torch.ones(2, requires_grad=True)
    assert loss_of({"loss": w.sum(), "logits": w}).item() == 2
    assert loss_of((w * 3, (w * 2).sum())).item() == 4
    assert loss_of(w * 2).item() == 4
    with pytest.raises(TypeError, match="no tensor"):
        loss_of("x")


def test_the_summary_says_why_flops_were_not_measured(reporter: PerfReporter) -> None:
    class LitLike(nn.Linear):  # a LightningModule's forward is not its training step
        def training_step(self, batch: torch.Tensor) -> torch.Tensor:
            return self(batch).sum()

    model = LitLike(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    det = PerfDetector(reporter, world_size=1).install()
    for _ in range(3):
        model.training_step(torch.ones(2, 4)).backward()
        opt.step()
    det.remove()
    assert det.done and reporter.global_samples == 2 and reporter.flops_per_step is None
    assert (
        reporter.flops_source
        == "none: FLOPs not measured: a LightningModule's forward is not its step"
    )


def test_gives_up_when_no_module_holds_the_parameters(reporter: PerfReporter) -> None:
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    det = PerfDetector(reporter, world_size=1).install()
    for _ in range(6):
        (p * 2).sum().backward()
        opt.step()
    nn.Identity()(torch.ones(1))  # the reaper's call
    assert det.done and not det.active and det.root is None
    assert det.note == "no module holding the optimizer's parameters ran forward"
    assert reporter.batch_source is None
