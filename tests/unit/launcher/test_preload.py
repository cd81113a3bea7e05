"""``--preload``'s fork server: what it imports before it forks the ranks."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rankguard.launcher import forkserver
from rankguard.launcher.forkserver_warm import IMPORTS_ENV

PRELOAD = [
    "__main__",
    "rankguard.launcher.forkserver_guard",
    "rankguard.launcher.worker",
    "rankguard.launcher.forkserver_warm",
]


def _preloaded(monkeypatch: pytest.MonkeyPatch, modules: tuple[str, ...]) -> list[str]:
    """The fork server's imports, as its environment names them when it starts."""
    seen: list[str] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", seen.extend)
    imports: list[str] = []
    monkeypatch.setattr(
        multiprocessing.forkserver,
        "ensure_running",
        lambda: imports.extend(os.environ[IMPORTS_ENV].split(",")),
    )
    inherited = forkserver.start_fork_server(modules)
    assert seen == PRELOAD
    # only the server's environment names them: not the launcher's, not the ranks'
    assert IMPORTS_ENV not in os.environ and IMPORTS_ENV not in inherited
    return imports


def test_preloading_torch_imports_what_every_optimizer_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.optim's Optimizer imports torch._dynamo at its construction: a rank forked
    # with torch alone paid that import (as long as torch's own) at every restart
    assert _preloaded(monkeypatch, ("torch",)) == ["torch", "torch._dynamo"]


def test_other_modules_are_preloaded_as_given_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _preloaded(monkeypatch, ("json", "torch", "json", "torch._dynamo"))
    assert seen == ["json", "torch", "torch._dynamo"]


def _package(root: Path, name: str, init: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(init)
    (root / name / "sub.py").write_text("X = 1\n")


def test_a_dotted_module_is_found_without_importing_its_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # find_spec("lightning.pytorch") imported all of Lightning in the launcher (7 s of CPU)
    _package(tmp_path, "rgheavypkg", "raise RuntimeError('the package was imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _preloaded(monkeypatch, ("rgheavypkg.sub",)) == ["rgheavypkg.sub"]
    assert "rgheavypkg" not in sys.modules
    assert forkserver.module_found("os.path")  # a submodule its package makes at import
    assert forkserver.module_found("json.decoder") and not forkserver.module_found(".json")


def test_a_missing_module_is_an_error_before_the_server_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _package(tmp_path, "rglightpkg", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    for missing in ("rglightpkg.nope", "rg_no_such_module", "rglightpkg.sub.deeper"):
        with pytest.raises(ValueError, match=f"--preload: no module named '{missing}'"):
            _preloaded(monkeypatch, (missing,))


def test_the_server_inherits_the_launchers_environment_as_it_is_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANKGUARD_TEST_MARK", "1")
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", lambda _: None)
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: None)
    inherited = forkserver.start_fork_server(("json",))
    assert inherited == dict(os.environ)


def test_a_temp_directory_too_long_for_the_socket_puts_it_under_tmp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = tmp_path / ("d" * 90)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    made_under: list[str | None] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", lambda _: None)
    monkeypatch.setattr(
        multiprocessing.forkserver, "ensure_running", lambda: made_under.append(tempfile.tempdir)
    )
    forkserver.start_fork_server(("json",))
    assert made_under == ["/tmp"]
    assert tempfile.tempdir == str(long)  # the launcher's own temp directory as it was
    said = capsys.readouterr().err
    assert "too long for the fork server's Unix socket; its socket goes under /tmp" in said


def test_the_fork_server_starts_and_forks_under_a_long_tmpdir(tmp_path: Path) -> None:
    """A real fork server in a fresh interpreter whose TMPDIR is longer than a Unix
    socket's path allows (Python's own would fail: AF_UNIX path too long). Starting it
    imports no torch in the process that starts it (the server imports what it needs)."""
    long = tmp_path / ("d" * 90)
    long.mkdir()
    code = (
        "import multiprocessing as mp, os, sys\n"
        "from rankguard.launcher import forkserver\n"
        "forkserver.start_fork_server(('json',))\n"
        "p = mp.get_context('forkserver').Process(target=os.getpid)\n"
        "p.start(); p.join(30)\n"
        "print('exit', p.exitcode, 'torch', 'torch' in sys.modules)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "exit 0 torch False" in res.stdout, res.stdout + res.stderr


def _fork_once(tmp_path: Path, modules: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """A real fork server in a fresh interpreter (as the launcher starts it), and what a
    process forked from it finds: its own modules and collector, the server's threads."""
    code = (
        "import multiprocessing as mp, os, sys\n"
        "from rankguard.launcher import forkserver\n"
        "def probe(q):\n"
        "    import gc, torch\n"
        "    q.put({\n"
        "        'dynamo': 'torch._dynamo' in sys.modules,\n"
        "        'frozen': gc.get_freeze_count(),\n"
        "        'collecting': gc.isenabled(),\n"
        "        'server_threads': len(os.listdir(f'/proc/{os.getppid()}/task')),\n"
        "        'cuda': torch.cuda.is_initialized(),\n"
        "        'env': os.environ.get('RANKGUARD_FORK_SERVER_IMPORTS'),\n"
        "        'user': 'usermod' in sys.modules,\n"
        "    })\n"
        "if __name__ == '__main__':\n"
        f"    forkserver.start_fork_server({modules!r})\n"
        "    ctx = mp.get_context('forkserver')\n"
        "    q = ctx.SimpleQueue()\n"
        "    p = ctx.Process(target=probe, args=(q,))\n"
        "    p.start(); seen = q.get(); p.join(60)\n"
        "    print('seen', seen, 'exit', p.exitcode)\n"
    )
    script = tmp_path / "launch.py"
    script.write_text(code)
    (tmp_path / "usermod.py").write_text("X = 1\n")
    (tmp_path / "badmod.py").write_text("raise RuntimeError('no GPU here')\n")
    return subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="/proc")
def test_a_forked_process_finds_torch_dynamo_imported_and_frozen_by_a_single_thread_server(
    tmp_path: Path,
) -> None:
    """The server imports torch._dynamo, stays single-threaded, initializes no CUDA,
    imports none of the user's modules, and freezes what it holds: the forked process's
    collector starts with torch's objects frozen (its start-up collection does not walk
    them) and collection on."""
    res = _fork_once(tmp_path, ("torch",))
    assert res.returncode == 0 and "exit 0" in res.stdout, res.stdout + res.stderr
    seen = eval(res.stdout.split("seen ", 1)[1].rsplit(" exit", 1)[0])
    assert seen["dynamo"] and seen["collecting"] and seen["server_threads"] == 1, seen
    assert seen["frozen"] > 100_000, seen  # torch's and torch._dynamo's objects
    assert not seen["cuda"] and not seen["user"] and seen["env"] is None, seen
    assert "--preload:" not in res.stderr  # nothing to warn of


@pytest.mark.timeout(240)
def test_a_preload_module_that_fails_is_one_warning_not_a_failed_start(tmp_path: Path) -> None:
    """Python's fork server dies on a preload module that raises anything but
    ImportError: the launch failed. Here the server says it in one line and forks."""
    res = _fork_once(tmp_path, ("badmod", "json"))
    assert res.returncode == 0 and "exit 0" in res.stdout, res.stdout + res.stderr
    said = [line for line in res.stderr.splitlines() if "--preload:" in line]
    assert said == [
        "[rankguard] --preload: the fork server could not import badmod (RuntimeError: no "
        "GPU here); each rank imports it itself"
    ], res.stderr


def test_torchs_own_thread_is_no_warning_a_thread_another_import_starts_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where OMP_NUM_THREADS is not 1 (one rank per node, or a user's setting), torch's
    import starts its intra-op pool's thread: every ``--preload torch`` launch of one
    rank said the server was unfit. Threads beyond torch's are still said."""
    from rankguard.launcher import forkserver_warm

    counts = {"n": 1}
    real_import = forkserver_warm.importlib.import_module

    def fake_import(name: str) -> object:
        counts["n"] += {"torch": 1, "threaded_mod": 1}.get(name, 0)
        return real_import("json") if name in ("torch", "threaded_mod") else real_import(name)

    monkeypatch.setattr(forkserver_warm.importlib, "import_module", fake_import)
    monkeypatch.setattr(forkserver_warm, "server_threads", lambda: counts["n"])
    monkeypatch.setattr(forkserver_warm, "freeze_startup", lambda: None)
    assert forkserver_warm.warm(["torch", "json"]) == []
    counts["n"] = 1
    said = forkserver_warm.warm(["torch", "threaded_mod"])
    assert len(said) == 1 and "runs 3 threads after its imports" in said[0], said
    counts["n"] = 1
    said = forkserver_warm.warm(["threaded_mod"])  # no torch: one thread is the bound
    assert len(said) == 1 and "runs 2 threads" in said[0], said
