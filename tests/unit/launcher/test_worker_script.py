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

_LEAVES_A_FILE_OPEN = textwrap.dedent(
    """
    import atexit, sys
    log = open(sys.argv[1], "w")
    log.write("written, never flushed nor closed\\n")

    def bye():  # holds the script's globals (and the file) until the atexit handlers ran
        print("atexit ran", flush=True)

    atexit.register(bye)
    """
)

_DESCRIBES_ITSELF = textwrap.dedent(
    """
    import json, sys
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
    }))
    """
)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_a_file_the_script_leaves_open_is_flushed_at_exit(tmp_path: Path, as_module: bool) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(_LEAVES_A_FILE_OPEN)
    target = ["-m", "pkg.train"] if as_module else [str(tmp_path / "pkg" / "train.py")]
    out_file = tmp_path / "out.log"
    done = _run(["-m", "rankguard.launcher.worker", *target, str(out_file)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "atexit ran" in done.stdout
    assert out_file.read_text() == "written, never flushed nor closed\n"


@pytest.mark.parametrize(
    "target",
    [["train.py"], ["-m", "pkg.train"], ["-m", "pkg"]],
    ids=["script", "module", "package"],
)
def test_the_script_sees_what_python_would_show_it(tmp_path: Path, target: list[str]) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for where in (tmp_path / "train.py", tmp_path / "pkg" / "train.py"):
        where.write_text(_DESCRIBES_ITSELF)
    (tmp_path / "pkg" / "__main__.py").write_text(_DESCRIBES_ITSELF)
    plain = _run([*target, "--lr", "3"], tmp_path)
    ours = _run(["-m", "rankguard.launcher.worker", *target, "--lr", "3"], tmp_path)
    assert plain.returncode == 0 and ours.returncode == 0, (plain.stderr, ours.stderr)
    seen = json.loads(ours.stdout.splitlines()[-1])
    assert seen == json.loads(plain.stdout.splitlines()[-1])
    assert seen["main_is_me"] and seen["name"] == "__main__" and seen["argv"] == ["--lr", "3"]
