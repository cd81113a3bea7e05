"""NVRx 0.7.0's own Python code for the tests, on this interpreter (tests only).

nvidia-resiliency-ext 0.7.0 publishes wheels for CPython 3.12 and 3.14 only; the
installed extra on Python 3.11 resolves to 0.4.1. The parts rankguard meets (the
``RankMonitorClient``, its message classes and IPC framing, ``FaultToleranceConfig`` and
``ft_launcher``'s argument parser) are pure Python and import on 3.11 unchanged (no
shim): the 3.12 wheel is downloaded from PyPI by name (``pip download --no-deps``) and
unpacked, dist-info included, into a cache folder. A process that puts that folder first
on ``sys.path`` (``PYTHONPATH``) imports NVRx 0.7.0 and ``importlib.metadata`` reports
0.7.0 there; the installed 0.4.1 stays for every other test.

``python -m tests.nvrx_release`` fetches it once (CI does, before the tests); a test
calls :func:`release_path`, which skips with the reason when the download fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["VERSION", "cache_dir", "fetch", "release_env", "release_path"]

VERSION = "0.7.0"
_WHEEL_TAGS = ("--python-version", "3.12", "--platform", "manylinux_2_39_x86_64")


def cache_dir(version: str = VERSION) -> Path:
    base = os.environ.get("RANKGUARD_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rankguard-tests"
    )
    return Path(base) / f"nvidia-resiliency-ext-{version}"


def fetch(version: str = VERSION, timeout_s: float = 120.0) -> tuple[Path | None, str]:
    """The unpacked release (downloaded on first use), or None and why not."""
    target = cache_dir(version)
    if (target / "nvidia_resiliency_ext" / "fault_tolerance").is_dir():
        return target, "cached"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"nvidia-resiliency-ext=={version}",
            "--no-deps",
            "--only-binary",
            ":all:",
            *_WHEEL_TAGS,
            "--quiet",
            "--disable-pip-version-check",
            "-d",
            tmp,
        ]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"pip download did not finish in {timeout_s:.0f} s"
        wheels = sorted(Path(tmp).glob("nvidia_resiliency_ext-*.whl"))
        if res.returncode != 0 or not wheels:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no wheel"]
            return None, f"pip download failed: {tail[0]}"
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(unpacked)
        try:
            os.rename(unpacked, target)  # atomic: a concurrent fetch finds all or nothing
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(unpacked, ignore_errors=True)  # another process got there first
    return target, "downloaded"


def release_path(version: str = VERSION) -> Path:
    """The unpacked release for a test; skips the test, saying why, when it is missing."""
    import pytest

    path, why = fetch(version)
    if path is None:
        pytest.skip(f"NVRx {version}'s wheel could not be downloaded from PyPI ({why})")
    return path


def release_env(path: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the release first on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), out.get("PYTHONPATH", "")]))
    return out


if __name__ == "__main__":
    found, how = fetch()
    print(f"nvidia-resiliency-ext {VERSION}: {found or 'unavailable'} ({how})")
