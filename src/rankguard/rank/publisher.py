"""Per-rank heartbeat publisher: a daemon thread inside the training process.

It writes ``process_start`` at once, a ``heartbeat`` record every
``publish_interval_s`` (or right away when the phase or checkpoint state changes), and
``process_end`` on close. Each record is one complete JSON line appended to
``rank_<rank>_pid_<pid>.heartbeat.jsonl`` with ``O_APPEND`` and fsync'd, so a kill -9
never leaves a torn line that matters (the monitor's tailer skips a partial last line).
A file about to grow past ``heartbeat.max_file_mb`` is rotated: it becomes
``<name>.1`` and a new file starts with a copy of the ``process_start`` record.

With a :class:`~rankguard.rank.lifeline.Lifeline` (the rank bootstrap's), the
thread also checks at every beat that the launcher is still there; if it is gone, the
rank writes ``process_end`` (not clean, exit code -9, the reason) and stops itself with
SIGKILL.

Components add their heartbeat blocks (:mod:`rankguard.schema.blocks`) through
:meth:`HeartbeatPublisher.add_block`. The thread only reads the
:class:`~rankguard.rank.timeline.ProgressTracker`; the
training loop never waits for it. A write error is counted and logged once, never
raised into training.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from rankguard.rank.identity import RankIdentity
from rankguard.rank.lifeline import Lifeline, end_orphan
from rankguard.rank.phases import PhaseWatcher, thread_frame
from rankguard.rank.timeline import ProgressTracker
from rankguard.rank.waitcall import native_call
from rankguard.schema.blocks import BlockSource, ExitBlock
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import Event
from rankguard.util.fs import dumps_line, open_append, rotate_jsonl, write_all

__all__ = ["HeartbeatPublisher"]

logger = logging.getLogger(__name__)


def _describe(frame: FrameType | None) -> str | None:
    """Where the training thread is right now, ``file:line in function``:
    evidence in findings (a stalled rank in ``time.sleep`` vs one in a collective)."""
    if frame is None:
        return None
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


class HeartbeatPublisher:
    def __init__(
        self,
        identity: RankIdentity,
        run_dir: Path,
        tracker: ProgressTracker,
        interval_s: float,
        *,
        blocks: Sequence[BlockSource] = (),
        ticks: Sequence[Callable[[], None]] = (),
        max_file_bytes: int = 0,
        phases: PhaseWatcher | None = None,
        lifeline: Lifeline | None = None,
        on_orphan: Callable[[str], None] = end_orphan,
        training_thread: threading.Thread | None = None,
    ) -> None:
        """``blocks``: the sources of the record's heartbeat blocks
        (:mod:`rankguard.schema.blocks`), called at each record; more with
        :meth:`add_block`. ``ticks``: run by the thread before each record (the stop
        step's control file). ``max_file_bytes``: rotate the file before it would grow
        past this (0: never); see ``rankguard.util.fs.rotate_jsonl``. ``phases``: names
        evaluation and saving from the main thread's stack at each record (None: the
        tracker's phase as it is). ``lifeline``: checked at every beat (see
        :meth:`_check_lifeline`); ``on_orphan``: what ends the rank then (tests: anything
        but a kill). ``training_thread``: the thread whose stack gives ``main_frame`` and
        the phase (None: the main thread)."""
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s}")
        self.identity = identity
        self.path = Path(run_dir) / heartbeat_file_name(identity.rank, identity.pid)
        self.tracker = tracker
        self.interval_s = interval_s
        self.write_errors = 0
        self.block_errors = 0  # a block source that raised (its block left out)
        self._seq = 0
        self._fd: int | None = None
        self.max_file_bytes = max_file_bytes
        self.rotations = 0
        self._size = 0
        self._start_line = b""  # the process_start record: first line of every file
        self._lock = threading.Lock()  # serialises writes of the thread and close()
        self._wake = threading.Event()
        self._asked: deque[threading.Event] = deque()  # publish() calls waiting for a record
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._blocks: list[BlockSource] = []
        for source in blocks:
            self.add_block(source)
        self._phases = phases
        self._ticks = tuple(ticks)
        self._lifeline = lifeline
        self._on_orphan = on_orphan
        self.training_thread = training_thread
        self._base = identity.base_record()
        self._gpu_refined = identity.gpu is None
        tracker.on_change = self._wake.set

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = open_append(self.path)
        self._size = os.fstat(self._fd).st_size
        self._write(Event.PROCESS_START)
        self._thread = threading.Thread(target=self._run, name="rankguard-heartbeat", daemon=True)
        self._thread.start()

    def add_block(self, source: BlockSource) -> None:
        """One more heartbeat block from now on: ``source()`` runs on this thread before
        each record and returns the block (None: not in this record). A block name
        appears once in a record: a second source of the same name is refused when its
        first block comes (ValueError logged, that block left out)."""
        self._blocks.append(source)

    @property
    def ticks(self) -> tuple[Callable[[], None], ...]:
        """What runs on this thread before each record."""
        return self._ticks

    @property
    def lifeline(self) -> Lifeline | None:
        return self._lifeline

    def wake(self) -> None:
        """Publish now instead of at the next interval (phase/checkpoint changes)."""
        self._wake.set()

    def publish(self, timeout_s: float = 5.0) -> bool:
        """Have the thread write a record now and wait until it is on disk: for what must
        be there before this process can be killed (a verdict its peers are about to exit
        on). The record is built after this call, so it holds the blocks as they are now;
        the sources still run on the thread only. False when no record came within
        ``timeout_s`` (the thread is stuck or gone) or after :meth:`close`."""
        thread = self._thread
        if self._closed or thread is None or not thread.is_alive():
            return False
        done = threading.Event()
        self._asked.append(done)
        self._wake.set()
        return done.wait(timeout_s)

    def close(
        self, *, clean: bool = True, exit_code: int | None = None, error: str | None = None
    ) -> None:
        """Stop the thread and write ``process_end``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, 2 * self.interval_s))
        self.tracker.poll()
        asked = self._take_asked()
        end = ExitBlock(
            clean=clean, exit_code=exit_code, error=error, stopped_at=self.tracker.stopped_at
        )
        self._write(Event.PROCESS_END, {end.name: end.to_dict()})
        for done in asked:  # the end record has every block as it is now
            done.set()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def records_written(self) -> int:
        return self._seq

    def _rotate(self) -> None:
        """Under the lock: the full file becomes ``<name>.1``, a new one starts with the
        process_start record (the monitor's rules skip it again: its seq is old)."""
        assert self._fd is not None
        try:
            rotate_jsonl(self.path, self._start_line)
        except OSError as exc:  # keep appending to the full file: never lose a heartbeat
            self.max_file_bytes = 0
            logger.error("rankguard: cannot rotate %s (rotation off): %s", self.path, exc)
            return
        fd = open_append(self.path)
        os.close(self._fd)  # only once the new one is open: _fd is always a valid file
        self._fd = fd
        self._size = len(self._start_line)
        self.rotations += 1

    # ---- thread ---------------------------------------------------------------------

    def _refine_gpu(self) -> None:
        """Once the script has initialised CUDA, add the GPU's UUID to the records, so
        the monitor maps the rank to NVML's entry exactly (an index token is only exact
        when CUDA and NVML number GPUs alike)."""
        gpu = self._base.get("gpu")
        if not gpu or gpu.get("uuid"):
            self._gpu_refined = True
            return
        try:
            import torch  # here, not at the top: `import rankguard` stays torch-free

            if not torch.cuda.is_initialized():
                return
            uuid = str(torch.cuda.get_device_properties(gpu["ordinal"]).uuid)
        except Exception:
            self._gpu_refined = True
            return
        self._base["gpu"] = {**gpu, "uuid": uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"}
        self._gpu_refined = True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._check_lifeline()
            if self._stop.is_set():  # closed: the launcher is gone
                break
            for tick in self._ticks:
                try:
                    tick()
                except Exception:
                    logger.exception("rankguard: heartbeat tick failed")
            try:
                self.tracker.poll()
                if not self._gpu_refined:
                    self._refine_gpu()
            except Exception:  # a broken CUDA context must not kill the heartbeat
                logger.exception("rankguard: polling the progress event failed")
            asked = self._take_asked()  # before the record: it is built after their call
            self._write(Event.HEARTBEAT)
            for done in asked:
                done.set()

    def _take_asked(self) -> list[threading.Event]:
        return [self._asked.popleft() for _ in range(len(self._asked))]

    def _check_lifeline(self) -> None:
        """The launcher is gone: the last record says so, then the rank stops itself."""
        lifeline = self._lifeline
        if lifeline is None:
            return
        try:
            reason = lifeline.lost()
        except Exception:  # never kill a rank on a broken check
            logger.exception("rankguard: checking the launcher failed")
            return
        if reason is None:
            return
        self.close(clean=False, exit_code=-signal.SIGKILL, error=f"orphaned: {reason}")
        self._on_orphan(reason)

    def _add_blocks(self, record: dict[str, Any]) -> None:
        """Each source's block into the record: a nested one under its name, a flat
        one's fields at the top. A source that raises is counted and logged once; its
        block is left out of this record, never the record itself."""
        names: set[str] = set()
        for source in list(self._blocks):
            try:
                block = source()
                if block is None:
                    continue
                if block.name in names:
                    raise ValueError(f"heartbeat block {block.name!r}: two sources add it")
                names.add(block.name)
                if block.flat:
                    record.update(block.to_dict())
                else:
                    record[block.name] = block.to_dict()
            except Exception:
                self.block_errors += 1
                if self.block_errors == 1:
                    logger.exception("rankguard: a heartbeat block source failed")

    def _write(self, event: Event, extra: dict[str, Any] | None = None) -> None:
        record = dict(self._base)
        record["event"] = event.value
        record["wall_time_ns"] = time.time_ns()
        record.update(self.tracker.snapshot())
        frame = thread_frame(self.training_thread)
        if self._phases is not None and event is Event.HEARTBEAT:
            try:
                record.update(self._phases.fields(frame))
            except Exception:  # never lose a heartbeat over a phase
                logger.exception("rankguard: recognising the phase failed")
        record["main_frame"] = _describe(frame)
        call = native_call(frame)
        if call is not None:  # e.g. "wait": a p2p request's Work.wait under its caller
            record["main_call"] = call
        del frame  # no reference to another thread's frame outlives the record
        if self._blocks:
            self._add_blocks(record)
        if extra:
            record.update(extra)
        with self._lock:
            if self._fd is None:
                return
            record["seq"] = self._seq
            self._seq += 1
            line = dumps_line(record).encode("utf-8")
            try:
                if event is Event.PROCESS_START:
                    self._start_line = line
                elif 0 < self.max_file_bytes < self._size + len(line):
                    self._rotate()
                write_all(self._fd, line)
                os.fsync(self._fd)
                self._size += len(line)
            except OSError as exc:
                with contextlib.suppress(OSError):  # no torn line for the next one to join
                    os.ftruncate(self._fd, self._size)
                self.write_errors += 1
                if self.write_errors == 1:
                    logger.error("rankguard: cannot write heartbeat to %s: %s", self.path, exc)
