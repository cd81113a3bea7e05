"""Checks a node runs on itself besides its GPUs: NIC links, storage, stuck workers.

NVRx 0.6/0.7 check a node's NICs and its distributed storage before each rendezvous
round; torch elastic flags a worker that stays in uninterruptible sleep (its
``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``). rankguard does the same from the
kernel's own files, so that a test can hand it a copy (``sysfs_root``, ``procfs_root``):

- **NIC** (:func:`check_nics`): every physical interface (``/sys/class/net/<if>`` with a
  ``device``) that is administratively up (``flags`` bit ``IFF_UP``) must have its link:
  ``operstate`` ``up`` and ``carrier`` 1; its ``speed`` (Mb/s) is recorded, and below
  ``min_link_speed_mbps`` fails. Every InfiniBand port
  (``/sys/class/infiniband/<dev>/ports/<n>/state``) must be ``ACTIVE``; its ``rate`` is
  recorded. Virtual interfaces (loopback, bridges, veth) and interfaces taken down on
  purpose are not the job's links and are left out, unless named in ``nics``.
- **storage** (:func:`check_storage`): each directory (the log directory, the checkpoint
  directory, ``storage_paths``) must exist or be creatable, take a small write whose
  ``fsync`` completes within ``fsync_timeout_s`` (a hung Lustre or NFS mount blocks
  there: the probe runs in a thread and is given up on after the bound), and have
  ``min_free_mb`` free.
- **uninterruptible sleep** (:class:`UninterruptibleWatch`): a worker whose
  ``/proc/<pid>/stat`` state stays ``D`` longer than ``uninterruptible_timeout_s``.

Each check gives :class:`CheckResult` lines; :class:`NodeHealthReport` is the node's
verdict, written as ``node_health_node_<n>.json`` beside ``gpu_health_node_<n>.json``.
A healthy machine gives no failed line.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rankguard.health.node_config import NodeHealthConfig
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "SCHEMA_VERSION",
    "CheckResult",
    "NodeHealthReport",
    "UninterruptibleWatch",
    "check_nics",
    "check_storage",
    "process_state",
    "run_node_checks",
]

SCHEMA_VERSION = 1
_IFF_UP = 0x1
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One thing checked: ``check`` (``nic``, ``infiniband``, ``storage``), what
    (``target``: an interface, a port, a directory), whether it passed, and why not."""

    check: str
    target: str
    ok: bool
    problem: str | None = None
    detail: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NodeHealthReport:
    """The node's checks at one time; ``healthy`` when none failed."""

    results: tuple[CheckResult, ...]
    hostname: str
    checked_wall_time: str
    took_s: float

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    @property
    def healthy(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        """One line: what failed, or how much passed."""
        if self.healthy:
            kinds = sorted({r.check for r in self.results})
            return f"{len(self.results)} check(s) passed ({', '.join(kinds) or 'none'})"
        return "; ".join(f"{r.check} {r.target}: {r.problem}" for r in self.failed)

    def to_dict(self, node_rank: int | None = None) -> JsonObject:
        return {
            "schema_version": SCHEMA_VERSION,
            "status": "ok" if self.healthy else "unhealthy",
            "hostname": self.hostname,
            "node_rank": node_rank,
            "checked_wall_time": self.checked_wall_time,
            "took_s": round(self.took_s, 3),
            "checks": [r.to_dict() for r in self.results],
        }


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:  # a link that is down answers EINVAL for carrier and speed
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


# ---- NIC ------------------------------------------------------------------------------


def _net_interface(root: Path, name: str, named: bool, min_speed: int) -> CheckResult | None:
    base = root / "class" / "net" / name
    flags = _int(_read(base / "flags"))
    physical = (base / "device").exists()
    admin_up = flags is not None and bool(flags & _IFF_UP)
    if not named and (not physical or not admin_up):
        return None  # not one of the job's links: virtual, or taken down on purpose
    oper, carrier = _read(base / "operstate"), _read(base / "carrier")
    speed = _int(_read(base / "speed"))
    detail: JsonObject = {"operstate": oper, "carrier": _int(carrier), "speed_mbps": speed}
    if not base.exists():
        return CheckResult("nic", name, False, "no such interface", detail)
    if not admin_up:
        return CheckResult("nic", name, False, "administratively down", detail)
    if oper not in ("up", "unknown") or carrier != "1":
        why = f"link down (operstate {oper}, carrier {carrier})"
        return CheckResult("nic", name, False, why, detail)
    if min_speed and speed is not None and 0 < speed < min_speed:
        return CheckResult(
            "nic", name, False, f"link at {speed} Mb/s, below {min_speed} Mb/s", detail
        )
    return CheckResult("nic", name, True, None, detail)


def _ib_ports(root: Path, device: str, min_speed: int) -> list[CheckResult]:
    ports = root / "class" / "infiniband" / device / "ports"
    if not ports.is_dir():
        return [CheckResult("infiniband", device, False, "no such device")]
    out = []
    for port in sorted(p.name for p in ports.iterdir()):
        state = _read(ports / port / "state") or ""  # "4: ACTIVE"
        rate = _read(ports / port / "rate")  # "200 Gb/sec (4X HDR)"
        phys = _read(ports / port / "phys_state")  # "5: LinkUp"
        target = f"{device}/{port}"
        detail: JsonObject = {"state": state, "phys_state": phys, "rate": rate}
        gbps = _int((rate or "").split(" ", 1)[0] or None)
        if not state.endswith("ACTIVE"):
            why = f"port {state or 'unknown'}"
            out.append(CheckResult("infiniband", target, False, why, detail))
        elif min_speed and gbps is not None and gbps * 1000 < min_speed:
            why = f"port at {rate}, below {min_speed} Mb/s"
            out.append(CheckResult("infiniband", target, False, why, detail))
        else:
            out.append(CheckResult("infiniband", target, True, None, detail))
    return out


def check_nics(cfg: NodeHealthConfig) -> list[CheckResult]:
    """The node's network links (see the module's docstring)."""
    root = Path(cfg.sysfs_root)
    net, ib = root / "class" / "net", root / "class" / "infiniband"
    ib_devices = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    interfaces = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
    out: list[CheckResult] = []
    if cfg.nics:
        for name in cfg.nics:
            if name in ib_devices:
                out += _ib_ports(root, name, cfg.min_link_speed_mbps)
            else:
                result = _net_interface(root, name, True, cfg.min_link_speed_mbps)
                assert result is not None
                out.append(result)
        return out
    for name in interfaces:
        result = _net_interface(root, name, False, cfg.min_link_speed_mbps)
        if result is not None:
            out.append(result)
    for device in ib_devices:
        out += _ib_ports(root, device, cfg.min_link_speed_mbps)
    return out


# ---- storage --------------------------------------------------------------------------


def _probe(directory: Path, result: dict[str, float], errors: list[str]) -> None:
    """Create the directory if need be, write, fsync and remove a small file."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".rankguard_probe_{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"rankguard storage check\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
        result["fsync_s"] = time.monotonic() - started
        st = os.statvfs(directory)
        result["free_mb"] = st.f_bavail * st.f_frsize / _MIB
    except OSError as exc:
        errors.append(f"{exc.strerror or exc}")


def _storage_one(directory: Path, cfg: NodeHealthConfig) -> CheckResult:
    result: dict[str, float] = {}
    errors: list[str] = []
    # in a thread: an fsync on a hung mount never returns, the check must
    thread = threading.Thread(
        target=_probe, args=(directory, result, errors), name="rankguard-storage-probe", daemon=True
    )
    thread.start()
    thread.join(cfg.fsync_timeout_s)
    target = str(directory)
    if thread.is_alive():
        why = f"a small write and fsync did not complete within {cfg.fsync_timeout_s:g} s"
        return CheckResult("storage", target, False, why, {"fsync_timeout_s": cfg.fsync_timeout_s})
    detail: JsonObject = {k: round(v, 3) for k, v in result.items()}
    if errors:
        return CheckResult("storage", target, False, f"not writable: {errors[0]}", detail)
    if result["fsync_s"] > cfg.fsync_timeout_s:
        why = f"fsync took {result['fsync_s']:.1f} s (bound {cfg.fsync_timeout_s:g} s)"
        return CheckResult("storage", target, False, why, detail)
    if result["free_mb"] < cfg.min_free_mb:
        why = f"{result['free_mb']:.0f} MiB free, below {cfg.min_free_mb:g} MiB"
        return CheckResult("storage", target, False, why, detail)
    return CheckResult("storage", target, True, None, detail)


def check_storage(directories: Iterable[str | Path], cfg: NodeHealthConfig) -> list[CheckResult]:
    """Each directory once (see the module's docstring)."""
    seen: dict[str, Path] = {}
    for d in directories:
        path = Path(d).expanduser().absolute()
        seen.setdefault(str(path), path)
    return [_storage_one(path, cfg) for path in seen.values()]


def run_node_checks(cfg: NodeHealthConfig, directories: Iterable[str | Path]) -> NodeHealthReport:
    """The NIC and storage checks ``cfg`` turns on, for ``directories`` (the run's log
    and checkpoint directories; ``cfg.storage_paths`` are added)."""
    started = time.monotonic()
    results: list[CheckResult] = []
    if cfg.nic:
        results += check_nics(cfg)
    if cfg.storage:
        results += check_storage([*directories, *cfg.storage_paths], cfg)
    return NodeHealthReport(
        results=tuple(results),
        hostname=socket.gethostname(),
        checked_wall_time=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        took_s=time.monotonic() - started,
    )


# ---- uninterruptible sleep ------------------------------------------------------------


def process_state(procfs_root: str | Path, pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``D``, ``Z`` ...), None when gone.
    The command name in ``stat`` is in parentheses and may hold spaces and ``)``: the
    state is the first field after the last ``)``."""
    text = _read(Path(procfs_root) / str(pid) / "stat")
    if not text or ")" not in text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return rest[0] if rest else None


@dataclass
class UninterruptibleWatch:
    """Since when each watched pid has been in ``D`` state; :meth:`look` returns the pids
    past ``timeout_s`` (each once per spell in that state)."""

    procfs_root: str | Path
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    since: dict[int, float] = field(default_factory=dict)
    told: set[int] = field(default_factory=set)

    def look(self, pids: Iterable[int]) -> list[tuple[int, float]]:
        """``(pid, seconds in D state)`` of the pids that just passed the bound."""
        now = self.clock()
        out = []
        alive = set()
        for pid in pids:
            alive.add(pid)
            if process_state(self.procfs_root, pid) != "D":
                self.since.pop(pid, None)
                self.told.discard(pid)
                continue
            began = self.since.setdefault(pid, now)
            if now - began >= self.timeout_s and pid not in self.told:
                self.told.add(pid)
                out.append((pid, now - began))
        for pid in set(self.since) - alive:
            self.since.pop(pid, None)
            self.told.discard(pid)
        return out
