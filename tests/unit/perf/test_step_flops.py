"""FLOPs counted on the real step (``StepFlopCounter``) and the parameters' dtype."""

from __future__ import annotations

import pytest
import torch

from rankguard.perf.measured import StepFlopCounter, measured_flops_per_step, param_dtype

pytestmark = pytest.mark.timeout(30)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_counting_the_real_step_matches_the_separate_measurement() -> None:
    model, x = _model(), torch.randn(8, 16)
    reference = measured_flops_per_step(model, (x,))
    counter = StepFlopCounter()
    counter.start()
    assert counter.active
    model(x).sum().backward()  # the step the script runs anyway
    counted = counter.stop()
    assert not counter.active
    assert counted == pytest.approx(reference) and counted > 0
    assert counter.stop() is None  # stopped once


def test_nothing_counted_is_none() -> None:
    counter = StepFlopCounter()
    counter.start()
    torch.ones(3).add_(1)  # no matmul: FlopCounterMode counts none
    assert counter.stop() is None


def test_param_dtype_is_the_dtype_of_most_parameters() -> None:
    model = _model()
    assert param_dtype(model) == "fp32"
    assert param_dtype(model.to(torch.bfloat16)) == "bf16"
    mixed = torch.nn.ModuleList([torch.nn.Linear(64, 64).half(), torch.nn.Linear(2, 2)])
    assert param_dtype(mixed) == "fp16"
    assert param_dtype(torch.nn.ReLU()) is None
