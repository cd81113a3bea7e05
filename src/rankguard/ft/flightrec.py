"""PyTorch's flight recorder on a hang: every rank's collective trace, and who did not join.

torch records each rank's recent collectives (its flight recorder, ``TORCH_FR_BUFFER_SIZE``
entries; ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is the older name) for NCCL and, in torch 2.13,
for gloo too. ``rankguard run`` turns it on for its ranks (:func:`flight_recorder_env`:
the names this torch reads, unless the user set them, and NCCL's own timeout dumps into
the run directory). When a hang is found, node 0's fault handler, before the kill, asks its
ranks for their traces (:func:`request_dumps`: one request file; each rank's
:class:`TraceDumper` thread, started with the rank, sees it and writes
``flightrec/rank_<r>.json`` with torch's JSON dump, from a thread of its own, so a main
thread blocked in a collective does not stop it); the other nodes' relays take their
ranks' traces the same way and send them through the store (:mod:`.frremote`), and
every node's traces are compared together under the job's rank numbers
(:mod:`.frverdict`: a rank that did not join, with the collective and its sequence
number; a mismatch, both sides; a communication stall, the group and its ranks).
PyTorch's own analyser
(``torchfrtrace``) is run over the same files and its output kept beside the verdict;
on gloo it cannot match the traces in torch 2.13 (gloo records no group name), so the
verdict is rankguard's own comparison of the ranks' ``pg_status``. No flight recorder
(an older torch): one line, and the stack dumps as before.

The traces are read as data, never unpickled: JSON (``_dump_fr_trace_json``, and NCCL's
own recorder's ``_dump_nccl_trace_json`` where torch has NCCL, read as one trace by
:mod:`.recorders`; on a torch
that has only the pickled dump, the rank converts its own in-memory dump with an
unpickler that allows no globals). The launcher reads only the ranks it asked, only
regular files this user owns (not through a symbolic link, at most 64 MiB), from a
``flightrec/`` folder made with the run directory's mode and checked to be this user's.
``torchfrtrace`` reads pickles: it gets copies rankguard writes itself from the checked
traces, in a private folder, never the files in ``flightrec/``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import io
import json
import logging
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankguard.ft import recorders
from rankguard.ft.frverdict import FrVerdict, compare
from rankguard.schema.jsontypes import JsonObject
from rankguard.util.fs import (
    atomic_write_json,
    create_exclusive,
    owned_subdir,
    write_all,
    write_new_then_replace,
)

__all__ = [
    "BUFFER_ENV",
    "DUMP_DIR",
    "FrVerdict",
    "TraceDumper",
    "analyse",
    "available",
    "collect_verdict",
    "flight_recorder_env",
    "read_trace",
    "request_dumps",
    "restricted_loads",
    "trace_file",
]

logger = logging.getLogger(__name__)

DUMP_DIR = "flightrec"  # <run_dir>/flightrec/rank_<r>.json: one trace per rank
REQUEST_FILE = "request.json"
PREFIX = "rank_"  # torch's analyser reads <prefix><rank> files
TRACE_SUFFIX = ".json"  # torch's own timeout dumps (pickles) are <prefix><rank>: not ours
BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_FILE_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_ENTRIES = 2000
_MAX_TRACE = 64 << 20
# torchfrtrace's entry point, in a child that gets SIGKILL when its parent thread ends
# The analyser starts at a hang's kill, as the restarted workers import torch: at their
# priority it took a core from them (their start 1.1 s slower than after a crash on 2
# cores); in SCHED_IDLE it runs in the gaps and the launcher's exit still waits for it.
# SCHED_IDLE alone yields only to the tasks of its own autogroup (Linux's
# CONFIG_SCHED_AUTOGROUP, one group per session): the workers each lead a session of
# their own (torch elastic starts them so), and between groups the scheduler shares the
# cores equally, so an idle-class analyser in the launcher's session still took a third
# of the 2 cores from the restarted workers. It runs in a session of its own, whose
# autogroup it sets to nice 19 (its own session only: the launcher's group keeps its
# share).
_RUNNER_PRELUDE = (
    "import sys\n"
    "from rankguard.util.cpuprio import yield_cpu\n"
    "yield_cpu()\n"
    "try:\n"
    "    with open('/proc/self/autogroup', 'w') as group:\n"
    "        group.write('19')\n"
    "except OSError:\n"
    "    pass\n"
    "from rankguard.rank.lifeline import set_parent_death_signal\n"
    "set_parent_death_signal()\n"
)
_RUNNER = (
    _RUNNER_PRELUDE
    + "from torch.distributed.flight_recorder.fr_trace import main\n"
    + "main(sys.argv[1:])\n"
)


def trace_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / DUMP_DIR / f"{PREFIX}{rank}{TRACE_SUFFIX}"


def available() -> bool:
    """Whether this torch has the flight recorder's dump call."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return False
    return recorders.available() or hasattr(c10d, "_dump_fr_trace")


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name:.60} refused: plain data only")


def restricted_loads(data: bytes) -> Any:
    """A pickle of plain data only (dicts, lists, tuples, strings, numbers): any global
    (a class, a function, ``__reduce__``'s callable) is refused, so nothing runs."""
    return _NoGlobals(io.BytesIO(data)).load()


def _trace_json() -> bytes:
    """This rank's flight recorders as JSON bytes: torch's JSON dumps (NCCL's recorder
    and the generic one, read as one: :mod:`.recorders`), else its pickled dump (in
    memory, torch's own) read with :func:`restricted_loads`."""
    import torch._C._distributed_c10d as c10d

    data = recorders.trace_json(include_collectives=True, only_active=False)
    if data is not None:
        return data
    dump_fr_trace = c10d._dump_fr_trace  # type: ignore[attr-defined]
    doc = restricted_loads(
        dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    )
    return json.dumps(doc, default=str).encode()


def _renamed(torch_version: str | None) -> bool:
    """Does this torch read the flight recorder's new names (and warn at each rank's
    start about the old ones)? torch 2.9 renamed them, keeping the old as aliases."""
    if torch_version is None:
        torch = sys.modules.get("torch")
        torch_version = getattr(torch, "__version__", None)
    if torch_version is None:
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return True
    try:
        major, minor = (int(part) for part in torch_version.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (2, 9)


def flight_recorder_env(
    run_dir: Path, environ: Mapping[str, str], *, torch_version: str | None = None
) -> dict[str, str]:
    """The variables that turn the flight recorder on for the ranks: the buffer size (a
    size the user set, under either name, is kept and given to the name this torch
    reads) and NCCL's timeout dumps into ``<run_dir>/flightrec/``. The old names are
    set only for a torch older than 2.9 (a newer one warns about them in every rank).
    Empty when the user switched it off (size 0)."""
    given = next((environ[n] for n in BUFFER_ENV if environ.get(n)), None)
    if given is not None and given.strip() == "0":
        return {}
    size = given or str(DEFAULT_ENTRIES)
    names = 1 if _renamed(torch_version) else 2
    out = {name: environ.get(name) or size for name in BUFFER_ENV[:names]}
    prefix = str(Path(run_dir) / DUMP_DIR / PREFIX)
    mine = next((environ[n] for n in DUMP_FILE_ENV if environ.get(n)), None)
    out.update({name: environ.get(name) or mine or prefix for name in DUMP_FILE_ENV[:names]})
    return out


# ---- rank side ------------------------------------------------------------------------


class TraceDumper:
    """A rank's daemon thread: writes its flight-recorder trace when asked.

    Polls ``<run_dir>/flightrec/request.json`` (one ``stat`` every ``poll_s``); a request
    with a new id that names this rank (or every rank) is answered with
    ``flightrec/rank_<r>`` (atomically). ``_dump_fr_trace`` takes the recorder's own lock,
    not the GIL-holding main thread, so a rank blocked in a collective still answers.
    """

    def __init__(self, run_dir: Path, rank: int, *, poll_s: float = 0.2) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.poll_s = poll_s
        self.answered = 0
        self.last_error: str | None = None
        self._seen: tuple[int, int] | None = None
        self._done_id: object = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankguard-flightrec", daemon=True)

    @classmethod
    def start_if_available(cls, run_dir: Path, rank: int) -> TraceDumper | None:
        if not available():
            if rank == 0:
                logger.warning(
                    "rankguard: this torch has no flight recorder (_dump_fr_trace): a hang's "
                    "finding gets stack dumps only, no collective trace"
                )
            return None
        dumper = cls(run_dir, rank)
        try:  # NCCL's own timeout dumps go there too (TORCH_FR_DUMP_TEMP_FILE)
            owned_subdir(run_dir, DUMP_DIR)
        except OSError as exc:
            logger.warning("rankguard: no flight-recorder dumps for this rank: %s", exc)
            return None
        dumper.start()
        return dumper

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # never raised into the rank
                self.last_error = f"{type(exc).__name__}: {exc}"

    def poll(self) -> bool:
        """Answer a new request; True when a trace was written."""
        path = self.run_dir / DUMP_DIR / REQUEST_FILE
        try:
            st = os.stat(path)
        except OSError:
            return False
        stat = (st.st_size, st.st_mtime_ns)
        if stat == self._seen:
            return False
        self._seen = stat
        try:
            request = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self._seen = None  # being replaced: read again next time
            return False
        if not isinstance(request, dict) or request.get("id") == self._done_id:
            return False
        ranks = request.get("ranks")
        if isinstance(ranks, list) and self.rank not in ranks:
            return False
        self._done_id = request.get("id")
        self.dump()
        return True

    def dump(self) -> Path:
        """Write this rank's trace (JSON) through a new temporary file: never through a
        name planted in advance (``O_CREAT|O_EXCL|O_NOFOLLOW``)."""
        data = _trace_json()
        owned_subdir(self.run_dir, DUMP_DIR)
        out = trace_file(self.run_dir, self.rank)
        write_new_then_replace(out, data)
        self.answered += 1
        return out


# ---- launcher side --------------------------------------------------------------------


def request_dumps(
    run_dir: Path, ranks: list[int], *, timeout_s: float = 10.0, poll_s: float = 0.1
) -> dict[int, Path]:
    """Ask ``ranks`` for their traces and wait up to ``timeout_s``: the traces written
    after the request, by rank (a rank that did not answer in time is missing)."""
    d = owned_subdir(run_dir, DUMP_DIR)
    t0 = time.time()
    atomic_write_json(d / REQUEST_FILE, {"id": f"{os.getpid()}-{time.time_ns()}", "ranks": ranks})
    deadline = time.monotonic() + timeout_s
    got: dict[int, Path] = {}
    while True:
        for rank in ranks:
            path = trace_file(run_dir, rank)
            try:
                fresh = path.stat().st_mtime >= t0 - 1.0
            except OSError:
                continue
            if fresh:
                got[rank] = path
        if len(got) == len(ranks) or time.monotonic() >= deadline:
            return got
        time.sleep(poll_s)


def read_trace(path: Path) -> JsonObject | None:
    """One rank's trace, read as data: a regular file owned by this user, opened without
    following a symbolic link, at most 64 MiB, JSON; None (and one line why) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("rankguard: flight-recorder trace %s not read: %s", path, exc)
        return None
    try:
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif st.st_uid != os.getuid():
            why = f"owned by uid {st.st_uid}, not by this user"
        elif st.st_size > _MAX_TRACE:
            why = f"{st.st_size} bytes (more than {_MAX_TRACE})"
        if why is not None:
            logger.warning("rankguard: flight-recorder trace %s refused: %s", path, why)
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(_MAX_TRACE + 1)
    except OSError as exc:
        logger.warning("rankguard: flight-recorder trace %s not read: %s", path, exc)
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        logger.warning("rankguard: flight-recorder trace %s is not JSON: ignored", path)
        return None
    return doc if isinstance(doc, dict) else None


def read_traces(dump_dir: Path, ranks: list[int]) -> dict[int, JsonObject]:
    """The traces of ``ranks`` (only those) that :func:`read_trace` accepts."""
    traces: dict[int, JsonObject] = {}
    for rank in sorted(set(ranks)):
        doc = read_trace(Path(dump_dir) / f"{PREFIX}{rank}{TRACE_SUFFIX}")
        if doc is not None:
            traces[rank] = doc
    return traces


def _torch_analysis(traces: dict[int, JsonObject], work_dir: Path, timeout_s: float) -> str:
    """``torchfrtrace`` (``torch.distributed.flight_recorder.fr_trace``) over the checked
    ``traces``: its last lines, or why it failed. torch's analyser unpickles what it
    reads, so it gets pickles of the traces rankguard has read as data, written in a new
    private folder under ``work_dir`` (``mkdtemp``: mode 0700, a name nobody can plant),
    removed afterwards. Traces it cannot match (:func:`undescribed_group`) are not given
    to it: the reason is its output."""
    missing = undescribed_group(traces)
    if missing is not None:
        rank, group = missing
        return (
            f"torchfrtrace not run: rank {rank}'s trace names process group {group!r}, "
            "which its pg_config does not describe (gloo records none); torch's analyser "
            "stops there with a KeyError"
        )
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".torchfrtrace-", dir=work_dir))
    except OSError as exc:
        return f"torchfrtrace did not run: {type(exc).__name__}: {exc}"
    try:
        for rank, doc in traces.items():
            fd = create_exclusive(tmp / f"{PREFIX}{rank}", 0o600)
            try:
                write_all(fd, pickle.dumps(doc))
            finally:
                os.close(fd)
        return _run_torchfrtrace(tmp, timeout_s)
    except OSError as exc:
        return f"torchfrtrace did not run: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def undescribed_group(traces: dict[int, JsonObject]) -> tuple[int, str] | None:
    """The first (rank, process group) that an entry of the rank's trace names and its
    ``pg_config`` does not describe; None when every group is described. torchfrtrace
    looks each entry's group up in its rank's ``pg_config`` and stops with a KeyError on
    one it lacks (every gloo trace of torch 2.13: gloo records no group): started for
    such traces it only spent a core's second or more of a hang's restart."""
    for rank, doc in sorted(traces.items()):
        config = doc.get("pg_config")
        described = config if isinstance(config, dict) else {}
        entries = doc.get("entries")
        for entry in entries if isinstance(entries, list) else []:
            name = entry.get("process_group") if isinstance(entry, dict) else None
            if isinstance(name, (list, tuple)) and name and str(name[0]) not in described:
                return rank, str(name[0])
    return None


def _run_torchfrtrace(dump_dir: Path, timeout_s: float) -> str:
    cmd = [sys.executable, "-c", _RUNNER, str(dump_dir), "--prefix", PREFIX]
    # not a worker of the job (no RANKGUARD_* variables), and it dies with the launcher
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKGUARD_")}
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # an autogroup of its own (see _RUNNER_PRELUDE)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"torchfrtrace did not run: {type(exc).__name__}: {exc}"
    text = "\n".join((res.stdout + res.stderr).strip().splitlines()[-20:])
    if res.returncode != 0:
        last = text.splitlines()[-1] if text else f"exit {res.returncode}"
        return f"torchfrtrace failed (exit {res.returncode}): {last}"
    return text or "torchfrtrace: no mismatch reported"


def analyse(
    dump_dir: Path, ranks: list[int], *, run_torch: bool = True, timeout_s: float = 60.0
) -> FrVerdict | None:
    """The verdict from the traces of ``ranks`` in ``dump_dir`` (:func:`read_traces`:
    no other file is read); None when they show no group where some ranks are ahead of
    others (or no trace could be read)."""
    traces = read_traces(Path(dump_dir), ranks)
    if not traces:
        return None
    verdict = compare(traces)
    if verdict is None:
        return None
    if run_torch:
        analysis = _torch_analysis(traces, Path(dump_dir), timeout_s)
        return replace(verdict, torch_analysis=analysis)
    return verdict


TORCH_ANALYSIS_FILE = "torchfrtrace.txt"
EXIT_WAIT_S = 20.0  # how long a launcher's exit waits for a torchfrtrace under way
_analysers: list[tuple[threading.Thread, Path, threading.Lock]] = []
_analysers_lock = threading.Lock()


def collect_verdict(
    run_dir: Path,
    ranks: list[int],
    *,
    timeout_s: float = 3.0,
    remote: Callable[[], dict[int, JsonObject]] | None = None,
    world: int | None = None,
    waiting: Collection[int] = (),
) -> FrVerdict | None:
    """Before a kill: the traces of ``ranks`` (those that answer within ``timeout_s``)
    and, with ``remote`` (other nodes' ranks, already asked: it waits for their
    answers), theirs, compared together (``world``: the job's ranks, see
    :func:`~rankguard.ft.frverdict.compare`; ``waiting``: ranks waiting in a
    point-to-point operation by their heartbeats); torchfrtrace then runs in the background over
    the same traces and writes ``flightrec/torchfrtrace.txt`` (its output can take
    seconds: never before the kill). That file exists from the verdict on (it says the
    analyser runs, until its output replaces it); the launcher's exit waits up to
    ``EXIT_WAIT_S`` for it, then the file says it did not finish. Errors are logged,
    never raised."""
    dump_dir = Path(run_dir) / DUMP_DIR
    try:
        got = request_dumps(run_dir, ranks, timeout_s=timeout_s) if ranks else {}
        traces = read_traces(dump_dir, list(got))
        if remote is not None:  # other nodes' ranks, under the job's rank numbers
            traces.update({r: doc for r, doc in remote().items() if r not in traces})
        if not traces:
            logger.warning("rankguard: no rank answered the flight-recorder request")
            return None
        verdict = compare(traces, world=world, waiting=waiting)
    except Exception:
        logger.exception("rankguard: reading the flight recorder failed")
        return None
    if verdict is None:
        return None
    out = dump_dir / TORCH_ANALYSIS_FILE
    try:
        _write_text(
            out,
            f"torchfrtrace: running over the traces of rank(s) "
            f"{', '.join(map(str, sorted(traces)))} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; its output replaces this text\n",
        )
    except OSError as exc:
        logger.warning("rankguard: cannot write %s: %s", out, exc)
        return verdict

    written = threading.Lock()  # held by whoever writes the file's last text

    def run_torch() -> None:
        try:
            text = _torch_analysis(traces, dump_dir, 120.0)
            if written.acquire(blocking=False):  # not once the exit said it did not finish
                _write_text(out, text + "\n")
        except Exception:
            logger.exception("rankguard: torchfrtrace over %s failed", dump_dir)

    thread = threading.Thread(target=run_torch, name="rankguard-frtrace", daemon=True)
    with _analysers_lock:
        if not _analysers:
            atexit.register(wait_for_analysers)
        _analysers.append((thread, out, written))
    thread.start()
    return replace(verdict, torch_analysis=str(out))


def _write_text(path: Path, text: str) -> None:
    write_new_then_replace(path, text.encode("utf-8", "replace"))


def wait_for_analysers(timeout_s: float = EXIT_WAIT_S) -> None:
    """At the launcher's exit: wait up to ``timeout_s`` for the torchfrtrace runs under
    way (their child dies with the launcher); a run that did not finish leaves its file
    saying so."""
    deadline = time.monotonic() + timeout_s
    with _analysers_lock:
        pending = list(_analysers)
        _analysers.clear()
    for thread, out, written in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() and written.acquire(blocking=False):
            with contextlib.suppress(OSError):
                _write_text(
                    out,
                    f"torchfrtrace did not finish within {timeout_s:g}s of the launcher's "
                    "exit (docs/flight_recorder.md says how to run it over the traces)\n",
                )
