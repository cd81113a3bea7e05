"""Batch shape and FLOPs of an unmodified script, found once, without user code.

Today's inputs of the performance monitor (``set_batch``, ``perf.model``,
``measure_flops``) need a line in the script. :class:`PerfDetector` finds them itself
during the first three optimizer steps and then removes every hook it added:

1. At the first step of the lead optimizer (the first one that steps, the same rule as
   the zero-code progress hook) it notes the ids of that optimizer's parameters and adds
   PyTorch's public global module forward pre-hook.
2. During the next forward, the first module called in training mode with gradients on
   that holds one of those parameters is the root (a ``DistributedDataParallel`` wrapper,
   a GPT, an HF model): its pre-hook runs before its children's. The global hook is
   removed there and then, and ONE forward pre-hook (with keyword arguments) is put on the
   root alone.
3. Over one whole optimizer step the root's hook counts the micro-batches (root calls in
   training mode) and keeps the first call's inputs; at the end of that step everything is
   removed and the monitor gets:

   - the batch: samples = first input's ``shape[0]`` x micro-batches; tokens = samples x
     ``shape[1]`` when that input is a 2-D integer tensor (token ids: ``input_ids`` by name,
     else the first tensor argument); x the world size (pure data parallelism);
   - the FLOPs: Megatron's analytic formula (``perf.flops``) when the root, or the module it
     wraps, has a known ``config`` (nanoGPT's ``GPTConfig``, Hugging Face GPT-2, Llama,
     Mistral, Qwen2/3); otherwise one forward and backward of the unwrapped root on the kept
     inputs under ``FlopCounterMode`` (``perf.measured``), with the user's gradients,
     module modes, buffers and RNG state put back afterwards.

What the user gave always wins: a batch set with ``set_batch`` (or by an integration),
FLOPs from ``perf.flops_per_step``, ``perf.model`` or ``measure_flops`` are kept. Each
number's origin lands in the summary (``batch_source``, ``flops_source``).

Cost: nothing per step after the third optimizer step; before it, one Python call per
module call during one forward (step 2, until the root is found) and one per root call
for one step (``bench/autodetect.py``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from rankguard.perf.flops import ModelShape, analytic_flops_per_step

__all__ = [
    "InputProbe",
    "InputShape",
    "PerfDetector",
    "input_shape",
    "loss_of",
    "model_shape_from_config",
    "note_model_dtype",
    "unwrap",
]

logger = logging.getLogger(__name__)


class _Perf(Protocol):
    """What the detector needs of :class:`~rankguard.perf.reporter.PerfReporter`."""

    flops_per_step: float | None
    flops_source: str
    batch_source: str | None
    model_dtype: str | None

    def set_batch(
        self,
        *,
        samples: float | None = ...,
        tokens: float | None = ...,
        data_parallel_size: int | None = ...,
        source: str = ...,
    ) -> None: ...

    def set_flops(self, flops_per_step: float, source: str) -> None: ...

    def set_model_dtype(self, dtype: str, source: str) -> None: ...


class InputShape:
    """Samples and sequence length of one forward call (``seq`` None: not token ids)."""

    __slots__ = ("samples", "seq")

    def __init__(self, samples: int, seq: int | None) -> None:
        self.samples = samples
        self.seq = seq

    @property
    def tokens(self) -> int | None:
        return None if self.seq is None else self.samples * self.seq

    def __repr__(self) -> str:
        return f"InputShape(samples={self.samples}, seq={self.seq})"


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    elif isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def input_shape(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> InputShape | None:
    """The batch shape of one call: ``input_ids`` by name, else the first tensor of the
    positional then keyword arguments (nested lists, tuples and dicts included)."""
    kwargs = kwargs or {}
    tensor = kwargs.get("input_ids")
    if not isinstance(tensor, torch.Tensor):
        tensor = _first_tensor(args)
    if tensor is None:
        tensor = _first_tensor(kwargs)
    if tensor is None or tensor.dim() == 0:
        return None
    integer = not tensor.dtype.is_floating_point and not tensor.dtype.is_complex
    token_ids = integer and tensor.dtype != torch.bool and tensor.dim() == 2
    return InputShape(int(tensor.shape[0]), int(tensor.shape[1]) if token_ids else None)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``DistributedDataParallel`` (``.module``) or ``torch.compile``
    (``._orig_mod``) wrappers."""
    seen = 0
    while seen < 8:
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            inner = (
                module.module
                if isinstance(module, torch.nn.parallel.DistributedDataParallel)
                else None
            )
        if inner is None:
            return module
        module, seen = inner, seen + 1
    return module


def _get(cfg: Any, *names: str) -> Any:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return None


_GPT_TYPES = ("gpt2",)
_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def model_shape_from_config(module: torch.nn.Module, seq_length: int) -> ModelShape | None:
    """A :class:`ModelShape` from a known ``config`` of the model, else None.

    Known: nanoGPT's ``GPTConfig`` (``n_layer``, ``n_head``, ``n_embd``, ``vocab_size``,
    no ``model_type``), Hugging Face ``gpt2`` (``n_inner``) and the Llama-shaped
    ``llama``, ``mistral``, ``qwen2``, ``qwen3`` (GQA, SwiGLU ``intermediate_size``).
    """
    cfg = getattr(module, "config", None)
    if cfg is None:
        return None
    model_type = getattr(cfg, "model_type", None)
    try:
        if model_type is None or model_type in _GPT_TYPES:
            layers = _get(cfg, "n_layer", "num_hidden_layers")
            hidden = _get(cfg, "n_embd", "hidden_size")
            heads = _get(cfg, "n_head", "num_attention_heads")
            vocab = _get(cfg, "vocab_size")
            if None in (layers, hidden, heads, vocab):
                return None
            return ModelShape(
                family="gpt",
                num_layers=int(layers),
                hidden_size=int(hidden),
                seq_length=seq_length,
                vocab_size=int(vocab),
                num_attention_heads=int(heads),
                ffn_hidden_size=_get(cfg, "n_inner"),
            )
        if model_type in _LLAMA_TYPES:
            head_dim = _get(cfg, "head_dim")
            return ModelShape(
                family="llama",
                num_layers=int(cfg.num_hidden_layers),
                hidden_size=int(cfg.hidden_size),
                seq_length=seq_length,
                vocab_size=int(cfg.vocab_size),
                num_attention_heads=int(cfg.num_attention_heads),
                num_query_groups=_get(cfg, "num_key_value_heads"),
                kv_channels=int(head_dim) if head_dim is not None else None,
                ffn_hidden_size=int(cfg.intermediate_size),
                swiglu=True,
            )
    except (AttributeError, TypeError, ValueError) as exc:
        logger.info("rankguard perf: model config not usable for the FLOP formula: %s", exc)
    return None


def loss_of(output: Any) -> torch.Tensor:
    """A scalar to differentiate from a model's output: its ``loss`` (HF ``ModelOutput``,
    a dict), a scalar tensor it returned (nanoGPT's ``(logits, loss)``), else the sum of
    its first tensor."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    if isinstance(output, (list, tuple)):
        for item in output:
            if isinstance(item, torch.Tensor) and item.dim() == 0 and item.requires_grad:
                return item
    first = output if isinstance(output, torch.Tensor) else _first_tensor(output)
    if first is None:
        raise TypeError(f"the model returned {type(output).__name__}, with no tensor")
    return first if first.dim() == 0 else first.float().sum()


class _Call(torch.nn.Module):
    """``module(*args, **kwargs)`` as a module of positional inputs (what
    ``measured_flops_per_step`` calls)."""

    def __init__(self, module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.inner = module
        self.kwargs = kwargs

    def forward(self, *args: Any) -> Any:
        return self.inner(*args, **self.kwargs)


def measure_call_flops(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> float:
    """One forward and backward of ``module(*args, **kwargs)`` under ``FlopCounterMode``;
    buffers (e.g. batch-norm statistics) are put back as found, like the gradients,
    modes and RNG state ``measured_flops_per_step`` already restores."""
    # here, not at the top: perf.measured registers flop formulas at first use
    from rankguard.perf.measured import measured_flops_per_step

    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        return measured_flops_per_step(_Call(module, kwargs), args, loss_fn=loss_of)
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


class InputProbe:
    """ONE forward pre-hook on a module: counts its calls in training mode with gradients
    on, and keeps the shape (and optionally the inputs) of the first one. ``remove()``
    takes the hook away."""

    def __init__(self, module: torch.nn.Module, *, keep_inputs: bool = False) -> None:
        self.module = module
        self.keep_inputs = keep_inputs
        self.calls = 0
        self.shape: InputShape | None = None
        self.inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._handle: Any = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        self.calls += 1
        if self.shape is None:
            self.shape = input_shape(args, kwargs)
            if self.keep_inputs:
                self.inputs = (args, dict(kwargs))

    def reset(self) -> None:
        """Start counting afresh (the next call is the first)."""
        self.calls = 0
        self.shape = None
        self.inputs = None

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        self.inputs = None


class PerfDetector:
    """Finds the root module, its batch shape and the FLOPs per step (see the module
    docstring), then removes its hooks. ``install()`` once; ``remove()`` at the end."""

    def __init__(
        self,
        perf: _Perf,
        *,
        world_size: int,
        measure: bool = True,
        on_done: Callable[[PerfDetector], None] | None = None,
    ) -> None:
        self.perf = perf
        self.world_size = world_size
        self.measure = measure
        self.on_done = on_done
        self.root: torch.nn.Module | None = None
        self.note: str | None = None  # why a number could not be found
        self.done = False
        self._lead: weakref.ref[torch.optim.Optimizer] | None = None
        self._steps = 0
        self._param_ids: set[int] = set()
        self._opt_hook: Any = None
        self._global_hook: Any = None
        self._probe: InputProbe | None = None
        self._reaper: Any = None  # removes the optimizer hook at the next module call
        self._counting = False  # the probe has been counting since a step's start

    def install(self) -> PerfDetector:
        # here, not at the top of the module: torch.optim is heavy and only needed now
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self._opt_hook is None and not self.done:
            self._opt_hook = register_optimizer_step_post_hook(self._on_step)
        return self

    def remove(self) -> None:
        """Every hook away (at the end of the session; not from inside the optimizer
        hook, whose dictionary PyTorch is iterating then: see :meth:`_retire`)."""
        for name in ("_opt_hook", "_global_hook", "_reaper"):
            handle = getattr(self, name)
            setattr(self, name, None)
            if handle is not None:
                handle.remove()
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.remove()

    @property
    def active(self) -> bool:
        """Any hook still in place."""
        hooks = (self._opt_hook, self._global_hook, self._probe, self._reaper)
        return any(h is not None for h in hooks)

    # ---- optimizer steps -------------------------------------------------------------

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.done:  # retired; the reaper removes this hook at the next module call
            return
        if self._lead is None:  # a weak reference: a later optimizer may reuse the id
            self._lead = weakref.ref(optimizer)
        if self._lead() is not optimizer:
            return
        self._steps += 1
        try:
            if self._steps == 1:
                self._param_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
                # here, not at the top: module hooks are only needed for one forward
                from torch.nn.modules.module import register_module_forward_pre_hook

                self._global_hook = register_module_forward_pre_hook(self._find_root)
            elif self._probe is not None and self._counting:
                self._finish()
            elif self._probe is not None:  # found mid-step: count the next whole step
                self._probe.reset()
                self._counting = True
            elif self._steps >= 6:  # no root found in five steps: give up, say so
                self._give_up("no module holding the optimizer's parameters ran forward")
        except Exception as exc:  # never break the user's step
            logger.exception("rankguard perf: batch and FLOP detection failed")
            self._give_up(f"detection failed: {type(exc).__name__}: {exc}")

    def _find_root(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self._probe is not None or not (module.training and torch.is_grad_enabled()):
            return
        ids = self._param_ids
        if not any(id(p) in ids for p in module.parameters()):
            return
        self.root = module
        self._probe = InputProbe(module, keep_inputs=self.measure)
        handle, self._global_hook = self._global_hook, None
        if handle is not None:
            handle.remove()

    def _retire(self, *, reap: bool = True) -> None:
        """Done, from inside the optimizer hook: the module hooks go now; the optimizer
        hook cannot (PyTorch is iterating its hooks), so a global module pre-hook removes
        it and itself at the next module call (PyTorch copies those hooks before calling
        them)."""
        self.done = True
        handle, self._global_hook = self._global_hook, None
        if handle is not None:
            handle.remove()
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.remove()
        if reap:
            self._schedule_reap()

    def _schedule_reap(self) -> None:
        if self._opt_hook is not None and self._reaper is None:
            # here, not at the top: see _on_step
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._reaper = register_module_forward_pre_hook(self._reap)

    def _reap(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        for name in ("_opt_hook", "_reaper"):
            handle = getattr(self, name)
            setattr(self, name, None)
            if handle is not None:
                handle.remove()

    # ---- results ---------------------------------------------------------------------

    def _finish(self) -> None:
        probe = self._probe
        assert probe is not None and self.root is not None
        shape, micro, inputs = probe.shape, probe.calls, probe.inputs
        self._retire(reap=False)
        note_model_dtype(self.perf, self.root, "detected")
        try:
            if shape is None:
                self.note = "the root module's first input has no batch dimension"
            else:
                self._set_batch(shape, micro)
                if self.perf.flops_per_step is None:
                    self._set_flops(shape, micro, inputs)
        finally:
            self._schedule_reap()  # after the measurement's own forward
        if self.perf.flops_per_step is None and self.note:
            self.perf.flops_source = f"none: {self.note}"  # the summary says why
        if self.on_done is not None:
            self.on_done(self)

    def _give_up(self, why: str) -> None:
        self._retire()
        self.note = why
        logger.info("rankguard perf: no batch or FLOPs detected: %s", why)

    def _set_batch(self, shape: InputShape, micro: int) -> None:
        if self.perf.batch_source is not None:
            return
        samples = shape.samples * micro
        tokens = shape.tokens * micro if shape.tokens is not None else None
        what = f"{shape.samples} x {shape.seq}" if shape.seq is not None else f"{shape.samples}"
        self.perf.set_batch(
            samples=samples,
            tokens=tokens,
            data_parallel_size=self.world_size,
            source=(
                f"detected: {type(self.root).__name__} input {what} x {micro} micro-batches"
                f" x {self.world_size} replicas"
            ),
        )

    def _set_flops(
        self,
        shape: InputShape,
        micro: int,
        inputs: tuple[tuple[Any, ...], dict[str, Any]] | None,
    ) -> None:
        assert self.root is not None
        model = unwrap(self.root)
        global_batch = shape.samples * micro * self.world_size
        if shape.seq is not None:
            model_shape = model_shape_from_config(model, shape.seq)
            if model_shape is not None:
                self.perf.set_flops(
                    analytic_flops_per_step(model_shape, global_batch),
                    f"analytic: {model_shape.family} formula from {type(model).__name__}.config,"
                    f" global batch {global_batch} x {shape.seq}",
                )
                return
        if not self.measure or inputs is None:
            self.note = "FLOPs not measured: the first inputs were not kept"
            return
        if _sharded(model):
            self.note = "FLOPs not measured: sharded parameters (FSDP); set perf.model"
            return
        if hasattr(model, "training_step"):  # Lightning: its strategy redirects forward
            self.note = "FLOPs not measured: a LightningModule's forward is not its step"
            return
        try:
            per_micro = measure_call_flops(model, *inputs)
        except Exception as exc:  # the model cannot be called again as it was: say so
            self.note = f"FLOPs not measured: {type(exc).__name__}: {exc}"
            logger.warning("rankguard perf: %s (set perf.model or call measure_flops)", self.note)
            return
        self.perf.set_flops(
            per_micro * micro * self.world_size,
            f"measured: FlopCounterMode on {type(model).__name__}, x {micro} micro-batches"
            f" x {self.world_size} replicas",
        )


def note_model_dtype(perf: _Perf, module: torch.nn.Module, who: str) -> None:
    """Tell the performance monitor the dtype of ``module``'s parameters (the report's
    dtype), unless a module seen before already did."""
    from rankguard.perf.measured import param_dtype  # here: see measure_call_flops

    if perf.model_dtype is not None:
        return
    dtype = param_dtype(unwrap(module))
    if dtype is not None:
        perf.set_model_dtype(dtype, f"{who}: parameters of {type(unwrap(module)).__name__}")


def _sharded(module: torch.nn.Module) -> bool:
    """FSDP (1 or 2) or DTensor parameters: a forward outside the training step would
    run collectives on this rank alone."""
    if "FullyShardedDataParallel" in type(module).__name__ or "FSDP" in type(module).__name__:
        return True
    return any(
        type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor"
        for p in module.parameters()
    )
