"""Training FLOPs: Megatron's analytic formula, its closed forms, and torch's count.

The reference models below are tiny GPT (MHA, GELU MLP 4h, tied or untied head), Llama
(GQA, SwiGLU, RMSNorm, no bias) and MoE (top-k routing over SwiGLU experts, a shared
expert, MoE every second layer) written with plain matmuls: attention is an explicit
``q @ k^T`` and ``softmax(.) @ v`` so ``FlopCounterMode`` sees the ``s^2`` terms, and each
expert runs only on the tokens routed to it (gather, matmul, ``index_add``) so only routed
tokens are counted.

Why the measured count equals the formula with ``causal=False``: the models apply a
causal mask with ``masked_fill``, but the matmul still computes every score, and
``FlopCounterMode`` counts the full ``s^2``; the formula's causal halving assumes a kernel
that skips the masked half (flash attention). Everything the formula leaves out is either
not counted by torch either (norms, softmax, activations, residuals, bias adds, the
embedding gather) or is the MoE router, a ``T*h*E`` matmul that torch does count; it is
added back exactly below and is under 3 % of the total here (``E/(r*k*f_e)`` of the MLP).
So GPT and Llama agree exactly and the MoE agrees exactly once the router is added.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from rankguard.perf.flops import (
    ModelShape,
    analytic_flops_breakdown,
    analytic_flops_per_step,
    default_swiglu_ffn_hidden_size,
    mfu,
    tflops_per_gpu,
)
from rankguard.perf.measured import FlopsCache, measured_flops_per_step

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module", autouse=True)
def _warm_flop_counter() -> None:
    """The first ``FlopCounterMode`` of a process costs about 1 s (torch's lazy imports)."""
    with FlopCounterMode(display=False):
        nn.Linear(2, 2)(torch.ones(1, 2)).sum().backward()


# --------------------------------------------------------------------------- models


def _attention(
    x: torch.Tensor,
    q_proj: nn.Linear,
    k_proj: nn.Linear,
    v_proj: nn.Linear,
    o_proj: nn.Linear,
    heads: int,
    groups: int,
    head_dim: int,
) -> torch.Tensor:
    b, s, _ = x.shape
    q = q_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
    k = k_proj(x).view(b, s, groups, head_dim).transpose(1, 2)
    v = v_proj(x).view(b, s, groups, head_dim).transpose(1, 2)
    if groups != heads:
        k = k.repeat_interleave(heads // groups, dim=1)
        v = v.repeat_interleave(heads // groups, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
    mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(b, s, heads * head_dim)
    return o_proj(out)


class _GPTBlock(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.q = nn.Linear(h, h)
        self.k = nn.Linear(h, h)
        self.v = nn.Linear(h, h)
        self.o = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // self.heads
        x = x + _attention(self.ln1(x), self.q, self.k, self.v, self.o, self.heads, self.heads, d)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(
        self, *, layers: int, h: int, heads: int, seq: int, vocab: int, tied: bool
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(_GPTBlock(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.head = None if tied else nn.Linear(h, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t() if self.head is None else self.head(x)


class _RMSNorm(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _SwiGLU(nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class _MoE(nn.Module):
    def __init__(self, h: int, f_expert: int, experts: int, topk: int, f_shared: int) -> None:
        super().__init__()
        self.topk = topk
        self.router = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(_SwiGLU(h, f_expert) for _ in range(experts))
        self.shared = _SwiGLU(h, f_shared) if f_shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, chosen = self.router(flat).softmax(dim=-1).topk(self.topk, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            routed = expert(flat[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, routed)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(shape)


class _LlamaBlock(nn.Module):
    def __init__(self, h: int, heads: int, groups: int, head_dim: int, mlp: nn.Module) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = heads, groups, head_dim
        self.norm1 = _RMSNorm(h)
        self.q = nn.Linear(h, heads * head_dim, bias=False)
        self.k = nn.Linear(h, groups * head_dim, bias=False)
        self.v = nn.Linear(h, groups * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, h, bias=False)
        self.norm2 = _RMSNorm(h)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = _attention(
            self.norm1(x), self.q, self.k, self.v, self.o, self.heads, self.groups, self.head_dim
        )
        x = x + a
        return x + self.mlp(self.norm2(x))


class TinyLlama(nn.Module):
    """Llama (or, with ``experts``, an MoE on the same trunk). RoPE is elementwise: omitted."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.embed = nn.Embedding(shape.vocab_size, h)
        blocks = []
        for i in range(shape.num_layers):
            mlp: nn.Module
            if shape.family == "moe" and i % shape.moe_layer_freq == 0:
                assert shape.num_experts is not None
                mlp = _MoE(
                    h,
                    shape.expert_ffn_size,
                    shape.num_experts,
                    shape.moe_router_topk,
                    shape.moe_shared_expert_ffn_hidden_size,
                )
            else:
                mlp = _SwiGLU(h, shape.ffn_size)
            blocks.append(
                _LlamaBlock(h, shape.num_attention_heads, shape.query_groups, shape.head_dim, mlp)
            )
        self.blocks = nn.ModuleList(blocks)
        self.norm = _RMSNorm(h)
        self.head = nn.Linear(h, shape.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _tokens(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b


def _gpt(**overrides: Any) -> ModelShape:
    base: dict[str, Any] = dict(
        family="gpt",
        num_layers=2,
        hidden_size=32,
        seq_length=16,
        vocab_size=64,
        num_attention_heads=4,
    )
    base.update(overrides)
    return ModelShape(**base)


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize(
    ("b", "s", "layers", "h", "v"),
    [(1, 2048, 24, 2048, 50304), (8, 4096, 96, 12288, 51200), (3, 16, 2, 32, 64)],
)
def test_spec_closed_form_equals_analytic_for_mha(
    b: int, s: int, layers: int, h: int, v: int
) -> None:
    shape = _gpt(num_layers=layers, hidden_size=h, seq_length=s, vocab_size=v)
    lead = 72 * b * s * layers * h**2
    causal = lead * (1 + s / (12 * h) + v / (12 * layers * h))
    full = lead * (1 + s / (6 * h) + v / (12 * layers * h))
    assert math.isclose(analytic_flops_per_step(shape, b), causal, rel_tol=1e-12)
    non_causal = _gpt(num_layers=layers, hidden_size=h, seq_length=s, vocab_size=v, causal=False)
    assert math.isclose(analytic_flops_per_step(non_causal, b), full, rel_tol=1e-12)


def test_megatron_gpt3_175b_reference_value() -> None:
    # GPT-3 175B, s=2048, padded V=51200, one sequence: Megatron's formula by hand.
    shape = _gpt(num_layers=96, hidden_size=12288, seq_length=2048, vocab_size=51200)
    h, s, layers, v = 12288, 2048, 96, 51200
    per_token = 6 * (layers * (4 * h * h + s * h) + layers * 2 * h * 4 * h + h * v)
    assert analytic_flops_per_step(shape, 1) == float(s * per_token)


def test_doubling_batch_doubles_flops() -> None:
    shape = _gpt()
    assert analytic_flops_per_step(shape, 8) == 2 * analytic_flops_per_step(shape, 4)


def test_doubling_layers_doubles_all_but_logits() -> None:
    one = analytic_flops_breakdown(_gpt(num_layers=12), 4)
    two = analytic_flops_breakdown(_gpt(num_layers=24), 4)
    assert two.logits == one.logits
    assert two.total - two.logits == 2 * (one.total - one.logits)
    assert 1.9 < two.total / one.total < 2.0


def test_vocab_term_is_linear() -> None:
    f = [analytic_flops_per_step(_gpt(vocab_size=v), 4) for v in (1000, 2000, 3000)]
    assert f[2] - f[1] == f[1] - f[0] == 6 * 4 * 16 * 32 * 1000


def test_causal_halves_only_the_attention_score_term() -> None:
    causal = analytic_flops_breakdown(_gpt(causal=True), 4)
    full = analytic_flops_breakdown(_gpt(causal=False), 4)
    assert causal.core_attention == full.core_attention / 2
    for term in ("qkv_projection", "output_projection", "dense_mlp", "moe_mlp", "logits"):
        assert getattr(causal, term) == getattr(full, term), term


def test_gqa_reduces_only_the_kv_projections() -> None:
    b, s, layers, h, heads, d = 2, 64, 4, 256, 8, 32
    common: dict[str, Any] = dict(
        family="llama",
        num_layers=layers,
        hidden_size=h,
        seq_length=s,
        vocab_size=1000,
        num_attention_heads=heads,
        ffn_hidden_size=688,
    )
    mha = analytic_flops_breakdown(ModelShape(**common), b)
    gqa = analytic_flops_breakdown(ModelShape(**common, num_query_groups=2), b)
    saved = 6 * b * s * layers * h * 2 * (heads - 2) * d
    assert mha.qkv_projection - gqa.qkv_projection == saved
    for term in ("core_attention", "output_projection", "dense_mlp", "moe_mlp", "logits"):
        assert getattr(mha, term) == getattr(gqa, term), term


def test_swiglu_has_three_gemms_of_h_by_f() -> None:
    plain = analytic_flops_breakdown(_gpt(ffn_hidden_size=96, swiglu=False), 4)
    gated = analytic_flops_breakdown(_gpt(ffn_hidden_size=96, swiglu=True), 4)
    assert gated.dense_mlp == 6 * 4 * 16 * 2 * 3 * 32 * 96
    assert gated.dense_mlp == 1.5 * plain.dense_mlp
    assert gated.total - gated.dense_mlp == plain.total - plain.dense_mlp


def test_default_ffn_sizes() -> None:
    assert default_swiglu_ffn_hidden_size(4096) == 11008  # Llama-7B
    assert _gpt().ffn_size == 4 * 32
    llama = ModelShape(
        family="llama",
        num_layers=1,
        hidden_size=4096,
        seq_length=8,
        vocab_size=8,
        num_attention_heads=32,
    )
    assert llama.uses_swiglu and llama.ffn_size == 11008 and llama.head_dim == 128


def _moe(**overrides: Any) -> ModelShape:
    base: dict[str, Any] = dict(
        family="moe",
        num_layers=4,
        hidden_size=64,
        seq_length=32,
        vocab_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=96,
        num_experts=8,
        moe_ffn_hidden_size=48,
    )
    base.update(overrides)
    return ModelShape(**base)


def test_moe_top1_equals_dense_model_of_expert_size() -> None:
    dense = ModelShape(
        family="llama",
        num_layers=4,
        hidden_size=64,
        seq_length=32,
        vocab_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=48,
    )
    assert analytic_flops_per_step(_moe(moe_router_topk=1), 4) == analytic_flops_per_step(dense, 4)
    # The number of experts does not matter, only how many each token visits.
    assert analytic_flops_per_step(_moe(num_experts=64), 4) == analytic_flops_per_step(dense, 4)


def test_moe_topk_shared_experts_and_layer_freq() -> None:
    top1 = analytic_flops_breakdown(_moe(moe_router_topk=1), 2)
    top2 = analytic_flops_breakdown(_moe(moe_router_topk=2), 2)
    assert top2.moe_mlp == 2 * top1.moe_mlp
    shared = analytic_flops_breakdown(_moe(moe_shared_expert_ffn_hidden_size=80), 2)
    assert shared.moe_mlp - top1.moe_mlp == 6 * 2 * 32 * 4 * 3 * 64 * 80
    every_other = _moe(moe_layer_freq=2)
    assert (every_other.num_moe_layers, every_other.num_dense_layers) == (2, 2)
    mixed = analytic_flops_breakdown(every_other, 2)
    assert mixed.moe_mlp == top1.moe_mlp / 2
    assert mixed.dense_mlp == 6 * 2 * 32 * 2 * 3 * 64 * 96
    assert _moe(num_layers=5, moe_layer_freq=2).num_moe_layers == 3  # layers 0, 2, 4


# --------------------------------------------------------------------------- measured


def test_measured_equals_analytic_for_gpt() -> None:
    torch.manual_seed(0)
    shape = _gpt(causal=False)
    for tied in (True, False):
        model = TinyGPT(layers=2, h=32, heads=4, seq=16, vocab=64, tied=tied)
        measured = measured_flops_per_step(model, (_tokens(3, 16, 64),))
        assert _rel(measured, analytic_flops_per_step(shape, 3)) < 1e-9, tied
    # The causal formula is what a flash-attention kernel does; torch counts the full s^2.
    causal = analytic_flops_breakdown(_gpt(causal=True), 3)
    assert measured - causal.total == causal.core_attention


def test_measured_equals_analytic_for_llama_gqa() -> None:
    torch.manual_seed(0)
    shape = ModelShape(
        family="llama",
        num_layers=2,
        hidden_size=32,
        seq_length=16,
        vocab_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,  # q = 64 != h: exercises Megatron's projection-size terms
        ffn_hidden_size=88,
        causal=False,
    )
    measured = measured_flops_per_step(TinyLlama(shape), (_tokens(2, 16, 64),))
    assert _rel(measured, analytic_flops_per_step(shape, 2)) < 1e-9


@pytest.mark.parametrize(("topk", "freq", "shared"), [(1, 1, 0), (2, 2, 24)])
def test_measured_matches_analytic_for_moe(topk: int, freq: int, shared: int) -> None:
    torch.manual_seed(0)
    shape = _moe(
        moe_router_topk=topk,
        moe_layer_freq=freq,
        moe_shared_expert_ffn_hidden_size=shared,
        causal=False,
    )
    b = 2
    measured = measured_flops_per_step(TinyLlama(shape), (_tokens(b, 32, 128),))
    analytic = analytic_flops_per_step(shape, b)
    assert shape.num_experts is not None
    router = 6 * b * shape.seq_length * shape.hidden_size * shape.num_experts
    assert _rel(measured, analytic + shape.num_moe_layers * router) < 1e-9
    assert _rel(measured, analytic) < 0.03


def test_forward_only_is_a_third_of_training() -> None:
    torch.manual_seed(0)
    model = TinyGPT(layers=1, h=16, heads=2, seq=8, vocab=32, tied=False)
    tokens = _tokens(2, 8, 32)
    forward = measured_flops_per_step(model, (tokens,), include_backward=False)
    assert forward * 3 == measured_flops_per_step(model, (tokens,))


def test_measurement_leaves_model_grads_and_rng_untouched() -> None:
    torch.manual_seed(0)
    model = TinyGPT(layers=1, h=16, heads=2, seq=8, vocab=32, tied=False)
    model.eval()
    model.blocks[0].train()  # a mixed mode must come back as it was
    grads = {name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.grad = grads[name]
    state = torch.get_rng_state()
    measured_flops_per_step(
        model,
        (_tokens(2, 8, 32),),
        loss_fn=lambda out: F.cross_entropy(out.flatten(0, 1), torch.zeros(16, dtype=torch.long)),
    )
    assert not model.training and model.blocks[0].training and not model.ln_f.training
    for name, p in model.named_parameters():
        assert p.grad is grads[name] and bool((p.grad == 0.5).all()), name
    assert torch.equal(torch.get_rng_state(), state)


def test_non_tensor_output_needs_a_loss_fn() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.lin(x), x

    with pytest.raises(TypeError, match="loss_fn"):
        measured_flops_per_step(Pair(), (torch.randn(2, 4),))
    flops = measured_flops_per_step(Pair(), (torch.randn(2, 4),), loss_fn=lambda o: o[0].sum())
    assert flops == 2 * (2 * 2 * 4 * 4)  # forward + weight grad; the input needs no grad


def test_flops_cache_measures_once_per_model_and_shape() -> None:
    model = nn.Linear(8, 8)
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    cache = FlopsCache()
    x = torch.randn(4, 8)
    first = cache.get_or_measure(model, (x,))
    assert cache.get_or_measure(model, (torch.randn(4, 8),)) == first
    assert len(calls) == 1 and len(cache) == 1
    bigger = cache.get_or_measure(model, (torch.randn(8, 8),))
    assert bigger == 2 * first and len(calls) == 2
    assert cache.get_or_measure(nn.Linear(8, 8), (x,), key="same") == first
    assert cache.get_or_measure(nn.Linear(8, 8), (x,), key="same") == first
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0


# --------------------------------------------------------------------------- rates


def test_tflops_per_gpu_uses_the_global_batch() -> None:
    shape = _gpt(num_layers=24, hidden_size=2048, seq_length=2048, vocab_size=50304)
    step_s = 1.5
    per_gpu_batch = 4
    single = tflops_per_gpu(analytic_flops_per_step(shape, per_gpu_batch), step_s, 1)
    # 8 GPUs, data-parallel 8, same per-GPU batch and step time: same per-GPU rate.
    eight = tflops_per_gpu(analytic_flops_per_step(shape, 8 * per_gpu_batch), step_s, 8)
    assert math.isclose(eight, single, rel_tol=1e-12)
    # FlagScale's division (one replica's FLOPs over the world size) is 8x too low.
    flagscale = tflops_per_gpu(analytic_flops_per_step(shape, per_gpu_batch), step_s, 8)
    assert math.isclose(eight, 8 * flagscale, rel_tol=1e-12)
    assert math.isclose(tflops_per_gpu(3e15, 2.0, 8), 3e15 / (2.0 * 1e12 * 8), rel_tol=1e-12)


def test_rate_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="step_time_s"):
        tflops_per_gpu(1e12, 0.0, 1)
    with pytest.raises(ValueError, match="world_size"):
        tflops_per_gpu(1e12, 1.0, 0)
    with pytest.raises(ValueError, match="global_batch_size"):
        analytic_flops_per_step(_gpt(), 0)


def test_mfu() -> None:
    assert mfu(400.0, None) is None
    assert mfu(494.7, 989.4) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu(1.0, 0.0)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"family": "bert"}, "family"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": -1}, "hidden_size"),
        ({"seq_length": 0}, "seq_length"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_query_groups": 3}, "num_query_groups"),
        ({"num_query_groups": 0}, "num_query_groups"),
        ({"hidden_size": 30}, "kv_channels"),
        ({"kv_channels": 0}, "kv_channels"),
        ({"ffn_hidden_size": 0}, "ffn_hidden_size"),
        ({"num_layers": 2.5}, "num_layers"),
        ({"num_layers": True}, "num_layers"),
        ({"causal": "yes"}, "causal"),
        ({"swiglu": 1}, "swiglu"),
        ({"num_experts": 4}, "num_experts"),
        ({"moe_layer_freq": 0}, "moe_layer_freq"),
        ({"moe_router_topk": 0}, "moe_router_topk"),
        ({"moe_shared_expert_ffn_hidden_size": -1}, "moe_shared_expert_ffn_hidden_size"),
        ({"family": "moe"}, "num_experts"),
        ({"family": "moe", "num_experts": 2, "moe_router_topk": 3}, "moe_router_topk"),
        ({"family": "moe", "num_experts": 2, "moe_ffn_hidden_size": 0}, "moe_ffn_hidden_size"),
    ],
)
def test_model_shape_validation_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        _gpt(**overrides)
