"""Training FLOPs per optimizer step: an analytic formula and a measured count.

Why two paths. The analytic formula is free at run time and matches what Megatron-LM
reports, so our TFLOP/s and MFU are comparable with the numbers users already know. The
measured path (``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward)
gives a number for any custom ``nn.Module``, and the unit tests use it to check the
formula on small GPT, Llama and MoE models.

Analytic formula
----------------
It is Megatron-LM's ``num_floating_point_operations(args, batch_size)``: the
``transformer_flops`` branch of ``megatron/training/training.py`` (read at NVIDIA/Megatron-LM
commit 001b00c, 2025) for GQA, SwiGLU, MoE with top-k and shared experts. Not covered:
MLA, multi-token prediction, gated attention output, MoE latent projections, hybrid
Mamba/linear-attention layers. One addition: ``causal=False`` counts the full
attention-score matrix instead of half of it.

Notation: ``B`` global batch (sequences per optimizer step, all data-parallel
replicas and all micro-batches together), ``s`` sequence length, ``L`` layers, ``h``
hidden size, ``V`` vocabulary size (pass the *padded* size, as Megatron does), ``n`` query
heads, ``g`` query groups (``g = n`` for MHA), ``d`` head dim (``kv_channels``),
``q = n*d``, ``kv = g*d``, ``f`` dense FFN size, ``f_e`` expert FFN size, ``f_sh`` shared
expert FFN size, ``k`` router top-k, ``L_moe`` MoE layers (layer ``i`` is MoE when
``i % moe_layer_freq == 0``, Megatron's rule, so layer 0 is always MoE),
``L_dense = L - L_moe``, ``r = 3`` with a gated linear unit (SwiGLU: gate, up and down
GEMMs) else ``r = 2``, ``c = 1/2`` if causal else ``1``::

    F = 3 * 2 * B * s * [ L * ( h*(q + 2*kv)        # Q, K, V projections
                              + 2*c*s*q             # Q K^T and softmax(.) V
                              + q*h )               # output projection
                          + L_dense * r*h*f
                          + L_moe   * r*h*(k*f_e + f_sh)
                          + h*V ]                   # logit layer

The leading 3 is forward + backward (each GEMM runs once forward, once for the input
gradient, once for the weight gradient); the 2 is one multiply-add per MAC. Only GEMMs are
counted: norms, softmax, activations, residual adds, rotary embeddings, biases, the
embedding lookup (a gather) and the MoE router (``h*E`` per token, small) are not, by
Megatron nor here. Activation recomputation is not counted either (model FLOPs, not
hardware FLOPs). For MHA, ``f = 4h``, no SwiGLU and causal attention this reduces to the
well-known ``72*B*s*L*h^2 * (1 + s/(12h) + V/(12*L*h))``; non-causal gives ``s/(6h)``.
Megatron always halves the score term (its ``/ 2  # causal mask``), i.e. ``causal=True``.

Per-GPU rate
------------
``F`` is for the global batch, so ``TFLOP/s per GPU = F / (t_step * 1e12 * world_size)``,
exactly Megatron's ``throughput``. FlagScale divides the FLOPs of one replica's batch by
the world size and so under-reports by the data-parallel degree; use the global batch.

Measured path
-------------
``rankguard.perf.measured.measured_flops_per_step`` (it imports torch; this module does
not) counts what the given inputs do (typically one micro-batch on
one replica); multiply by micro-batches per step and the data-parallel size for ``F``.
``FlopCounterMode`` counts full ``s^2`` score FLOPs even under a causal mask, and a model
with activation checkpointing shows its recomputed forward in the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "FAMILIES",
    "FlopsBreakdown",
    "ModelShape",
    "analytic_flops_breakdown",
    "analytic_flops_per_step",
    "default_swiglu_ffn_hidden_size",
    "mfu",
    "tflops_per_gpu",
]

FAMILIES = ("gpt", "llama", "moe")

# Megatron: forward, backward input-gradient and backward weight-gradient GEMMs.
_FWD_BWD = 3
# Two FLOPs (a multiply and an add) per multiply-accumulate.
_FMA = 2


def default_swiglu_ffn_hidden_size(hidden_size: int, multiple_of: int = 256) -> int:
    """Llama's SwiGLU FFN size: ``int(8h/3)`` rounded up to a multiple of ``multiple_of``.

    Keeps the MLP parameter count close to a 4h GELU MLP (three matrices instead of two).
    For ``h = 4096`` this is 11008 (Llama-7B). Megatron's own default differs (it rounds
    ``8h/3`` down to a multiple of 64); give ``ffn_hidden_size`` to match a real model.
    """
    base = int(8 * hidden_size / 3)
    return multiple_of * math.ceil(base / multiple_of)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that its training FLOPs depend on.

    Optional fields default as follows (read the resolved values from the properties):
    ``num_query_groups`` None means MHA; ``kv_channels`` None means
    ``hidden_size / num_attention_heads``; ``swiglu`` None means True for ``llama`` and
    ``moe``, False for ``gpt``; ``ffn_hidden_size`` None means ``4h`` without SwiGLU and
    ``default_swiglu_ffn_hidden_size(h)`` with it; ``moe_ffn_hidden_size`` None means
    ``ffn_hidden_size`` (Megatron's rule).
    """

    family: str
    num_layers: int
    hidden_size: int
    seq_length: int
    vocab_size: int
    num_attention_heads: int
    num_query_groups: int | None = None
    kv_channels: int | None = None
    ffn_hidden_size: int | None = None
    swiglu: bool | None = None
    num_experts: int | None = None
    moe_router_topk: int = 1
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_ffn_hidden_size: int = 0
    moe_layer_freq: int = 1
    causal: bool = True

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: must be one of {FAMILIES}, got {self.family!r}")
        for name in (
            "num_layers",
            "hidden_size",
            "seq_length",
            "vocab_size",
            "num_attention_heads",
            "moe_router_topk",
            "moe_layer_freq",
        ):
            _check_int(name, getattr(self, name), 1)
        _check_int("moe_shared_expert_ffn_hidden_size", self.moe_shared_expert_ffn_hidden_size, 0)
        for name in ("kv_channels", "ffn_hidden_size", "moe_ffn_hidden_size"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.num_query_groups is not None:
            _check_int("num_query_groups", self.num_query_groups, 1)
            if self.num_attention_heads % self.num_query_groups != 0:
                raise ValueError(
                    f"num_query_groups: must divide num_attention_heads "
                    f"({self.num_attention_heads}), got {self.num_query_groups}"
                )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"kv_channels: required when hidden_size ({self.hidden_size}) is not divisible "
                f"by num_attention_heads ({self.num_attention_heads})"
            )
        for name in ("swiglu", "causal"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or (name == "swiglu" and value is None)):
                raise ValueError(f"{name}: must be a bool, got {value!r}")
        if self.family == "moe":
            if self.num_experts is None:
                raise ValueError("num_experts: required for family 'moe'")
            _check_int("num_experts", self.num_experts, 1)
            if self.moe_router_topk > self.num_experts:
                raise ValueError(
                    f"moe_router_topk: must be <= num_experts ({self.num_experts}), "
                    f"got {self.moe_router_topk}"
                )
        elif self.num_experts is not None:
            raise ValueError(
                f"num_experts: only for family 'moe', got {self.num_experts!r} "
                f"with family {self.family!r}"
            )

    @property
    def head_dim(self) -> int:
        """``kv_channels``, or ``hidden_size / num_attention_heads``."""
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """Number of K/V heads: ``num_query_groups``, or the head count for MHA."""
        if self.num_query_groups is not None:
            return self.num_query_groups
        return self.num_attention_heads

    @property
    def uses_swiglu(self) -> bool:
        """Whether the MLPs are gated (three GEMMs per MLP instead of two)."""
        if self.swiglu is not None:
            return self.swiglu
        return self.family != "gpt"

    @property
    def ffn_size(self) -> int:
        """Dense MLP intermediate size."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.uses_swiglu:
            return default_swiglu_ffn_hidden_size(self.hidden_size)
        return 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        """Intermediate size of one routed expert."""
        if self.moe_ffn_hidden_size is not None:
            return self.moe_ffn_hidden_size
        return self.ffn_size

    @property
    def num_moe_layers(self) -> int:
        """Layers ``i`` with ``i % moe_layer_freq == 0`` (Megatron's integer pattern)."""
        if self.family != "moe":
            return 0
        return math.ceil(self.num_layers / self.moe_layer_freq)

    @property
    def num_dense_layers(self) -> int:
        """Layers whose MLP is dense."""
        return self.num_layers - self.num_moe_layers


@dataclass(kw_only=True, slots=True, frozen=True)
class FlopsBreakdown:
    """Training FLOPs per optimizer step (forward + backward), by term, global batch."""

    qkv_projection: float
    core_attention: float
    output_projection: float
    dense_mlp: float
    moe_mlp: float
    logits: float

    @property
    def total(self) -> float:
        """Sum of all terms: what ``analytic_flops_per_step`` returns."""
        return (
            self.qkv_projection
            + self.core_attention
            + self.output_projection
            + self.dense_mlp
            + self.moe_mlp
            + self.logits
        )


def analytic_flops_breakdown(shape: ModelShape, global_batch_size: int) -> FlopsBreakdown:
    """Megatron-LM's training FLOPs per step, term by term (see the module docstring)."""
    _check_int("global_batch_size", global_batch_size, 1)
    h = shape.hidden_size
    s = shape.seq_length
    q = shape.head_dim * shape.num_attention_heads
    kv = shape.head_dim * shape.query_groups
    r = 3 if shape.uses_swiglu else 2
    # Per token, per step, every term below is a count of MACs; exact integers.
    tokens_factor = _FWD_BWD * _FMA * global_batch_size * s
    layers = shape.num_layers
    # Q K^T and softmax(Q K^T) V: 2 * s * q MACs per token each un-masked; causal halves.
    score_macs = 2 * s * q if not shape.causal else s * q
    moe_macs = (
        r
        * h
        * (shape.moe_router_topk * shape.expert_ffn_size + shape.moe_shared_expert_ffn_hidden_size)
    )
    return FlopsBreakdown(
        qkv_projection=float(tokens_factor * layers * h * (q + 2 * kv)),
        core_attention=float(tokens_factor * layers * score_macs),
        output_projection=float(tokens_factor * layers * q * h),
        dense_mlp=float(tokens_factor * shape.num_dense_layers * r * h * shape.ffn_size),
        moe_mlp=float(tokens_factor * shape.num_moe_layers * moe_macs),
        logits=float(tokens_factor * h * shape.vocab_size),
    )


def analytic_flops_per_step(shape: ModelShape, global_batch_size: int) -> float:
    """Training FLOPs (forward + backward) of one optimizer step over the GLOBAL batch.

    ``global_batch_size`` counts sequences of ``shape.seq_length`` tokens over all
    data-parallel replicas and micro-batches of the step.
    """
    return analytic_flops_breakdown(shape, global_batch_size).total


def tflops_per_gpu(flops_per_step: float, step_time_s: float, world_size: int) -> float:
    """``F_global / (t_step * 1e12 * world_size)``: achieved TFLOP/s per GPU.

    ``flops_per_step`` must be for the global batch; dividing one replica's FLOPs by the
    world size (FlagScale) under-reports by the data-parallel degree.
    """
    if not flops_per_step >= 0:
        raise ValueError(f"flops_per_step: must be >= 0, got {flops_per_step!r}")
    if not step_time_s > 0:
        raise ValueError(f"step_time_s: must be > 0, got {step_time_s!r}")
    _check_int("world_size", world_size, 1)
    return flops_per_step / (step_time_s * 1e12 * world_size)


def mfu(tflops_per_gpu: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation as a ratio (0-1); None without a peak.

    Not clamped: a value above 1 means the FLOPs or the peak are wrong, and should show.
    """
    if peak_tflops is None:
        return None
    if not peak_tflops > 0:
        raise ValueError(f"peak_tflops: must be > 0 or None, got {peak_tflops!r}")
    return tflops_per_gpu / peak_tflops
