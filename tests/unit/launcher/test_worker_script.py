"""The bootstrap runs the user's script as the interpreter does (``python SCRIPT``,
``python -m NAME``): the same ``__main__`` module, and the same exit, so that what the
script left in an open file's buffer is written, as it is without rankguard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    import atexit, gc, json, sys
    spec = globals().get("__spec__")
    print(json.dumps({
        "name": __name__,
        "file": __file__,
        "package": __package__,
        "spec": None if spec is None else spec.name,
        "loader": type(__loader__).__name__,
        "argv0": sys.argv[0],
        "argv": sys.argv[1:],
        "main_is_me": sys.modules["__main__"].__dict__ is globals(),
        "gc_enabled": gc.isenabled(),  # the bootstrap's start-up pause is over
    }))
    log = open(sys.argv[-1], "w")
    log.write("written, never flushed nor closed\\n")

    def bye():  # holds the script's globals (and the file) until the atexit handlers ran
        print("atexit ran", flush=True)

    atexit.register(bye)
    """
)


@pytest.mark.parametrize(
    "target",
    [["train.py"], ["-m", "pkg.train"], ["-m", "pkg"]],
    ids=["script", "module", "package"],
)
def test_the_script_runs_as_python_runs_it(tmp_path: Path, target: list[str]) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for where in ("train.py", "pkg/train.py", "pkg/__main__.py"):
        (tmp_path / where).write_text(_SCRIPT)
    seen = {}
    for how, prefix in (("python", []), ("rankguard", ["-m", "rankguard.launcher.worker"])):
        log = tmp_path / f"{how}.log"
        done = subprocess.run(
            [sys.executable, *prefix, *target, "--lr", "3", str(log)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 0, (how, done.stderr)
        lines = done.stdout.splitlines()
        assert lines[-1] == "atexit ran", (how, done.stdout)
        assert log.read_text() == "written, never flushed nor closed\n", how
        seen[how] = json.loads(lines[-2])
        seen[how]["argv"][-1] = "LOG"
    assert seen["rankguard"] == seen["python"]
    assert seen["rankguard"]["main_is_me"] and seen["rankguard"]["name"] == "__main__"
    assert seen["rankguard"]["gc_enabled"]
    assert seen["rankguard"]["argv"] == ["--lr", "3", "LOG"]
