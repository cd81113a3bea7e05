"""``python bench/<name>.py ARGS`` as a process of its own, forked from the rank tests'
forkserver (``tests.factories.rank_context()``: a fresh interpreter that imported torch
once, no threads) rather than a fresh interpreter: the script runs as ``__main__`` with
its command line, environment, working directory and ``sys.path[0]`` as ``python`` gives
them, its standard input empty, its output unbuffered to files; the process exits with
the script's code. What a smoke run proves is the same; it no longer pays an interpreter's
start and torch's import (about 2.5 s of CPU) before its first line.

Stdlib only: the forkserver imports this module in each child to find :func:`_main`."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _main(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The child: ``argv[0]`` run as ``__main__`` (``SystemExit`` gives the exit code
    through multiprocessing, an exception's traceback goes to ``err`` and exit 1)."""
    import io
    import runpy
    import sys
    import tempfile

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    # unbuffered, as PYTHONUNBUFFERED gives a fresh interpreter: the script's lines and
    # those of the processes it starts (the same files) in the order they were written
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    tempfile.tempdir = None  # TMPDIR read again
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script`
    runpy.run_path(argv[0], run_name="__main__")


def run(name: str, *args: str, timeout: float, env: dict[str, str]) -> Result:
    """``bench/<name> ARGS`` in a forked process, from the repository's root, with
    ``env`` (the whole environment); a run past ``timeout`` is killed and raises
    :class:`subprocess.TimeoutExpired`, as :func:`subprocess.run` does."""
    import tempfile

    from tests.factories import rank_context

    # in this worker's temp directory, not the bench's (a test checks it is left empty)
    fd, out_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".stdout")
    os.close(fd)
    out, err = Path(out_name), Path(out_name[: -len(".stdout")] + ".stderr")
    argv = [str(BENCH / name), *args]
    proc = rank_context().Process(target=_main, args=(argv, env, str(ROOT), str(out), str(err)))
    proc.start()
    proc.join(timeout)
    try:
        if proc.exitcode is None:
            raise subprocess.TimeoutExpired(argv, timeout)
    finally:
        if proc.exitcode is None:
            proc.kill()
            proc.join(10)
        said = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
        for p in (out, err):
            p.unlink(missing_ok=True)
    return Result(int(proc.exitcode), said[0], said[1])  # type: ignore[arg-type]
