"""Live recovery's view of ranks forked by ``--preload``'s fork server.

With ``--preload`` torch elastic runs the workers as one ``MultiprocessContext``: the
processes of a ``torch.multiprocessing`` context, forked from the fork server, each
running torch elastic's ``_wrap`` (the entry point, then its return value put on the
slot's queue, then a wait on the context's "finished" event). Its own poll ends every
worker once one fails. :class:`ForkedWorkers` shows the same processes the way
:class:`~rankguard.launcher.live.LiveRecovery` watches a ``SubprocessContext``, one
process per slot:

- a slot's process ``poll()`` is 0 once its return value is on the slot's queue (the
  process then waits for the event, alive), its exit status once it ended without one
  (a signal, an error), None while it runs;
- :meth:`ForkedWorkers.start` forks a new standby from the same fork server, running
  the same ``_wrap`` with the slot's queue and the context's event: a refill is a
  process of the context like the others (torch's ``pids()`` and ``close()`` see it in
  the slot) and starts with torch already imported, as a restarted rank does;
- :meth:`ForkedWorkers.release` sets the context's event once every process still
  running has put its return value: they then exit by themselves, as under torch's own
  poll. The event is set in a thread of its own: a process that died in its wait would
  hold a ``multiprocessing`` event's ``set`` forever (torch's poll shares that risk);
  the launcher does not wait for it, torch elastic's close ends what is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
from typing import Any

from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

__all__ = ["ForkedProcess", "ForkedWorkers", "forked_unsupported", "forked_view"]

logger = logging.getLogger(__name__)

_RELEASE_WAIT_S = 5.0

#: what :class:`ForkedWorkers` uses of torch elastic's forked workers, which are not its
#: public interface: each constructor's attributes, by the names its code sets
_NEEDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "torch.distributed.elastic.multiprocessing.api",
        "MultiprocessContext",
        ("_ret_vals", "_return_values", "_pc", "_worker_finished_event"),
    ),
    ("torch.multiprocessing.spawn", "ProcessContext", ("processes", "error_files", "sentinels")),
)


def forked_unsupported() -> str | None:
    """Why this torch's forked workers (``--preload``) cannot be watched one process at a
    time, or None when they can: checked before the launch, since what is used is not
    torch elastic's public interface (a later torch may change it)."""
    import importlib

    for module_name, cls_name, attrs in _NEEDS:
        module = importlib.import_module(module_name)
        if not callable(getattr(module, "_wrap", None)):
            return f"{module_name} has no _wrap"
        cls = getattr(module, cls_name, None)
        init = getattr(cls, "__init__", None)
        names = set(getattr(getattr(init, "__code__", None), "co_names", ()))
        missing = [a for a in attrs if a not in names]
        if missing:
            return f"{module_name}.{cls_name} sets no {', '.join(missing)}"
    return None


class ForkedProcess:
    """One slot's forked process, as ``Popen`` (``poll``, ``pid``, ``send_signal``)."""

    def __init__(self, process: Any, results: Any, returned: dict[int, Any], slot: int) -> None:
        self.process = process
        self._results = results  # the slot's return-value queue
        self._returned = returned  # the context's return values, by slot
        self.slot = slot
        self.done = False

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def poll(self) -> int | None:
        if self.done:
            return 0
        if not self._results.empty():  # returned: the process now waits for the event
            self._returned[self.slot] = self._results.get()
            self.done = True
            return 0
        code = self.process.exitcode
        return None if code is None else int(code)

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)


class ForkedWorkers:
    """A ``MultiprocessContext`` as live recovery sees a ``SubprocessContext``: the
    handlers by slot, and the context's own error files, entry point, arguments,
    environments and log files (see the module doc)."""

    def __init__(self, pcontext: MultiprocessContext) -> None:
        self.pcontext = pcontext
        pc = pcontext._pc
        assert pc is not None, "the forked workers are not started"
        self._pc = pc
        self.error_files = pcontext.error_files
        self.entrypoint = pcontext.entrypoint
        self.args = pcontext.args
        self.envs = pcontext.envs
        self.stdouts = pcontext.stdouts
        self.stderrs = pcontext.stderrs
        self.subprocess_handlers: dict[int, Any] = {
            slot: _Handler(self._wrap(process, slot)) for slot, process in enumerate(pc.processes)
        }

    def _wrap(self, process: Any, slot: int) -> ForkedProcess:
        ctx = self.pcontext
        return ForkedProcess(process, ctx._ret_vals[slot], ctx._return_values, slot)

    def start(
        self,
        *,
        entrypoint: Any,
        args: tuple[Any, ...],
        env: dict[str, str],
        stdout: str,
        stderr: str,
        local_rank_id: int,
    ) -> Any:
        """Fork a new worker into slot ``local_rank_id`` from the fork server, as torch
        elastic started the others (its ``_wrap``, the slot's queue, the context's
        event); the slot's process in the context is the new one from now on."""
        import multiprocessing

        from torch.distributed.elastic.multiprocessing.api import _wrap
        from torch.multiprocessing.spawn import _wrap as spawn_wrap

        ctx = self.pcontext
        slot = local_rank_id
        fd, error_file = tempfile.mkstemp(prefix="pytorch-errorfile-", suffix=".pickle")
        os.close(fd)
        os.unlink(error_file)  # torch's spawn writes it only when the function raised
        wrapped = (
            entrypoint,
            {slot: args},
            {slot: env},
            {slot: stdout},
            {slot: stderr},
            {slot: ctx._ret_vals[slot]},
            ctx._worker_finished_event,
            getattr(ctx, "_numa_options", None),
        )
        mp_context: Any = multiprocessing.get_context(ctx.start_method)  # forkserver
        process = mp_context.Process(
            target=spawn_wrap, args=(_wrap, slot, wrapped, error_file), daemon=False
        )
        process.start()
        pc = self._pc
        old = pc.processes[slot]
        pc.sentinels.pop(getattr(old, "sentinel", None), None)
        pc.processes[slot] = process
        pc.error_files[slot] = error_file
        pc.sentinels[process.sentinel] = slot
        ctx._return_values.pop(slot, None)
        return _Handler(self._wrap(process, slot))

    def release(self) -> None:
        """Every worker returned or ended: let the ones waiting for the event exit."""
        alive = [h.proc for h in self.subprocess_handlers.values() if h.proc.process.is_alive()]
        if not alive or not all(p.poll() == 0 for p in alive):
            return
        setter = threading.Thread(
            target=self.pcontext._worker_finished_event.set,
            name="rankguard-forked-release",
            daemon=True,
        )
        setter.start()
        setter.join(_RELEASE_WAIT_S)
        if setter.is_alive():
            logger.warning(
                "rankguard: the forked workers' finished event is held (a worker ended in "
                "its wait): the workers left are ended"
            )
            for proc in alive:
                proc.send_signal(signal.SIGTERM)


class _Handler:
    __slots__ = ("proc",)

    def __init__(self, proc: ForkedProcess) -> None:
        self.proc = proc


def forked_view(pcontext: Any, cached: ForkedWorkers | None) -> Any:
    """The context live recovery watches: a ``MultiprocessContext`` through its
    :class:`ForkedWorkers` (``cached`` when it is that context's), any other as it is."""
    if not isinstance(pcontext, MultiprocessContext):
        return pcontext
    if cached is not None and cached.pcontext is pcontext:
        return cached
    return ForkedWorkers(pcontext)
