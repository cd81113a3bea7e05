"""What a rank's main frame says about it: is it waiting for its peers in a collective?

A record's ``main_frame`` is the innermost Python frame of the rank's training thread,
``"<file>:<line> in <function>"``. A rank whose frame is inside a collective waits for
the ranks that have not reached it: it is a victim of a stall, never its culprit. Most
collectives are visible as ``torch.distributed``'s own Python calls; some wait in C++
under a Python frame of their caller, and those callers are listed here too:

- DistributedDataParallel's gradient all-reduce runs from autograd hooks: a rank waiting
  for a peer's gradients sits in autograd's ``_engine_run_backward`` (``loss.backward()``
  returns only when the reducer's all-reduce finished); its constructor and buffer
  broadcasts wait in ``torch/distributed/utils.py`` and ``_distributed_broadcast_coalesced``.
- FSDP2's all-gathers and reduce-scatters wait in ``_fsdp_collectives.py``.

A rank whose own work hangs inside backward in C++ looks the same as one waiting there:
when every stalled rank is in a collective frame, none is told apart by its frame and
all of them are reported (the monitor's rules), as before.
"""

from __future__ import annotations

import re

__all__ = ["waits_in_collective"]

_COLLECTIVE_FRAME = re.compile(
    r"^(?:(?:distributed_c10d|c10d_logger|_fsdp_collectives)\.py:\d+ in "
    r"|utils\.py:\d+ in (?:_verify_param_shape_across_processes|_sync_module_states"
    r"|_sync_params_and_buffers)$"
    r"|graph\.py:\d+ in _engine_run_backward$"
    r"|distributed\.py:\d+ in _distributed_broadcast_coalesced$)"
)


def waits_in_collective(frame: str | None) -> bool:
    """Whether a main frame (``"file.py:line in function"``) waits for peers in a
    collective (see the module docstring for the frames counted)."""
    return bool(frame and _COLLECTIVE_FRAME.match(frame))
