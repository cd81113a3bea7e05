"""What a checkpoint holds: the user's mapping of name -> stateful object, split into the
job's global state (saved with DCP: sharded, deduplicated, resharded on load) and each
rank's own state (RNG streams, data position: one small file per rank).

Models go through DCP's ``get_model_state_dict``/``set_model_state_dict`` (DDP and FSDP2
alike), optimizers through ``get_optimizer_state_dict``/``set_optimizer_state_dict`` with
the model that owns their parameters; anything else with ``state_dict``/``load_state_dict``
is saved as it is.

Each rank's own state is one pickle; it is read back by :func:`load_plain`, which
rebuilds only plain data (dicts, lists, tuples, sets, strings, numbers, bytes), tensors
(through ``torch.load(weights_only=True)``) and NumPy arrays: a planted file cannot run
code at load time, it is refused with an error naming what it asked for.
"""

from __future__ import annotations

import io
import pickle
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rankguard.checkpoint.files import CheckpointError

__all__ = ["DataPosition", "PerRank", "RNGState", "StatePlan", "UnsafeStateError", "load_plain"]


class UnsafeStateError(CheckpointError):
    """Per-rank state that cannot be loaded: it asks for more than plain data, tensors
    and arrays, or it is not a pickle at all."""


def _storage_from_bytes(data: bytes) -> Any:
    # what ``torch.storage._load_from_bytes`` does, without arbitrary unpickling
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _allowed() -> dict[tuple[str, str], Any]:
    import collections

    import torch._utils

    out: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "complex"): complex,
        ("builtins", "bytearray"): bytearray,
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
    }
    try:
        import numpy as np
    except ImportError:
        return out
    core = getattr(np, "_core", None) or np.core  # NumPy 2 names it _core; pickles say either
    for mod in ("numpy.core", "numpy._core"):
        out[(f"{mod}.numeric", "_frombuffer")] = core.numeric._frombuffer
        out[(f"{mod}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        out[(f"{mod}.multiarray", "scalar")] = core.multiarray.scalar
    out[("numpy", "ndarray")] = np.ndarray
    out[("numpy", "dtype")] = np.dtype
    return out


class _PlainUnpickler(pickle.Unpickler):
    allowed: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafeStateError(
                f"per-rank state asks for {module}.{name}: only plain data, tensors and "
                "NumPy arrays are loaded (a file not written by this job?)"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeStateError("per-rank state: persistent references are not loaded")


def load_plain(data: bytes) -> Any:
    """Unpickle ``data`` allowing only plain data, tensors and NumPy arrays;
    :class:`UnsafeStateError` names anything else it asks for."""
    if not _PlainUnpickler.allowed:
        _PlainUnpickler.allowed = _allowed()
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafeStateError:
        raise
    except Exception as exc:  # a torn or foreign file: whatever the unpickler raised
        raise UnsafeStateError(f"per-rank state unreadable: {type(exc).__name__}: {exc}") from None


class PerRank:
    """Base of state that differs between ranks and is saved per rank, never resharded:
    on a load with another world size, rank r takes rank ``r % saved_world`` 's copy."""

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError


class RNGState(PerRank):
    """The random streams of this rank: torch (CPU), CUDA (when available), Python's
    ``random`` and NumPy's global generator (when NumPy is installed)."""

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = torch.cuda.get_rng_state_all()
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            out["numpy"] = np.random.get_state()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
        if "numpy" in state_dict:
            try:
                import numpy as np
            except ImportError:
                return
            np.random.set_state(state_dict["numpy"])


@dataclass
class DataPosition(PerRank):
    """Where this rank is in its data: ``epoch``, ``index`` (samples or batches, as the
    loop counts) and free-form ``extra``; update it in the loop, it is saved as it is."""

    epoch: int = 0
    index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "extra": dict(self.extra)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.index = int(state_dict["index"])
        self.extra = dict(state_dict.get("extra") or {})


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


class StatePlan:
    """The user's state mapping, classified once (at construction)."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or not state:
            raise ValueError("state: a non-empty mapping of name -> stateful object")
        self.models: dict[str, torch.nn.Module] = {}
        self.optims: dict[str, tuple[torch.optim.Optimizer, torch.nn.Module]] = {}
        self.others: dict[str, Any] = {}
        self.per_rank: dict[str, Any] = {}
        for name, obj in state.items():
            if not isinstance(name, str) or not name or "." in name or name.startswith("_"):
                raise ValueError(
                    f"state: key {name!r} must be a non-empty name without '.', not "
                    "starting with '_'"
                )
            if isinstance(obj, torch.nn.Module):
                self.models[name] = obj
            elif isinstance(obj, PerRank):
                self.per_rank[name] = obj
            elif isinstance(obj, torch.optim.Optimizer):
                self.optims[name] = (obj, torch.nn.Module())  # owner filled below
            elif _has_state(obj):
                self.others[name] = obj
            else:
                raise ValueError(
                    f"state[{name!r}]: {type(obj).__name__} has no state_dict/"
                    "load_state_dict; wrap it (rankguard.checkpoint.DataPosition, or any "
                    "object with those two methods)"
                )
        for name, (opt, _) in list(self.optims.items()):
            self.optims[name] = (opt, self._owner(name, opt))

    def _owner(self, name: str, opt: torch.optim.Optimizer) -> torch.nn.Module:
        params = {id(p) for group in opt.param_groups for p in group["params"]}
        for model in self.models.values():
            if any(id(p) in params for p in model.parameters()):
                return model
        raise ValueError(
            f"state[{name!r}]: optimizer over parameters of no model in the state; put "
            "its model in the same mapping (DCP's optimizer state dict is keyed by the "
            "model's parameter names)"
        )

    def stepped_storages(self) -> set[int]:
        """Storage pointers of what only ``optimizer.step()`` changes: the parameters
        an optimizer steps and that optimizer's state tensors."""
        out: set[int] = set()
        for opt, _ in self.optims.values():
            for group in opt.param_groups:
                out.update(_storage_ptr(p) for p in group["params"])
            for st in opt.state.values():
                out.update(_storage_ptr(v) for v in st.values() if torch.is_tensor(v))
        return out

    def global_state_dict(self) -> dict[str, Any]:
        """The job's state as DCP saves and loads it (tensors of the live objects)."""
        # DCP's state-dict helpers at the first save or load, not at import (see _dcp in
        # checkpoint/manager.py: a rank that never checkpoints does not import DCP)
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        out: dict[str, Any] = {}
        for name, model in self.models.items():
            out[name] = get_model_state_dict(model)
        for name, (opt, model) in self.optims.items():
            out[name] = get_optimizer_state_dict(model, opt)
        for name, obj in self.others.items():
            out[name] = obj.state_dict()
        return out

    def load_global(self, loaded: dict[str, Any]) -> None:
        """Push a loaded ``global_state_dict()`` into the live objects."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        for name, model in self.models.items():
            set_model_state_dict(model, loaded[name])
        for name, (opt, model) in self.optims.items():
            set_optimizer_state_dict(model, opt, loaded[name])
        for name, obj in self.others.items():
            obj.load_state_dict(loaded[name])

    def per_rank_bytes(self) -> bytes:
        return pickle.dumps(
            {name: obj.state_dict() for name, obj in self.per_rank.items()},
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def parse_per_rank(self, data: bytes) -> dict[str, Any]:
        """The saved per-rank state (:func:`load_plain`), not yet applied."""
        loaded = load_plain(data)
        if not isinstance(loaded, dict):
            raise UnsafeStateError(f"per-rank state: a mapping, got {type(loaded).__name__}")
        return loaded

    def load_per_rank(self, data: bytes | dict[str, Any]) -> None:
        """Apply saved per-rank state (bytes as saved, or :meth:`parse_per_rank`'s)."""
        loaded = self.parse_per_rank(data) if isinstance(data, bytes) else data
        for name, obj in self.per_rank.items():
            if name in loaded:
                obj.load_state_dict(loaded[name])


def _storage_ptr(t: torch.Tensor) -> int:
    """Where a tensor's data lives (a DTensor's: its local shard's)."""
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        t = to_local()
    return int(t.untyped_storage().data_ptr())
