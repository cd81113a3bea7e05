"""A script's uncaught error, printed and written to torch elastic's error file, shows
the script's frames as ``python script.py`` would, not the bootstrap's (``runpy`` and
``rankguard/launcher/worker.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    def step():
        raise ValueError("bad batch")

    @record
    def main():
        step()

    main()
    """
)

_BOOTSTRAP = ("worker.py", "<frozen runpy>", "runpy.py")


@pytest.mark.parametrize("as_module", [False, True])
def test_tracebacks_start_at_the_script(tmp_path: Path, as_module: bool) -> None:
    script = tmp_path / "train_fail.py"
    script.write_text(_SCRIPT)
    error_file = tmp_path / "error.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANKGUARD_", "TORCHELASTIC_", "PYTHONPATH"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    target = ["-m", "train_fail"] if as_module else [str(script)]
    res = subprocess.run(
        [sys.executable, "-m", "rankguard.launcher.worker", *target],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 1, res.stderr
    printed = res.stderr[res.stderr.index("Traceback (most recent call last):") :]
    py_callstack = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    for text in (printed, py_callstack):
        frames = [line for line in text.splitlines() if line.lstrip().startswith("File ")]
        assert "train_fail.py" in frames[0] and "<module>" in frames[0], text
        assert not any(name in line for line in frames for name in _BOOTSTRAP), text
        assert text.rstrip().endswith("ValueError: bad batch"), text
