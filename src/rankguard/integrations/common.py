"""What the framework callbacks share: the session, the batch from a first input, the
FLOPs from a model's config, and rankguard's perf metrics as log keys."""

from __future__ import annotations

import torch

from rankguard.bootstrap import init
from rankguard.perf.autodetect import InputShape, model_shape_from_config
from rankguard.perf.flops import analytic_flops_per_step
from rankguard.rank.ranksession import RankSession
from rankguard.schema.coerce import as_float

__all__ = ["LOG_KEYS", "analytic_from_config", "perf_logs", "resolve_session", "set_batch"]

# perf.jsonl key -> the key a framework's logger gets
LOG_KEYS = {
    "tokens_per_sec": "rankguard/tokens_per_sec",
    "samples_per_sec": "rankguard/samples_per_sec",
    "TFLOPS_per_GPU": "rankguard/tflops_per_gpu",
    "MFU": "rankguard/mfu",
    "step_time_ms": "rankguard/step_time_ms",
}


def resolve_session(session: RankSession | None) -> RankSession:
    """The given session, or the process's (``rankguard.init()``: the launcher's under
    ``rankguard run``, a local one under plain torchrun, a no-op otherwise)."""
    return session if session is not None else init()


def perf_logs(session: RankSession, last: object) -> dict[str, float]:
    """rankguard's latest perf window as log keys (empty when none, or when it is
    ``last``: the window already given)."""
    perf = session.perf
    latest = perf.latest if perf is not None else None
    if latest is None or latest is last:
        return {}
    return {
        key: value
        for name, key in LOG_KEYS.items()
        if (value := as_float(latest.get(name))) is not None
    }


def set_batch(
    session: RankSession,
    shape: InputShape,
    *,
    micro_batches: int,
    data_parallel_size: int,
    source: str,
) -> None:
    """One replica's samples (and tokens, for token ids) of an optimizer step."""
    samples = shape.samples * micro_batches
    session.set_batch(
        samples=samples,
        tokens=shape.seq * samples if shape.seq is not None else None,
        data_parallel_size=data_parallel_size,
        source=source,
    )


def analytic_from_config(
    session: RankSession, model: torch.nn.Module, shape: InputShape, global_batch: int
) -> bool:
    """Megatron's formula from the ``config`` of ``model`` or its first sub-module that has
    a known one, unless the FLOPs are already set. True when set."""
    perf = session.perf
    if perf is None or perf.flops_per_step is not None or shape.seq is None:
        return perf is not None and perf.flops_per_step is not None
    for module in model.modules():
        model_shape = model_shape_from_config(module, shape.seq)
        if model_shape is not None:
            perf.set_flops(
                analytic_flops_per_step(model_shape, global_batch),
                f"analytic: {model_shape.family} formula from {type(module).__name__}.config,"
                f" global batch {global_batch} x {shape.seq}",
            )
            return True
    return False
