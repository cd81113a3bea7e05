"""A user's mistake on ``rankguard run``'s line, in-process (``run_main``): one line
naming it on stderr, exit 2, nothing started. The end-to-end test beside it measures
the CPU time of the real command for one such mistake (torch is not imported)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rankguard.cli.main import run_main

pytestmark = pytest.mark.timeout(60)

# torch's own import prints this warning in some environments (not rankguard's)
_FOREIGN = ("The pynvml package is deprecated", "import pynvml")


def _run(
    args: list[str], cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[str]]:
    """Exit code and stderr lines (torch's import warnings left out)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = run_main(args)
    out, err = capsys.readouterr()
    assert out == "", out
    return code, [ln for ln in err.splitlines() if not any(f in ln for f in _FOREIGN)]


def _nothing_started(log_dir: Path) -> None:
    assert not list(log_dir.rglob("rank_*")), sorted(log_dir.rglob("*"))


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a rank must not start')\n")
    return script


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["heartbeat.publish_intervl_s=1"], "heartbeat.publish_intervl_s"),
        (["--set", "log_dir={file}/logs"], "is not a directory"),
    ],
    ids=["unknown-key", "log-dir-under-a-file"],
)
def test_a_config_error_is_one_line_at_once(
    words: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    script = _script(tmp_path)
    words = [w.format(file=afile) for w in words]
    log = ["--set", f"log_dir={tmp_path / 'rg'}"] if "log_dir" not in " ".join(words) else []
    code, lines = _run([*log, *words, str(script)], tmp_path, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and says in lines[0], lines
    assert lines[0].startswith("rankguard run: ")
    assert "Traceback" not in lines[0]
    _nothing_started(tmp_path)


def test_a_missing_script_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, lines = _run(
        ["--nproc-per-node", "2", "--set", f"log_dir={tmp_path}", "nope.py"],
        tmp_path,
        capsys,
        monkeypatch,
    )
    assert code == 2 and lines == ["rankguard run: training script not found: nope.py"]
    _nothing_started(tmp_path)
    # the same through -m's neighbour --no-python: the program must exist
    code, lines = _run(
        ["--no-python", "--set", f"log_dir={tmp_path}", "./nope.sh"], tmp_path, capsys, monkeypatch
    )
    assert code == 2 and lines == ["rankguard run: --no-python: ./nope.sh: no such executable"]


def test_a_busy_rendezvous_port_is_one_line_before_any_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for flags in (
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"],
            ["--master-addr", "127.0.0.1", "--master-port", str(port)],  # static
        ):
            code, lines = _run(
                [*flags, "--set", f"log_dir={tmp_path}", str(script)], tmp_path, capsys, monkeypatch
            )
            said = [ln for ln in lines if not ln.startswith("[rankguard] monitoring:")]
            assert code == 2 and len(said) == 1, lines
            assert str(port) in said[0] and "Traceback" not in "".join(lines), lines
            _nothing_started(tmp_path)
            # no empty run directory left behind
            assert not (tmp_path / "heartbeat").exists(), sorted(tmp_path.rglob("*"))


def test_no_python_with_module_is_refused_as_torchrun_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, lines = _run(["--no-python", "-m", "pkg.train"], tmp_path, capsys, monkeypatch)
    assert code == 2 and lines == [
        "rankguard run: --no-python and --module cannot be used together (as in torchrun)"
    ]
