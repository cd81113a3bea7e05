"""The measured FLOP path counts CPU scaled-dot-product attention (torch 2.13's
FlopCounterMode alone counts it as zero)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from rankguard.perf.measured import measured_flops_per_step


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_cpu_sdpa_forward_flops_are_counted() -> None:
    b, h, s, d = 2, 4, 32, 16
    q = torch.randn(b, h, s, d, requires_grad=True)
    flops = measured_flops_per_step(_Attention(), (q,), include_backward=False)
    # Q K^T and P V: two batched matmuls of b*h*s*s*d multiply-adds each.
    assert flops == 2 * (2 * b * h * s * s * d)


def test_cpu_sdpa_backward_is_counted_too() -> None:
    b, h, s, d = 1, 2, 16, 8
    q = torch.randn(b, h, s, d, requires_grad=True)
    forward = measured_flops_per_step(_Attention(), (q,), include_backward=False)
    total = measured_flops_per_step(_Attention(), (q,), include_backward=True)
    # Flash backward recomputes the scores: 5 matmuls against 2 forward, so 2.5x forward.
    assert total == forward + 2.5 * forward
