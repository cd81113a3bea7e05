"""``rankguard.inprocess.wrap(fn)``: re-enter the training function after a fault.

One call of the wrapped function is a sequence of *rounds*. Each round has its own key
prefix in the job's store (``rankguard/inprocess/<run>/<call>/<round>/``), so keys of an
earlier round never mix with a later one, and its own process group::

    join      every rank arrives (a lost peer or an ``abandon`` key ends the wait)
    init      init_process_group(store=PrefixStore(round), timeout=...); a failure (a
              peer late past the barrier: the rendezvous timed out) is the round's fault
    run       fn(*args, **kwargs): the user restores state and trains
    complete  every rank done -> return fn's result
    fault     an exception, a peer's fault (the round's ``failed`` key) or this rank's
              soft timeout: report it, tear the group down (NCCL abort, destroy),
              spend one restart from the budget, join the next round

A watcher thread per rank (one for the whole call, not one per round) waits on the
round's ``failed`` key, bumps the rank's store heartbeat, and checks that the main
thread still runs Python (:class:`~.interrupt.Liveness`): stuck ``soft_timeout`` seconds,
it reports a hang, aborts the communicator and interrupts the main thread; stuck
``hard_timeout`` seconds, it ends the process so the launcher's restart takes over.

Past the restart budget, or when a peer cannot re-enter (its process died: a rank on its
host sees it exited, or, with no rank there to see it, its store heartbeat stands still
longer than ``hard_timeout``; :mod:`.peers`), the wrapper raises
:class:`InProcessRestartError`: the script fails and ``rankguard run`` restarts the
processes. A peer that is alive and slow (starved of CPU, in a long garbage collection,
its main thread still stuck) is waited for.

With standbys (``--standby-ranks``, :mod:`rankguard.live`): a standby waits in
:meth:`_Call.run` until the launcher gives it a lost rank's number, then ends the
survivors' running round and joins the next one as that rank; survivors wait at the
barrier for a peer the launcher is replacing instead of giving up on it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.inprocess.interrupt import Interrupter, Liveness, RestartInterrupt
from rankguard.inprocess.peers import Life, PeerWatch, ProcessId, silence_bound
from rankguard.inprocess.policy import (
    FaultReport,
    RestartBudget,
    apply_environment,
    choose_culprit,
    culprit_cause,
    lost_ranks,
    timeout_problems,
)
from rankguard.inprocess.sockets import shutdown_sockets, tcp_sockets
from rankguard.live.link import InProcessRestartError, LiveLink, count_restarts_with
from rankguard.live.link import bind as bind_live
from rankguard.live.link import current as live_link
from rankguard.live.plan import LIVE_CAUSE, SHRINK_CAUSE
from rankguard.live.roles import promoted_environ
from rankguard.rank import runenv
from rankguard.rank.ranksession import current as current_session
from rankguard.rank.runenv import RunEnv
from rankguard.rank.timeline import RESTART_PHASE
from rankguard.schema.blocks import InProcessBlock, InProcessRestart
from rankguard.schema.frames import waits_in_collective

if TYPE_CHECKING:
    from rankguard.rank.ranksession import RankSession

__all__ = [
    "HARD_TIMEOUT_EXIT_CODE",
    "RESTART_PHASE",
    "InProcessRestartError",
    "RestartInfo",
    "current",
    "live_link",
    "restart_count",
    "run_config",
    "wrap",
]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: Exit status of a rank ended by the hard timeout (the launcher restarts the group).
HARD_TIMEOUT_EXIT_CODE = 124
_CHUNK_S = 0.2  # longest single blocking store wait of the main thread
_SHRINK_CHUNK_S = 0.05  # the barrier's wait where a lost rank may be dropped


class RestartInfo:
    """What the training function may ask: ``count`` restarts so far in this call, and
    the last one's ``cause``, ``culprit`` rank and ``message``."""

    __slots__ = ("cause", "count", "culprit", "message")

    def __init__(self) -> None:
        self.count = 0
        self.cause: str | None = None
        self.culprit: int | None = None
        self.message: str | None = None


_local = threading.local()


def current() -> RestartInfo | None:
    """The restart state of the wrapped call running in this thread (None outside)."""
    return getattr(_local, "info", None)


def restart_count() -> int:
    """In-process restarts so far in the wrapped call running in this thread (0 in the
    first round, and outside a wrapped call)."""
    info = current()
    return info.count if info is not None else 0


count_restarts_with(restart_count)  # what live recovery's state restore reads

_NOT_WRAPPED = contextlib.nullcontext()


def atomic() -> contextlib.AbstractContextManager[None]:
    """A section an in-process restart does not cut (NVRx's ``CallWrapper.atomic``):
    an interrupt (a peer failed, this rank is stuck) that comes inside it is raised when
    it ends. Wrap the optimizer step together with the state a re-entry resumes from, so
    that a round ends before a step or after it, never in its middle. Reentrant; a no-op
    outside a wrapped call. A collective inside it still ends the section when its peer
    is gone (NCCL's abort releases it, gloo's shut connections raise)."""
    interrupter = getattr(_local, "interrupter", None)
    return interrupter if interrupter is not None else _NOT_WRAPPED


def _torch_dist() -> Any:
    import torch.distributed as dist  # here: `import rankguard` stays torch-free

    return dist


def abort_communicators(dist: Any, backend: str) -> None:
    """Unblock collectives in flight: ``ProcessGroup.abort()`` of the default group on
    NCCL (its kernels and the blocked ``wait`` return with an error). On gloo it is not
    done: torch 2.13's gloo abort does not release a blocked collective (measured); the
    round's sockets shut down do (:meth:`_Call._release_group`)."""
    if backend != "nccl" or not dist.is_initialized():
        return
    group = dist.group.WORLD
    if group is not None:
        group.abort()


def _main_frame(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return ""
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


_COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py")


def _in_collective(frame: str) -> bool:
    return waits_in_collective(frame)


_TRANSPORT_ERRORS = ("/gloo/transport/", "ProcessGroupGloo")
"""In the message of an error gloo raised: a collective that broke (also when it is
raised out of DDP's backward, where no torch.distributed frame is on the traceback)."""


def _raised_in_collective(exc: BaseException) -> bool:
    """Did ``exc`` come out of a torch.distributed call (a collective that broke because
    a peer left or timed out: an echo of another rank's fault, not a cause)? Either a
    torch.distributed frame raised it or gloo's transport wrote it (DDP's all-reduce
    fails inside the autograd engine: no Python frame of torch.distributed)."""
    if isinstance(exc, RuntimeError) and any(m in str(exc)[:500] for m in _TRANSPORT_ERRORS):
        return True
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return bool(last and os.path.basename(last) in _COLLECTIVE_FILES)


def _default_store(timeout_s: float, env: RunEnv | None = None) -> Any:
    """A client of the job's store: torch elastic's worker store (MASTER_ADDR/PORT)."""
    dist = _torch_dist()
    env = env or runenv.current()
    addr, port = env.master_addr, env.master_port
    if not addr or not port:
        raise InProcessRestartError(
            "in-process restart needs the job's store: MASTER_ADDR and MASTER_PORT are not "
            "set (launch with `rankguard run` or torchrun, or pass store_factory)"
        )
    try:
        return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # an address that does not resolve, nobody listening
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise InProcessRestartError(
            f"in-process restart: cannot reach the job's store at {addr}:{port} "
            f"(MASTER_ADDR, MASTER_PORT) within {timeout_s:g}s: {type(exc).__name__}: {first}"
        ) from exc


def run_config(env: RunEnv | None = None) -> InProcessRestartConfig | None:
    """The run's ``inprocess_restart`` section under ``rankguard run`` (else None)."""
    return (env or runenv.current()).section("inprocess_restart", InProcessRestartConfig)


def wrap(
    fn: F | None = None,
    *,
    config: InProcessRestartConfig | None = None,
    store_factory: Callable[[], Any] | None = None,
    session: RankSession | None = None,
    on_hard_timeout: Callable[[str], None] | None = None,
    env: RunEnv | None = None,
) -> Any:
    """Wrap a training function for in-process restart (also a decorator, with or
    without arguments).

    ``config``: default, the run's ``inprocess_restart`` under ``rankguard run``, else
    ``InProcessRestartConfig(enabled=True)``. Disabled: ``fn`` is returned as it is (and
    a warning says so under ``rankguard run``). The wrapper initialises the default
    process group in every round: ``fn`` must not call ``init_process_group`` and must
    build what holds the group (DDP, FSDP) inside. ``store_factory``: a new client of the
    job's store (default: ``MASTER_ADDR``/``MASTER_PORT``); ``session``: the rankguard
    session (default: ``rankguard.session.current()``); ``env``: the run's environment
    (default: this process's, read when the wrapped function is called)."""
    if fn is None:
        return functools.partial(
            wrap,
            config=config,
            store_factory=store_factory,
            session=session,
            on_hard_timeout=on_hard_timeout,
            env=env,
        )
    cfg = config
    if cfg is None:
        cfg = run_config(env)
        if cfg is not None and not cfg.enabled:
            logger.warning(
                "rankguard: inprocess.wrap(%s) has NO effect: inprocess_restart.enabled=false "
                "in this run's config; a fault restarts the processes",
                getattr(fn, "__name__", fn),
            )
        cfg = cfg or InProcessRestartConfig(enabled=True)
    if not cfg.enabled:
        return fn
    resolved = cfg

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        call = _Call(
            fn,
            resolved,
            store_factory=store_factory,
            session=session,
            on_hard_timeout=on_hard_timeout,
            env=env or runenv.current(),
        )
        return call.run(args, kwargs)

    return wrapped


class _Call:
    """One call of the wrapped function: its rounds, its watcher thread."""

    _calls = 0  # distinct key prefix per call in this process

    def __init__(
        self,
        fn: Callable[..., Any],
        cfg: InProcessRestartConfig,
        *,
        store_factory: Callable[[], Any] | None,
        session: RankSession | None,
        on_hard_timeout: Callable[[str], None] | None,
        env: RunEnv,
    ) -> None:
        self.fn = fn
        self.cfg = cfg
        self.rank = env.rank  # this rank's number in the full world (its keys, its heartbeats)
        self.world = env.world_size  # the full world (the job's training ranks)
        # the ranks of the full world in the round (after a shrink: the survivors, whose
        # process-group ranks are their places in this list)
        self.members: list[int] = list(range(self.world))
        self.hostname = socket.gethostname()
        self.process = ProcessId.own(self.hostname)  # what a peer on this host checks
        factory = store_factory or (lambda: _default_store(cfg.barrier_timeout, env))
        self._factory = factory
        run = env.run_id or env.elastic_run_id or "local"
        attempt = env.restart_count
        _Call._calls += 1
        self.prefix = f"rankguard/inprocess/{run}/{attempt}/{_Call._calls}/"
        self.info = RestartInfo()
        self.budget = RestartBudget(
            cfg.max_restarts_per_window, cfg.restart_window, cfg.max_iterations
        )
        if session is None:
            session = current_session()
        self.session: RankSession | None = (
            session if session is not None and session.enabled else None
        )
        self.on_hard_timeout = on_hard_timeout or self._exit_process
        self.backend = cfg.backend or self._auto_backend()
        # gloo: just past the soft timeout, so that a stuck rank's own watcher reports
        # the hang (and names the culprit) before its peers' collectives time out
        self.pg_timeout = cfg.process_group_timeout or (
            600.0
            if self.backend == "nccl"
            else cfg.soft_timeout + 2 * cfg.monitor_thread_interval + 0.5
        )
        self.round = 0
        self.phase = "joining"  # joining | running | recovering (read by the watcher)
        self.recovering_since: float | None = None
        # a lost peer's standby is on its way: the barrier waits for it up to this long
        self.awaiting_standby_s: float | None = None
        self.fault_at: float | None = None  # monotonic time of the round's fault
        self.last_reentry_s: float | None = None  # fault -> fn called again
        self.last_fault: InProcessRestart | None = None
        self.interrupter = Interrupter()
        self.interrupter.boundary = _Call._attempt.__code__  # imports inside the round
        self.liveness = Liveness()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._store: Any = None
        self._wstore: Any = None
        self._handled_round = -1
        self._setup_failing_since: float | None = None  # group set-ups failing since
        self._group_store: Any = None  # the round's group's store (see _form_group)
        self._soft_round = -1
        self._saved_phase = "train"
        self._at_interrupt: tuple[float, str] = (0.0, "")
        self._before_group: frozenset[int] = frozenset()  # TCP sockets before the group
        self._group_sockets: tuple[int, frozenset[int]] = (-1, frozenset())  # (round, its)
        self.live = LiveLink.from_env(env)  # None: the run has no standbys
        if self.live is not None:
            self.live.shrink = cfg.shrink_when_no_standby

    # ---- setup ------------------------------------------------------------------------

    @staticmethod
    def _auto_backend() -> str:
        try:
            import torch

            return "nccl" if torch.cuda.is_available() else "gloo"
        except Exception:
            return "gloo"

    def _announce(self) -> None:
        cfg = self.cfg
        lines: list[str] = []
        late: list[str] = []
        if cfg.set_nccl_env:
            lines, late = apply_environment(os.environ, torch_imported="torch" in sys.modules)
        fine, problems = timeout_problems(
            backend=self.backend,
            pg_timeout=self.pg_timeout,
            hard_timeout=cfg.hard_timeout,
            environ=os.environ,
        )
        problems = late + problems
        if self.rank == 0:
            logger.warning(
                "rankguard: in-process restart ON (granularity %s, soft %gs, hard %gs, "
                "%d per %gs): %s",
                cfg.granularity,
                cfg.soft_timeout,
                cfg.hard_timeout,
                cfg.max_restarts_per_window,
                cfg.restart_window,
                "; ".join(lines + fine),
            )
        for problem in problems:
            logger.error("rankguard: in-process restart: %s", problem)

    def _key(self, round_: int, name: str) -> str:
        return f"{self.prefix}{round_}/{name}"

    def _hb_key(self, rank: int) -> str:
        return f"{self.prefix}hb/{rank}"

    def _proc_key(self, rank: int) -> str:
        return f"{self.prefix}proc/{rank}"

    def _publish_process(self) -> None:
        """This process as the rank's (a standby that took a rank replaces the lost one's)."""
        if self.process is not None:
            self._store.set(self._proc_key(self.rank), self.process.to_json())

    def _peer_life(self, r: int, p: int) -> tuple[Life, str]:
        """What this rank knows of peer ``p``'s process at round ``r``'s barrier: its own
        check on a shared host, else what a rank on the peer's host wrote."""
        store = self._store
        gone = self._key(r, f"gone/{p}")
        if store.check([gone]):
            return Life.DEAD, store.get(gone)[:300].decode(errors="replace")
        key = self._proc_key(p)
        peer = ProcessId.from_json(store.get(key)) if store.check([key]) else None
        if peer is None:
            return Life.UNKNOWN, ""
        life, why = peer.check(self.process)
        if life is Life.DEAD:  # the ranks of other hosts cannot see it: say so
            store.set(gone, f"{why} (seen by rank {self.rank})")
        return life, why

    # ---- the call ---------------------------------------------------------------------

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dist = _torch_dist()
        if dist.is_initialized():
            raise InProcessRestartError(
                "in-process restart: the default process group is already initialised; the "
                "wrapper initialises it in every round: remove init_process_group from the "
                "code before the wrapped function"
            )
        self._store = self._factory()
        live = self.live
        if live is not None:
            live.store = self._store
            if live.standby and not self._take_rank(live):
                self._store = None
                raise SystemExit(0)  # not needed: the rest of the script is the ranks'
        if live is None or not live.newcomer:
            self._announce()
        self._publish_process()
        self._wstore = self._factory()  # the watcher's own connection: no shared socket
        previous = getattr(_local, "info", None)
        previous_interrupter = getattr(_local, "interrupter", None)
        _local.info = self.info
        _local.interrupter = self.interrupter
        previous_live = bind_live(live)
        self.interrupter.install()
        if self.session is not None:
            self.session.add_heartbeat_block(self.heartbeat_block)
        self._watcher = threading.Thread(
            target=self._watch, name="rankguard-inprocess", daemon=True
        )
        self._watcher.start()
        try:
            return self._rounds(dist, args, kwargs)
        finally:
            self.interrupter.armed = False
            self._stop.set()
            self._watcher.join(timeout=self.cfg.monitor_thread_interval + 5)
            if live is not None:  # a first step after a recovery the watcher had no beat for
                try:
                    live.flush(self._wstore)
                except Exception as exc:
                    logger.debug("rankguard: live recovery: resumed record: %s", exc)
            self.interrupter.uninstall()
            if dist.is_initialized():
                dist.destroy_process_group()
            _local.info = previous
            _local.interrupter = previous_interrupter
            bind_live(previous_live)
            self._store = self._wstore = None

    def _rounds(self, dist: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        while True:
            self._join(self.round)
            if self.round > 0:
                self._after_restart()
            report = self._form_group(dist)
            if report is None:
                report = self._attempt(args, kwargs)
                if isinstance(report, _Done):
                    return report.value
            self._recover(dist, report)

    def _form_group(self, dist: Any) -> FaultReport | None:
        """The round's process group; None when formed, else this rank's report of the
        failure, which ends the round like a fault in ``fn``. Past the barrier a peer may
        still be held up (stopped, starved of CPU) while the others wait for it in the
        group's store rendezvous: their wait times out (a ``DistStoreError``), and the
        late peer then fails to connect to them; the next round's barrier then waits
        for that peer on the peer evidence (:mod:`.peers`). An argument the group itself
        refuses (``ValueError``, ``TypeError``) ends the call at once, and set-ups failing
        round after round for longer than ``hard_timeout`` end it too: a configuration
        error (an address or interface that cannot be used) is said once, not retried
        for ever."""
        r, cfg = self.round, self.cfg
        store = dist.PrefixStore(self._key(r, "pg/"), self._store)
        lazy = os.environ.get("TORCH_GLOO_LAZY_INIT", "").lower() in ("1", "true")
        if self.backend == "gloo" and not lazy:  # the exchange goes on on every rank or none
            from rankguard.inprocess.setup import SetupStore  # imports torch

            store = SetupStore(
                store,
                self._store,
                self._key(r, "setup/"),
                rank=self.group_rank,
                world=len(self.members),
                timeout_s=self.pg_timeout,
            )
        # The group keeps the store on the C++ side only: a store written in Python (the
        # set-up's) must stay referenced here too, or its Python half is freed and every
        # later use (``new_group`` builds on the default group's store) fails in torch
        # ("Not implemented"); replaced by the next round's.
        self._group_store = store
        try:
            dist.init_process_group(
                self.backend,
                store=store,
                rank=self.group_rank,
                world_size=len(self.members),
                timeout=timedelta(seconds=self.pg_timeout),
            )
        except (ValueError, TypeError) as exc:
            raise InProcessRestartError(
                f"in-process restart: the {self.backend} process group cannot be set up: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except Exception as exc:
            now = time.monotonic()
            since = self._setup_failing_since = self._setup_failing_since or now
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:1500]
            message = f"rank {self.rank} could not form the process group of round {r}: {error}"
            logger.warning("rankguard: %s; the round is restarted", message)
            if now - since > cfg.hard_timeout:
                why = (
                    f"rank {self.rank}: the process group failed to form in every round for "
                    f"{now - since:.1f}s > hard_timeout {cfg.hard_timeout:g}s; last: {error}"
                )
                self._store.set(self._key(r, "failed"), str(self.rank))
                self._store.set(self._key(r + 1, "abandon"), why)
                raise InProcessRestartError(f"in-process restart abandoned: {why}") from exc
            return FaultReport(self.rank, "collective_error", message, self.hostname)
        self._setup_failing_since = None
        return None

    def _attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``fn`` once; a :class:`_Done` or this rank's :class:`FaultReport`. An
        interrupt arriving late (inside the handler below) is caught by the outer try."""
        fault: FaultReport | None = None
        try:
            try:
                self.liveness.reset()
                self._note_group_sockets()
                self.phase = "running"
                self.awaiting_standby_s = None
                self.interrupter.arm()
                if self.fault_at is not None:
                    self.last_reentry_s = time.monotonic() - self.fault_at
                    self.fault_at = None
                value = self.fn(*args, **kwargs)
                self.interrupter.armed = False
                self.phase = "recovering"
                return self._complete(value)
            except (KeyboardInterrupt, SystemExit):
                self.interrupter.armed = False
                raise
            except InProcessRestartError as exc:  # the function gives up on this group
                self.interrupter.armed = False
                self._abandon(str(exc))
                raise
            except BaseException as exc:
                self.interrupter.armed = False
                self.phase = "recovering"
                fault = self._report_for(exc)
                del exc  # its traceback holds the round's frames (and the group)
        except RestartInterrupt as late:
            self.interrupter.armed = False
            self.phase = "recovering"
            fault = fault or self._report_for(late)
        return fault

    def _abandon(self, why: str) -> None:
        """The wrapped function raised :class:`InProcessRestartError` (``live_state``
        found no copy of the state to continue from): no next round; the peers still
        in this one are interrupted and leave at the next barrier, and the launcher's
        group restart follows."""
        store, r = self._store, self.round
        try:
            store.set(self._key(r + 1, "abandon"), f"rank {self.rank}: {why}"[:1000])
            store.set(self._key(r, "failed"), str(self.rank))
        except Exception as exc:  # the store gone with the job: the peers' own exits
            logger.warning("rankguard: rank %d: abandon not written: %s", self.rank, exc)

    def _report_for(self, exc: BaseException) -> FaultReport:
        self.fault_at = self.fault_at or time.monotonic()
        if isinstance(exc, RestartInterrupt):
            stuck_s, frame = self._at_interrupt
            return FaultReport(
                self.rank,
                "interrupted",
                f"{exc or 'a peer failed'}; this rank's main thread had run no Python for "
                f"{stuck_s:.1f}s at {frame}",
                self.hostname,
                in_collective=_in_collective(frame),
                stuck_s=round(stuck_s, 3),
            )
        message = f"{type(exc).__name__}: {exc}"
        cause = "collective_error" if _raised_in_collective(exc) else "exception"
        tb = "".join(traceback.format_exception(exc, limit=-3))
        logger.error("rankguard: rank %d: round %d failed: %s", self.rank, self.round, tb)
        return FaultReport(self.rank, cause, message[:2000], self.hostname)

    def _complete(self, value: Any) -> Any:
        """Every rank finished: the result. A peer's fault meanwhile: re-enter."""
        store = self._store
        if store.add(self._key(self.round, "done"), 1) >= len(self.members):
            store.set(self._key(self.round, "all_done"), "1")
        deadline = time.monotonic() + self.cfg.completion_timeout
        while True:
            try:
                store.wait([self._key(self.round, "all_done")], timedelta(seconds=_CHUNK_S))
                if self.live is not None:
                    self.live.finish(store)  # the standbys leave
                return _Done(value)
            except Exception:
                pass
            if store.check([self._key(self.round, "failed")]):
                return FaultReport(self.rank, "interrupted", "a peer failed", self.hostname)
            if time.monotonic() > deadline:
                raise InProcessRestartError(
                    f"in-process restart: ranks did not all finish within "
                    f"completion_timeout={self.cfg.completion_timeout:g}s"
                )

    # ---- recovery ---------------------------------------------------------------------

    def _recover(self, dist: Any, report: FaultReport) -> None:
        store, r = self._store, self.round
        self.fault_at = self.fault_at or time.monotonic()
        self.recovering_since = time.monotonic()
        if self.session is not None:
            self._saved_phase = self.session.current_phase or "train"
            self.session.set_phase(RESTART_PHASE)
        if self._soft_round != r:  # else the watcher has reported this rank's hang
            store.set(self._key(r, f"fault/{self.rank}"), report.to_json())
        store.set(self._key(r, "failed"), str(self.rank))
        abort_communicators(dist, self.backend)
        self._release_group(r)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect(1)  # young cycles only: the round's frames; a full pass costs ~0.5 s
        if self.backend == "nccl" and self.cfg.empty_cuda_cache:
            import torch

            torch.cuda.empty_cache()
        refused = self.budget.spend(time.monotonic())
        if refused is not None:
            store.set(self._key(r + 1, "abandon"), f"rank {self.rank}: {refused}")
            raise InProcessRestartError(
                f"in-process restart budget spent ({refused}); last fault: {report.message}"
            )
        self.round = r + 1
        self.phase = "joining"

    def _join(self, r: int) -> None:
        """Wait for every rank at round ``r``; a lost peer or an abandon ends it."""
        store, cfg = self._store, self.cfg
        if self.live is not None:  # a newcomer joins the round the survivors are in
            self.live.current_round = r
            store.set(self.prefix + "round", str(r))
            if self.live.awaits_state:
                self._as_newcomer(r)
        store.set(self._key(r, f"here/{self.rank}"), self.hostname)
        if store.add(self._key(r, "arrived"), 1) >= self.world:
            store.set(self._key(r, "ready"), "1")
        start = time.monotonic()
        bound, bound_name = silence_bound(cfg)
        # with standbys, an exited peer is given up on only when the launcher, which sees
        # the exit too, has not said within heartbeat_timeout that one takes its place
        grace = cfg.heartbeat_timeout if self.live is not None else 0.0
        watch = PeerWatch(bound, bound_name, dead_grace=grace)
        # a shrink is decided by a rank in this loop: look for a dropped rank more often
        chunk = _SHRINK_CHUNK_S if self.live is not None and self.live.shrink else _CHUNK_S
        while True:
            try:
                store.wait([self._key(r, "ready")], timedelta(seconds=chunk))
                ready = True
            except Exception:
                ready = False
            if ready:
                self._take_members(r)
                if self.backend == "gloo":
                    self._before_group = tcp_sockets()
                return
            if store.check([self._key(r, "abandon")]):
                why = store.get(self._key(r, "abandon"))[:1000].decode(errors="replace")
                raise InProcessRestartError(f"in-process restart abandoned: {why}")
            now = time.monotonic()
            missing = [p for p in range(self.world) if not store.check([self._key(r, f"here/{p}")])]
            if self._without_dropped(r, missing):
                continue  # the round is decided: without the dropped ranks
            dead: dict[int, str] = {}  # rank -> the evidence it is gone
            for p in missing:
                life, seen = self._peer_life(r, p)
                verdict = watch.verdict(p, store.add(self._hb_key(p), 0), life, seen)
                if verdict is not None:
                    dead[p] = verdict
            live = self.live
            if (  # a lost peer's standby is on its way: this wait is its start, not a hang
                live is not None
                and self.awaiting_standby_s is None
                and any(live.replacing(store, p) for p in missing)
            ):
                self.awaiting_standby_s = cfg.barrier_timeout
            if dead and self.live is not None:  # a standby is on its way: wait for it
                dead = {p: v for p, v in dead.items() if not self.live.replacing(store, p)}
            if dead and live is not None and live.shrink:  # dropped: the others go on
                dead = {p: v for p, v in dead.items() if live.dropped(store, p) is None}
            timed_out = now - start > cfg.barrier_timeout
            if dead or timed_out:
                gone = sorted(dead) or missing
                hosts = self._hosts(r)
                lost = lost_ranks(gone, cfg.granularity, hosts)
                evidence = (
                    "; ".join(f"rank {p}: {v}" for p, v in sorted(dead.items()))
                    if dead
                    else f"not back in {cfg.barrier_timeout:g}s"
                )
                why = (
                    f"rank(s) {gone} cannot re-enter ({evidence}); "
                    f"lost with granularity={cfg.granularity}: {lost}"
                )
                store.set(self._key(r, "abandon"), why)
                raise InProcessRestartError(f"in-process restart abandoned: {why}")

    @property
    def group_rank(self) -> int:
        """This rank's number in the round's process group (its own, unless the job
        shrank: then its place among the survivors)."""
        return self.members.index(self.rank) if self.rank in self.members else self.rank

    def _without_dropped(self, r: int, missing: list[int]) -> bool:
        """Round ``r`` goes on without ``missing`` when the launcher dropped every one
        of them (no standby was left: ``inprocess_restart.shrink_when_no_standby``): the
        first rank to see it writes the round's members (the ranks here), then
        ``ready``; True once written."""
        live = self.live
        if live is None or not live.shrink or not missing:
            return False
        store = self._store
        if any(live.dropped(store, p) is None for p in missing):
            return False
        here = [p for p in range(self.world) if p not in missing]
        store.compare_set(self._key(r, "members"), "", json.dumps(here))
        store.set(self._key(r, "ready"), "1")
        return True

    def _take_members(self, r: int) -> None:
        """Round ``r``'s ranks: every rank of the full world, or the survivors of a
        shrink (the round's ``members``). When they changed, the script sees the new
        numbers as it sees any round's: ``RANK`` and ``WORLD_SIZE`` (``LOCAL_RANK``, its
        device, stays), ``dist.get_rank()`` and ``dist.get_world_size()``."""
        key = self._key(r, "members")
        members = list(range(self.world))
        if self.live is not None and self._store.check([key]):
            members = [int(p) for p in json.loads(self._store.get(key)[:65536])]
        if members == self.members:
            return
        gone = [p for p in self.members if p not in members]
        self.members = members
        live = self.live
        if live is not None and gone:
            live.shrunk_round = r
            live.dropped_pids = [pid for p in gone if (pid := live.dropped(self._store, p))]
        new = self.group_rank
        for name in ("RANK", "ROLE_RANK"):
            os.environ[name] = str(new)
        for name in ("WORLD_SIZE", "ROLE_WORLD_SIZE"):
            os.environ[name] = str(len(members))
        os.environ.setdefault("RANKGUARD_MAX_WORLD_SIZE", str(self.world))
        renumbered = getattr(current_session(), "renumbered", None)
        if callable(renumbered):  # Session.batch_plan: the world of the round
            renumbered(new, len(members))
        if new == 0 and not gone:  # a standby took a dropped rank: the world is whole
            logger.warning(
                "rankguard: round %d: the job grows back to %d of %d rank(s)",
                r,
                len(members),
                self.world,
            )
        elif new == 0:
            moved = [f"{p}->{i}" for i, p in enumerate(members) if p != i]
            logger.warning(
                "rankguard: round %d goes on with %d of %d rank(s) (rank(s) %s lost, no "
                "standby left); renumbered: %s",
                r,
                len(members),
                self.world,
                ", ".join(map(str, gone)) or "none",
                ", ".join(moved) or "none",
            )

    def _hosts(self, r: int) -> dict[int, str]:
        out = {}
        for p in range(self.world):
            key = self._key(r, f"here/{p}")
            if self._store.check([key]):
                out[p] = self._store.get(key)[:253].decode(errors="replace")
        return out

    def _after_restart(self) -> None:
        """Every rank is back: agree on the culprit of the last round, tell the monitor."""
        r = self.round - 1
        reports = []
        for p in range(self.world):
            key = self._key(r, f"fault/{p}")
            if self._store.check([key]):
                try:
                    reports.append(FaultReport.from_json(self._store.get(key)))
                except ValueError:
                    logger.warning("rankguard: unreadable fault report of rank %d", p)
        stuck_after = self.cfg.soft_timeout / 2
        culprit = choose_culprit(reports, stuck_after)
        info = self.info
        info.count = self.round
        info.cause = culprit_cause(culprit, stuck_after) if culprit else "unknown"
        info.culprit = culprit.rank if culprit else None
        info.message = culprit.message if culprit else None
        newcomers = self._newcomers(self.round)
        if newcomers:  # the peers' errors were echoes: a process was lost
            info.cause, info.culprit = LIVE_CAUSE, newcomers[0]
            info.message = (
                f"rank(s) {newcomers}: process lost; a standby took its place and every "
                "other rank re-entered in process"
            )
            culprit = None
        if self.live is not None and self.live.shrunk_round == self.round:
            dropped = sorted(set(range(self.world)) - set(self.members))
            moved = [f"{p}->{i}" for i, p in enumerate(self.members) if p != i]
            info.cause, info.culprit = SHRINK_CAUSE, dropped[0] if dropped else None
            info.message = (
                f"rank(s) {dropped}: process lost and no standby left; the other ranks "
                f"re-entered in process as {len(self.members)} rank(s) (renumbered: "
                f"{', '.join(moved) or 'none'})"
            )
            culprit = None
        self.last_fault = InProcessRestart(
            id=f"{self.prefix.removeprefix('rankguard/inprocess/')}{r}",
            round=r,
            cause=info.cause,
            culprit=info.culprit,
            culprit_host=culprit.hostname if culprit else None,
            message=info.message,
            wall_time_ns=time.time_ns(),
        )
        if self.session is not None:
            self.session.set_phase(self._saved_phase)
            self.session.mark_recovered()
            # the re-entry on disk before the round runs: a process killed in its first
            # moments (a lost rank a standby replaces) has still told node 0 of it
            self.session.publish_heartbeat()
        took = time.monotonic() - (self.recovering_since or time.monotonic())
        if self.group_rank == 0:
            logger.warning(
                "rankguard: in-process restart %d: %s on rank %s (%s); every rank back in %.3fs",
                self.round,
                info.cause,
                info.culprit,
                (info.message or "")[:200],
                took,
            )

    # ---- live recovery ----------------------------------------------------------------

    def _take_rank(self, live: LiveLink) -> bool:
        """A standby: wait for a rank; False when training completed without needing it.
        With one, join the round the survivors are in (or the next one, stopping theirs)."""
        store = self._store
        _prewarm()  # what a rank's first step imports: done while nobody waits for it
        got = live.await_assignment(store, self._stop.is_set)
        if got is None:
            logger.info("rankguard: standby pid %d: training completed, not needed", live.pid)
            return False
        promoted_environ(os.environ, rank=got.rank, local_rank=got.local_rank)
        self.rank = got.rank
        session = current_session()
        promote = getattr(session, "promote", None)
        if callable(promote):
            promote()
        self.session = session if session is not None and session.enabled else None
        key = self.prefix + "round"
        r = int(store.get(key)[:20]) if store.check([key]) else 0
        if store.check([self._key(r, "ready")]):  # the survivors run round r: end it
            store.set(self._key(r, "failed"), str(got.rank))
            r += 1
        self.round = r
        self._as_newcomer(r)
        logger.warning(
            "rankguard: standby pid %d takes rank %d (pid %d lost: %s); joining round %d",
            live.pid,
            got.rank,
            got.lost_pid,
            got.cause,
            r,
        )
        return True

    def _as_newcomer(self, r: int) -> None:
        """Round ``r`` has this rank as a newcomer (once): the survivors' ``live_state``
        brings it their state. Said again at every round until it got that state: a
        round that failed before (its group set-up, a peer's fault) leaves it without."""
        assert self.live is not None
        key = self._key(r, f"newcomer/{self.rank}")
        if self._store.check([key]):
            return
        self._store.set(key, str(self.live.pid))
        self._store.add(self._key(r, "newcomers"), 1)

    def _newcomers(self, r: int) -> list[int]:
        """The ranks that joined round ``r`` as standbys taking a lost rank's place."""
        if self.live is None:
            return []
        store = self._store
        if store.add(self._key(r, "newcomers"), 0) <= 0:
            self.live.newcomers = []
            return []
        found = [p for p in range(self.world) if store.check([self._key(r, f"newcomer/{p}")])]
        self.live.newcomers = found
        return found

    # ---- monitor ----------------------------------------------------------------------

    def heartbeat_block(self) -> InProcessBlock:
        """The ``inprocess`` block of the rank's heartbeat records."""
        return InProcessBlock(
            restarts=self.info.count,
            recovering=self.phase != "running",
            awaiting_standby_s=self.awaiting_standby_s if self.phase != "running" else None,
            last=self.last_fault,
        )

    # ---- watcher thread ---------------------------------------------------------------

    def _watch(self) -> None:
        cfg = self.cfg
        interval = min(cfg.monitor_thread_interval, _CHUNK_S)
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_beat:
                    self._wstore.add(self._hb_key(self.rank), 1)
                    next_beat = now + cfg.heartbeat_interval
                    if self.live is not None:
                        self.live.flush(self._wstore)
                self.liveness.ask()
                r = self.round
                if self.phase == "running":
                    self._watch_round(r, interval)
                else:
                    self._stop.wait(interval)
            except Exception:
                if self._stop.is_set():
                    return
                logger.exception("rankguard: in-process watcher")
                self._stop.wait(interval)

    def _watch_round(self, r: int, interval: float) -> None:
        cfg = self.cfg
        failed = self._key(r, "failed")
        if self._handled_round != r:
            try:
                self._wstore.wait([failed], timedelta(seconds=interval))
            except Exception:
                pass
            else:
                if self.round == r and self.phase == "running":
                    self._handled_round = r
                    who = self._wstore.get(failed).decode(errors="replace")
                    self._interrupt(f"rank {who} failed in round {r}")
                return
        else:
            self._stop.wait(interval)
            if self.round == r and self.interrupter.armed:  # swallowed: deliver again
                self.interrupter.fire(self.interrupter.reason)
        idle = self.liveness.idle_s()
        if idle > cfg.hard_timeout and self.round == r:
            self.on_hard_timeout(
                f"rank {self.rank}: main thread stuck {idle:.1f}s > hard_timeout "
                f"{cfg.hard_timeout:g}s at {_main_frame(self.interrupter.thread)}"
            )
            return
        if idle > cfg.soft_timeout and self._soft_round != r and self.round == r:
            self._soft_round = r
            frame = _main_frame(self.interrupter.thread)
            report = FaultReport(
                self.rank,
                "soft_timeout",
                f"main thread stuck {idle:.1f}s > soft_timeout {cfg.soft_timeout:g}s at {frame}",
                self.hostname,
                in_collective=_in_collective(frame),
                stuck_s=round(idle, 3),
            )
            self.fault_at = time.monotonic()
            self._wstore.set(self._key(r, f"fault/{self.rank}"), report.to_json())
            self._wstore.set(failed, str(self.rank))
            self._handled_round = r
            self._interrupt(report.message)

    def _interrupt(self, reason: str) -> None:
        self.fault_at = self.fault_at or time.monotonic()
        self._at_interrupt = (self.liveness.idle_s(), _main_frame(self.interrupter.thread))
        try:
            abort_communicators(_torch_dist(), self.backend)
            self._release_group(self.round)
        except Exception:
            logger.exception("rankguard: aborting the communicator failed")
        self.interrupter.fire(reason)

    def _note_group_sockets(self) -> None:
        """gloo: the TCP sockets this round's group opened (:mod:`.sockets`)."""
        if self.backend == "gloo":
            self._group_sockets = (self.round, tcp_sockets() - self._before_group)

    def _release_group(self, r: int) -> None:
        """gloo: round ``r`` failed: shut its group's sockets down, so that a
        collective waiting on a live peer fails now, not at the group's timeout."""
        noted, sockets = self._group_sockets
        if noted != r or not sockets:
            return
        self._group_sockets = (-1, frozenset())
        try:
            done = shutdown_sockets(sockets)
        except OSError:  # the group's timeout still releases it
            logger.exception("rankguard: shutting the round's gloo sockets down failed")
            return
        logger.debug("rankguard: rank %d: round %d: %d gloo socket(s) shut", self.rank, r, done)

    def _exit_process(self, why: str) -> None:
        logger.critical("rankguard: %s: exiting for the launcher's restart", why)
        if self.session is not None:
            try:
                self.session.close(clean=False, exit_code=HARD_TIMEOUT_EXIT_CODE, error=why)
            except Exception:
                logger.exception("rankguard: closing the session failed")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(HARD_TIMEOUT_EXIT_CODE)


def _prewarm() -> None:
    """Import, in a standby before it is needed, what the first round of a training
    function imports lazily (torch's compiler stack through the optimizers, DDP): an
    interrupt must not land inside a half-done import, and the survivors must not wait
    for it."""
    try:
        import torch._dynamo
        import torch.nn.parallel
        import torch.optim  # noqa: F401
    except Exception:  # the first round imports it then, slower
        logger.debug("rankguard: standby prewarm failed", exc_info=True)


class _Done:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value
