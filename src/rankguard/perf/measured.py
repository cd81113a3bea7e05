"""FLOPs measured by torch: ``FlopCounterMode`` over one forward and backward of any
``nn.Module``, cached per model and input signature.

The analytic formulas live in ``rankguard.perf.flops`` (no torch import there, so the
config and the command-line tools stay light); this module imports torch. See
``rankguard.perf.flops`` for how the two paths compare.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["FlopsCache", "StepFlopCounter", "measured_flops_per_step", "param_dtype"]

_DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}


def param_dtype(model: torch.nn.Module) -> str | None:
    """The floating dtype holding most of ``model``'s parameters (``fp32``, ``bf16``,
    ``fp16``, ``fp64``, else torch's name), None without floating parameters. What the
    model is stored in: an autocast region may compute in a narrower one."""
    sizes: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.dtype.is_floating_point:
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    if not sizes:
        return None
    dtype = max(sizes, key=lambda d: sizes[d])
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _iter_tensors(item)


def _default_loss(output: Any) -> torch.Tensor:
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"loss_fn: the model returned {type(output).__name__}, not a tensor; "
            "give loss_fn to map the output to a scalar"
        )
    return output if output.dim() == 0 else output.sum()


def _register_cpu_flash_attention() -> None:
    """Teach FlopCounterMode the CPU flash-attention kernel.

    torch 2.13's counter knows the CUDA SDPA kernels but not
    ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward), which
    ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` use on CPU: their
    attention-score FLOPs were counted as zero. We register the same formulas torch uses
    for the other SDPA kernels, through its public ``register_flop_formula`` hook, and
    only where the running torch has none.
    """
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    registry = flop_counter.flop_registry
    if forward is not None and not ({forward, forward.default} & registry.keys()):

        @flop_counter.register_flop_formula(forward)
        def _fwd(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
            return int(flop_counter.sdpa_flop_count(q, k, v))

    if backward is not None and not ({backward, backward.default} & registry.keys()):

        @flop_counter.register_flop_formula(backward)
        def _bwd(
            grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any
        ) -> int:
            return int(flop_counter.sdpa_backward_flop_count(grad_out, q, k, v))


def measured_flops_per_step(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    include_backward: bool = True,
) -> float:
    """FLOPs of ``model(*example_inputs)`` (+ backward of the loss), counted by torch.

    No optimizer step is run. The user's state is left as found: every module's
    ``training`` flag, the ``.grad`` of parameters and of leaf inputs (set to None during
    the count and put back after, so nothing accumulates into them) and the RNG state (the
    count runs in ``torch.random.fork_rng``). With ``include_backward`` the model runs in
    train mode; without it, the forward runs under ``torch.no_grad`` in its current mode.
    """
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs: must be a tuple, got {type(example_inputs).__name__}")
    compute_loss = loss_fn if loss_fn is not None else _default_loss
    modes = [(module, module.training) for module in model.modules()]
    leaves: list[torch.Tensor] = list(model.parameters())
    leaves += [t for t in _iter_tensors(example_inputs) if t.is_leaf and t.requires_grad]
    saved_grads = [t.grad for t in leaves]
    cuda_devices = sorted(
        {t.device.index or 0 for t in leaves if t.device.type == "cuda"}
        | {t.device.index or 0 for t in _iter_tensors(example_inputs) if t.device.type == "cuda"}
    )
    _register_cpu_flash_attention()
    counter = FlopCounterMode(display=False)
    try:
        for t in leaves:
            t.grad = None
        with torch.random.fork_rng(devices=cuda_devices):
            if include_backward:
                model.train()
                with counter:
                    loss = compute_loss(model(*example_inputs))
                    if not loss.requires_grad:
                        raise ValueError(
                            "include_backward: the loss does not require grad (no trainable "
                            "parameters reached it); use include_backward=False"
                        )
                    loss.backward()
            else:
                with torch.no_grad(), counter:
                    model(*example_inputs)
    finally:
        for t, grad in zip(leaves, saved_grads, strict=True):
            t.grad = grad
        for module, training in modes:
            module.training = training
    return float(counter.get_total_flops())


class StepFlopCounter:
    """``FlopCounterMode`` around a span of the real training step (a framework's
    training step, its backward): :meth:`start` at the first hook, :meth:`stop` at the
    one after the backward. Nothing is run twice, nothing is changed: the count is of
    the step the script runs anyway, once (the step it covers runs slower: keep it in
    the warm-up). Start and stop on the thread that trains (the mode is per thread;
    the backward inherits it)."""

    def __init__(self) -> None:
        _register_cpu_flash_attention()
        self._mode: FlopCounterMode | None = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        if self._mode is None:
            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._mode = mode

    def stop(self) -> float | None:
        """The FLOPs counted since :meth:`start` (None if not started or none counted)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        mode.__exit__(None, None, None)
        total = float(mode.get_total_flops())
        return total if total > 0 else None


def _signature(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _signature(v)) for k, v in value.items())))
    return ("value", repr(value))


class FlopsCache:
    """Measure a model's FLOPs once per (model or user key, input shapes, backward).

    Without a ``key`` the model's ``id`` is used; a weak reference detects a new model
    that reuses the id of a collected one, and its stale entries are dropped.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[Hashable, Hashable, bool], float] = {}
        self._owners: dict[int, weakref.ref[torch.nn.Module]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        """Forget every measurement."""
        self._values.clear()
        self._owners.clear()

    def get_or_measure(
        self,
        model: torch.nn.Module,
        example_inputs: tuple[Any, ...],
        *,
        key: Hashable | None = None,
        loss_fn: Callable[[Any], torch.Tensor] | None = None,
        include_backward: bool = True,
    ) -> float:
        """The cached count, or ``measured_flops_per_step`` on a miss."""
        owner: Hashable
        if key is not None:
            owner = ("key", key)
        else:
            ident = id(model)
            ref = self._owners.get(ident)
            if ref is not None and ref() is not model:
                stale = ("id", ident)
                self._values = {k: v for k, v in self._values.items() if k[0] != stale}
            self._owners[ident] = weakref.ref(model)
            owner = ("id", ident)
        cache_key = (owner, _signature(example_inputs), include_backward)
        cached = self._values.get(cache_key)
        if cached is not None:
            return cached
        value = measured_flops_per_step(
            model, example_inputs, loss_fn=loss_fn, include_backward=include_backward
        )
        self._values[cache_key] = value
        return value
