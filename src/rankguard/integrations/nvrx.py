"""NVRx's ``RankMonitorClient`` under ``rankguard run``, unchanged.

Megatron-LM (``--enable-ft-package``) and other scripts written for NVIDIA Resiliency
Extension's fault tolerance create a ``RankMonitorClient`` and call
``init_workload_monitoring()``, ``start_section``/``end_section``, ``send_heartbeat``,
``calculate_and_set_*_timeouts`` and ``shutdown_workload_monitoring()``. The client
talks over a Unix socket (``FT_RANK_MONITOR_IPC_SOCKET``) to the rank-monitor server that
``ft_launcher`` starts for every rank; without one, ``init_workload_monitoring()`` raises.

:class:`RankMonitorBridge` is that server's side for rankguard: a thread in the rank
itself (the worker bootstrap starts it before the script, when NVRx is installed) that
listens on a private socket and answers the client with NVRx's own message classes,
framed by NVRx's own IPC helpers (imported from the installed package, so the wire
format is the client's). What the client says becomes rankguard's vocabulary:

- a heartbeat is progress (``session.step_end()``: the script's own progress signal takes
  over from the optimizer hook, as an explicit ``rg.step_end()`` does);
- the ``checkpointing`` section is rankguard's checkpointing phase (``checkpoint_timeout_s``
  or the ``checkpointing`` section timeout applies; its end is progress);
- ``setup`` and ``step`` are rankguard's own setup and train phases already (start to the
  first step; training): nothing to do, their section timeouts apply as configured;
- any other section is a phase of that name while it is open (its section timeout, else
  the out-of-section timeout, applies);
- calculated timeouts (``calculate_and_set_section_timeouts``) are recorded and published
  in the heartbeats (``nvrx`` object); rankguard's monitor keeps the timeouts of the
  launch (its own learned timeouts, ``fault_tolerance.calc_ft_timeouts``, persist across
  runs): one warning line says so.

The client's reply to ``InitMsg`` carries an NVRx ``FaultToleranceConfig`` built from the
launch's rankguard config (section, out-of-section and heartbeat timeouts, safety factor),
so ``client.section_timeouts`` and the timeouts calculation see the timeouts in force.

NVRx 0.7's client adds to that exchange, and the bridge answers it as 0.7's own rank
monitor does: its ``InitMsg`` carries ``iteration`` (the training iteration when a
framework reports one) and ``num_warmup_iters``, its ``SectionMsg`` the iteration of a
``step`` section; both are recorded and published (``nvrx.init_iteration``,
``nvrx.num_warmup_iters``, ``nvrx.iteration``). With ``skip_section_response`` set in the
config the client receives (0.7's default), the client sends heartbeats and section
messages without reading a reply, so none is sent: a reply nobody reads would fill the
socket's buffer and, a few thousand steps later, block the bridge and then the rank.

Security: the socket lives in a directory only this user can enter (0700) and a
connection from another user id (``SO_PEERCRED``) is refused before anything is read;
NVRx's framing unpickles what it reads, as ``ft_launcher``'s server does.

Where the sockets go: under ``rankguard run``, one directory per launcher
(:func:`launcher_socket_dir`: ``$TMPDIR/rg-nvrx-<launcher pid>-XXXXXXXX``, mode 0700,
named to the ranks by ``RANKGUARD_NVRX_SOCKET_DIR``), removed by the launcher when its
agent ends, so a rank that ends by a signal (SIGKILL, the SIGTERM of a restart) leaves
nothing behind in ``$TMPDIR``. A rank without one (outside the launcher) makes its own
``rg-nvrx-<pid>-XXXXXXXX``, removed when it closes. Each start also removes the
``rg-nvrx-<pid>-*`` directories of this user whose process is gone (a launcher that was
SIGKILLed); a live pid's, another user's and a symbolic link are left alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rankguard.ft.launcher_flags import nvrx_version
from rankguard.schema.blocks import NvrxBlock
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "SOCKET_DIR_ENV",
    "SOCKET_ENV",
    "SUPPORTED_VERSIONS",
    "RankMonitorBridge",
    "launcher_socket_dir",
    "nvrx_available",
    "nvrx_version",
    "serve_nvrx_client",
    "socket_base",
    "sweep_socket_dirs",
    "verification_lines",
]

logger = logging.getLogger(__name__)

SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
SOCKET_DIR_ENV = "RANKGUARD_NVRX_SOCKET_DIR"  # the launcher's directory for the sockets
_DIR_PREFIX = "rg-nvrx-"
SUPPORTED_VERSIONS = ((0, 4), (0, 7))  # inclusive major.minor range served
_CHECKPOINTING = "checkpointing"
_BUILTIN = frozenset({"setup", "step"})


def nvrx_available() -> bool:
    return importlib.util.find_spec("nvidia_resiliency_ext") is not None


# A Unix socket's path fits in 108 bytes (sun_path): the directory's name and the socket's
# (``rg-nvrx-<pid>-XXXXXXXX/rank_<r>_<pid>.sock``) take up to about 60 of them.
_SUN_PATH_MAX = 107
_NAMES_LEN = 64


def socket_base() -> Path:
    """Where the socket directories go: ``$TMPDIR`` (``tempfile.gettempdir()``), or
    ``/tmp`` when ``$TMPDIR`` is too long for a socket's path (a bind there fails with
    "AF_UNIX path too long": the ranks' NVRx clients would find no server)."""
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(str(base))) + _NAMES_LEN > _SUN_PATH_MAX and os.path.isdir("/tmp"):
        return Path("/tmp")
    return base


def _dir_pid(name: str) -> int | None:
    """The pid in a socket directory's name ``rg-nvrx-<pid>-XXXXXXXX``, else None."""
    if not name.startswith(_DIR_PREFIX):
        return None
    pid, sep, _ = name[len(_DIR_PREFIX) :].partition("-")
    return int(pid) if sep and pid.isdigit() and len(pid) < 10 else None


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def sweep_socket_dirs(tmp_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the socket directories (``rg-nvrx-<pid>-*``) of this user whose process is
    gone; the names removed. A directory of a live pid, of another user, or a symbolic
    link is left alone."""
    base = Path(tmp_dir) if tmp_dir is not None else socket_base()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    me = os.getuid()
    for name in names:
        pid = _dir_pid(name)
        if pid is None or pid == os.getpid():
            continue
        try:
            st = os.lstat(base / name)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or not _pid_gone(pid):
            continue
        shutil.rmtree(base / name, ignore_errors=True)
        removed.append(name)
    return removed


def _private_dir(path: str) -> Path | None:
    """``path`` if it is a directory (not a link) of this user that nobody else can
    enter, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
    return Path(path) if ok else None


@contextlib.contextmanager
def launcher_socket_dir() -> Iterator[Path | None]:
    """The launcher's side: while the agent runs, one private directory for every
    rank's socket (``SOCKET_DIR_ENV``, inherited by the ranks it starts), removed at the
    end whatever the ranks did; the stale directories of dead launchers and ranks are
    swept first. Nothing when NVRx is not installed."""
    if not nvrx_available():
        yield None
        return
    sweep_socket_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=socket_base()))
    before = os.environ.get(SOCKET_DIR_ENV)
    os.environ[SOCKET_DIR_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(SOCKET_DIR_ENV, None)
        else:
            os.environ[SOCKET_DIR_ENV] = before
        shutil.rmtree(path, ignore_errors=True)


def _supported(version: tuple[int, ...]) -> bool:
    lo, hi = SUPPORTED_VERSIONS
    return lo <= tuple(version[:2]) <= hi


class _Session:
    """The part of a rank session the bridge drives (a ``RankSession`` satisfies it)."""

    def step_end(self, iteration: int | None = None) -> None: ...

    def set_phase(self, name: str) -> None: ...

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None: ...

    def checkpoint_end(self) -> None: ...


class RankMonitorBridge:
    """Serves one rank's NVRx ``RankMonitorClient`` (see the module docstring).

    ``session``: the rank's session; ``nvrx_config``: the NVRx ``FaultToleranceConfig``
    sent to the client at init; ``socket_dir``: where the socket goes (default: the
    launcher's directory for them, else a new private temporary directory removed at
    :meth:`close`)."""

    ACCEPT_POLL_S = 0.5

    def __init__(
        self,
        session: Any,
        nvrx_config: Any,
        *,
        rank: int,
        socket_dir: Path | None = None,
    ) -> None:
        from nvidia_resiliency_ext.fault_tolerance import data, utils

        self._data = data
        self._read: Callable[[socket.socket], Any] = utils.read_obj_from_ipc_socket
        self._write: Callable[[Any, socket.socket], None] = utils.write_object_to_ipc_socket
        self.session = session
        self.nvrx_config = nvrx_config
        self.rank = rank
        shared = _private_dir(os.environ.get(SOCKET_DIR_ENV, "")) if socket_dir is None else None
        self._own_dir = socket_dir is None and shared is None
        if shared is not None:
            self.socket_dir = shared
            name = f"rank_{rank}_{os.getpid()}.sock"  # the launcher removes the directory
        else:
            if socket_dir is None:
                sweep_socket_dirs()
                socket_dir = Path(
                    tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=socket_base())
                )
            self.socket_dir = socket_dir
            os.chmod(self.socket_dir, 0o700)
            name = f"rank_{rank}.sock"
        self.path = self.socket_dir / name
        self._server: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # what the heartbeats show (read by the heartbeat thread)
        self.connections = 0
        self.heartbeats = 0
        self.section_events = 0
        self.open_sections: dict[str, str] = {}  # name -> the phase before it
        self.calculated: JsonObject | None = None
        # NVRx 0.7: the client's iteration at init, its warm-up iterations, the last
        # iteration a step section reported; replies to heartbeats and sections or not
        self.init_iteration: int | None = None
        self.num_warmup_iters: int | None = None
        self.iteration: int | None = None
        self.skip_section_response = bool(getattr(nvrx_config, "skip_section_response", False))
        self.refused = 0
        self.errors = 0
        self._warned_timeouts = False
        self._warned_unknown: set[str] = set()

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> RankMonitorBridge:
        """Listen, point ``FT_RANK_MONITOR_IPC_SOCKET`` at the socket, start the thread."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        os.chmod(self.path, 0o600)
        server.listen(4)
        server.settimeout(self.ACCEPT_POLL_S)
        self._server = server
        os.environ[SOCKET_ENV] = str(self.path)
        self._thread = threading.Thread(
            target=self._accept_loop, name="rankguard-nvrx", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, close every open section, remove the socket (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._close_all_sections()
        if os.environ.get(SOCKET_ENV) == str(self.path):
            del os.environ[SOCKET_ENV]
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._own_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    # ---- heartbeat fields ------------------------------------------------------------

    def heartbeat_block(self) -> NvrxBlock | None:
        """The ``nvrx`` block of the rank's heartbeats (None before any client)."""
        if not self.connections:
            return None
        with self._lock:
            failed = bool(self.refused or self.errors)
            return NvrxBlock(
                connections=self.connections,
                heartbeats=self.heartbeats,
                section_events=self.section_events,
                open_sections=tuple(sorted(self.open_sections)),
                calculated_timeouts=self.calculated,
                init_iteration=self.init_iteration,
                num_warmup_iters=self.num_warmup_iters,
                iteration=self.iteration,
                refused=self.refused if failed else None,
                errors=self.errors if failed else None,
            )

    # ---- serving ---------------------------------------------------------------------

    def _accept_loop(self) -> None:
        server = self._server
        assert server is not None
        while not self._stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            if not self._same_user(conn):
                self.refused += 1
                logger.warning(
                    "rankguard nvrx: refused a connection from another user on %s", self.path
                )
                conn.close()
                continue
            conn.settimeout(None)
            threading.Thread(
                target=self._serve, args=(conn,), name="rankguard-nvrx-conn", daemon=True
            ).start()

    @staticmethod
    def _same_user(conn: socket.socket) -> bool:
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except (OSError, AttributeError):
            return False
        _pid, uid, _gid = struct.unpack("3i", creds)
        return bool(uid == os.getuid())

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
        try:
            while not self._stop.is_set():
                msg = self._read(conn)
                if msg is None:  # the client closed (shutdown) or the framing broke
                    return
                try:
                    reply = self._handle(msg)
                except Exception as exc:  # never let the client hang on a missing reply
                    self.errors += 1
                    logger.exception("rankguard nvrx: handling %s failed", type(msg).__name__)
                    reply = None if self._unanswered(msg) else self._error(exc)
                if reply is not None:
                    self._write(reply, conn)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _unanswered(self, msg: Any) -> bool:
        """True for a message the client sends without reading a reply (NVRx 0.7's
        ``skip_section_response``: heartbeats and section messages)."""
        d = self._data
        return self.skip_section_response and isinstance(msg, d.HeartbeatMsg | d.SectionMsg)

    def _error(self, exc: Exception) -> Any:
        return self._data.ErrorMsg(cause=f"{type(exc).__name__}: {exc}")

    def _handle(self, msg: Any) -> Any:
        """The reply to one message; None where the client reads none."""
        d = self._data
        if isinstance(msg, d.InitMsg):
            self._init(msg)
            return d.OkMsg(cfg=self.nvrx_config)
        if isinstance(msg, d.AuthkeyMsg):
            return d.OkMsg()
        if isinstance(msg, d.HeartbeatMsg):
            self.heartbeats += 1
            self.session.step_end()
            return None if self._unanswered(msg) else d.OkMsg()
        if isinstance(msg, d.SectionMsg):
            iteration = getattr(msg, "iteration", None)  # NVRx 0.7
            if msg.section == "step" and isinstance(iteration, int):
                with self._lock:
                    self.iteration = iteration
            self._section(msg.section, msg.action)
            return None if self._unanswered(msg) else d.OkMsg()
        if isinstance(msg, d.UpdateConfigMsg):
            self._timeouts(msg)
            return d.OkMsg()
        name = type(msg).__name__
        if name not in self._warned_unknown:
            self._warned_unknown.add(name)
            logger.warning(
                "rankguard nvrx: the client sent %s, which rankguard does not act on; answered OK",
                name,
            )
        return d.OkMsg()

    def _init(self, msg: Any) -> None:
        """NVRx 0.7's ``InitMsg`` fields (absent before 0.7): recorded and published.
        Rank 0 says the timeouts the client gets, as NVRx prints them."""
        iteration = getattr(msg, "iteration", None)
        warmup = getattr(msg, "num_warmup_iters", None)
        with self._lock:
            self.init_iteration = iteration if isinstance(iteration, int) else None
            self.num_warmup_iters = warmup if isinstance(warmup, int) else None
        if self.rank == 0:
            for line in verification_lines(self._data, self.nvrx_config):
                print(line, file=sys.stderr, flush=True)

    def _section(self, name: str, action: Any) -> None:
        kind = getattr(action, "name", str(action))
        with self._lock:
            self.section_events += 1
        if kind == "CLOSE_ALL":
            self._close_all_sections()
            return
        if kind == "OPEN":
            if name in self.open_sections:
                return
            tracker_phase = getattr(getattr(self.session, "tracker", None), "phase", "train")
            with self._lock:
                self.open_sections[name] = tracker_phase
            if name == _CHECKPOINTING:
                self.session.checkpoint_start(None)
            elif name not in _BUILTIN:
                self.session.set_phase(name)
            return
        if kind == "CLOSE":
            with self._lock:
                previous = self.open_sections.pop(name, None)
            if previous is None:
                return
            if name == _CHECKPOINTING:
                self.session.checkpoint_end()
            elif name not in _BUILTIN:
                self.session.set_phase(previous)

    def _close_all_sections(self) -> None:
        with self._lock:
            names = list(self.open_sections)
        close = getattr(self._data.SectionAction, "CLOSE", "CLOSE")
        for name in reversed(names):
            self._section(name, close)

    def _timeouts(self, msg: Any) -> None:
        out: JsonObject = {}
        for key in ("hb_timeouts", "section_timeouts"):
            value = getattr(msg, key, None)
            if value is None:
                continue
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            out[key.removesuffix("_timeouts")] = _plain(value)
        with self._lock:
            self.calculated = {**(self.calculated or {}), **out}
        if not self._warned_timeouts and self.rank == 0:
            self._warned_timeouts = True
            logger.warning(
                "rankguard nvrx: the client calculated timeouts %s; rankguard's monitor keeps "
                "this launch's timeouts (set fault_tolerance.calc_ft_timeouts=true for "
                "rankguard's own learned timeouts, kept across runs)",
                out,
            )


def verification_lines(data: Any, cfg: Any) -> list[str]:
    """What Megatron Bridge's fault tolerance check greps for (``[FaultTolerance]`` /
    ``[RankMonitorServer]`` lines with the section timeouts): the timeouts the client
    was given, written by NVRx's own ``SectionTimeouts`` and ``HeartbeatTimeouts`` (their
    fields in NVRx's order), beside rankguard's own lines."""
    sections = data.SectionTimeouts(
        section=dict(cfg.rank_section_timeouts),
        out_of_section=cfg.rank_out_of_section_timeout,
        calculated_sections=set(),
        is_out_of_section_calculated=False,
    )
    heartbeat = data.HeartbeatTimeouts(
        initial=cfg.initial_rank_heartbeat_timeout,
        subsequent=cfg.rank_heartbeat_timeout,
        were_calculated=False,
    )
    return [
        f"[FaultTolerance] rank monitor serving the client (rankguard): Timeouts={sections}",
        f"[RankMonitorServer] section timeouts: {sections} heartbeat timeouts: {heartbeat}",
    ]


def _plain(value: Any) -> Any:
    """JSON-ready copy (sets become sorted lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def nvrx_config_from(ft: Any, heartbeat: Any) -> Any:
    """NVRx's ``FaultToleranceConfig`` for the client, from rankguard's config: the
    timeouts in force under this launch."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

    fields = {f.name for f in dataclasses.fields(FaultToleranceConfig)}
    values: dict[str, Any] = {
        "rank_section_timeouts": dict(ft.rank_section_timeouts),
        "rank_out_of_section_timeout": ft.rank_out_of_section_timeout,
        "initial_rank_heartbeat_timeout": heartbeat.initial_process_timeout_s,
        "rank_heartbeat_timeout": heartbeat.process_timeout_s,
        "safety_factor": ft.safety_factor,
        "workload_check_interval": heartbeat.scan_interval_s,
    }
    return FaultToleranceConfig(**{k: v for k, v in values.items() if k in fields})


def serve_nvrx_client(
    session: Any, ft: Any, heartbeat: Any, *, rank: int, enabled: bool = True
) -> RankMonitorBridge | None:
    """Start the bridge when NVRx is installed and this rank has a session (None
    otherwise). A version outside :data:`SUPPORTED_VERSIONS` is one warning line and no
    socket, so the client's ``init_workload_monitoring()`` fails at once, never hangs."""
    if not enabled or os.environ.get(SOCKET_ENV) or not nvrx_available():
        return None
    version = nvrx_version()
    if version is None or not _supported(version):
        if rank == 0:
            logger.warning(
                "rankguard nvrx: nvidia-resiliency-ext %s is installed; rankguard serves its "
                "RankMonitorClient for versions %s to %s only: a script that uses the client "
                "fails at init_workload_monitoring()",
                ".".join(map(str, version or ())) or "?",
                ".".join(map(str, SUPPORTED_VERSIONS[0])),
                ".".join(map(str, SUPPORTED_VERSIONS[1])),
            )
        return None
    try:
        bridge = RankMonitorBridge(session, nvrx_config_from(ft, heartbeat), rank=rank)
        return bridge.start()
    except Exception as exc:  # the script still runs; its client will say it cannot connect
        logger.warning(
            "rankguard nvrx: cannot serve the NVRx client (%s: %s)", type(exc).__name__, exc
        )
        return None
