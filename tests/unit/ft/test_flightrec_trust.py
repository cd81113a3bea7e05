"""The flight recorder's files are data from this user only: a trace another user planted
in ``flightrec/`` never runs code in the launcher (nothing is unpickled), only the ranks
asked are read, only regular files this user owns; the folders are made with the run
directory's mode; the dumper writes through no planted name; the file a finding names
(``torchfrtrace.txt``) exists."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.ft import flightrec
from rankguard.ft.actions import HangTraces
from rankguard.ft.flightrec import (
    TraceDumper,
    analyse,
    collect_verdict,
    read_trace,
    restricted_loads,
    trace_file,
    wait_for_analysers,
)
from rankguard.ft.stacks import install_dump_handler
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.util.fs import ForeignPathError, owned_subdir

OTHER_UID = 65534  # nobody: "another user of the same group"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file as another uid")


class _Evil:
    """Unpickling this creates ``marker``: the proof that a planted trace ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _evil(marker: Path) -> bytes:
    return pickle.dumps({"pg_status": {}, "entries": [], "x": _Evil(marker)})


def _doc(enqueued: int, completed: int) -> dict[str, Any]:
    return {
        "version": "2.10",
        # the group described, as NCCL's traces do (gloo's describe none: no torchfrtrace)
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": str(enqueued),
                "last_completed_collective": str(completed),
            }
        },
        "entries": [
            {
                "process_group": ["0", "default_pg"],
                "collective_seq_id": s,
                "is_p2p": False,
                "profiling_name": "gloo:all_reduce",
            }
            for s in range(1, enqueued + 1)
        ],
    }


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o750)
    return run_dir


def _genuine(run_dir: Path, rank: int, doc: dict[str, Any]) -> Path:
    """A rank's own answer, fresh, where the launcher looks for it."""
    owned_subdir(run_dir, "flightrec")
    path = trace_file(run_dir, rank)
    path.write_text(json.dumps(doc))
    return path


def _hang(run_dir: Path) -> None:
    """Rank 0 waits in all-reduce #4, rank 1 never entered it."""
    _genuine(run_dir, 0, _doc(4, 3))
    _genuine(run_dir, 1, _doc(3, 3))


@pytest.fixture(autouse=True)
def _no_torch_analyser(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchfrtrace (seconds of torch import) only where a test asks for it."""
    monkeypatch.setattr(flightrec, "_run_torchfrtrace", lambda d, t: "torchfrtrace: stub")


def test_a_planted_rank_file_the_verdict_did_not_ask_for_is_ignored(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    marker = tmp_path / "planted-ran"
    _hang(run_dir)
    d = run_dir / "flightrec"
    for name in ("rank_99", "rank_99.json", "rank_7.json"):
        (d / name).write_bytes(_evil(marker))
    verdict = collect_verdict(run_dir, [0, 1], timeout_s=2)
    wait_for_analysers(10)
    assert not marker.exists(), "a planted trace was unpickled"
    assert verdict is not None
    assert verdict.ranks_read == [0, 1]
    assert verdict.missing_ranks == [1] and verdict.waiting_ranks == [0]


@as_root
def test_a_trace_planted_by_another_user_never_runs_and_is_refused(tmp_path: Path) -> None:
    """The two-user reproduction: a group member plants rank 1's trace (a pickle whose
    ``__reduce__`` runs code) before the hang; the job owner's launcher asks rank 1."""
    run_dir = _run_dir(tmp_path)
    marker = tmp_path / "planted-ran"
    _genuine(run_dir, 0, _doc(4, 3))
    d = run_dir / "flightrec"
    for name in ("rank_1", "rank_1.json"):
        (d / name).write_bytes(_evil(marker))
        os.chown(d / name, OTHER_UID, OTHER_UID)
    verdict = collect_verdict(run_dir, [0, 1], timeout_s=1)
    wait_for_analysers(10)
    assert not marker.exists(), "another user's planted trace ran in the launcher"
    # rank 1's file is not read: rank 0's trace alone shows no disagreement
    assert verdict is None


@as_root
def test_another_users_trace_in_json_is_not_believed(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _hang(run_dir)
    os.chown(trace_file(run_dir, 1), OTHER_UID, OTHER_UID)
    assert read_trace(trace_file(run_dir, 1)) is None
    assert analyse(run_dir / "flightrec", [0, 1], run_torch=False) is None
    os.chown(trace_file(run_dir, 1), os.getuid(), os.getgid())
    v = analyse(run_dir / "flightrec", [0, 1], run_torch=False)
    assert v is not None and v.missing_ranks == [1]


def test_a_trace_is_read_only_as_a_regular_file_not_through_a_link(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _hang(run_dir)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(_doc(3, 3)))
    path = trace_file(run_dir, 1)
    path.unlink()
    path.symlink_to(elsewhere)
    assert read_trace(path) is None
    path.unlink()
    os.mkfifo(path)  # would block a plain open
    assert read_trace(path) is None
    path.unlink()
    path.write_bytes(b"\x80\x04not json")
    assert read_trace(path) is None


def test_the_restricted_unpickler_allows_plain_data_and_no_global(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plain = {"a": [1, 2.5, ("x", None)], "b": True}
    assert restricted_loads(pickle.dumps(plain)) == plain
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        restricted_loads(_evil(marker))
    assert not marker.exists()


def test_the_folders_get_the_run_directorys_mode_whatever_the_umask(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    old = os.umask(0o002)
    try:
        fh = install_dump_handler(run_dir, 0)
        assert fh is not None
        fh.close()
        got = flightrec.request_dumps(run_dir, [0], timeout_s=0.1, poll_s=0.05)
    finally:
        os.umask(old)
    assert got == {}
    for name in ("flightrec", "stacks"):
        st = os.lstat(run_dir / name)
        assert st.st_mode & 0o777 == 0o750, (name, oct(st.st_mode))
    # one made wider before (an older version, the umask) is narrowed to the run's mode
    os.chmod(run_dir / "flightrec", 0o777)
    owned_subdir(run_dir, "flightrec")
    assert os.stat(run_dir / "flightrec").st_mode & 0o777 == 0o750


def test_a_linked_folder_is_refused(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    target = tmp_path / "other"
    target.mkdir()
    (run_dir / "flightrec").symlink_to(target, target_is_directory=True)
    (run_dir / "stacks").symlink_to(target, target_is_directory=True)
    with pytest.raises(ForeignPathError):
        flightrec.request_dumps(run_dir, [0], timeout_s=0.1)
    assert install_dump_handler(run_dir, 0) is None
    assert list(target.iterdir()) == []


@as_root
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    for name in ("flightrec", "stacks"):
        (run_dir / name).mkdir(mode=0o777)
        os.chown(run_dir / name, OTHER_UID, OTHER_UID)
    assert collect_verdict(run_dir, [0, 1], timeout_s=0.2) is None
    assert install_dump_handler(run_dir, 0) is None
    assert list((run_dir / "stacks").iterdir()) == []
    assert list((run_dir / "flightrec").iterdir()) == []


@pytest.mark.skipif(not flightrec.available(), reason="this torch has no flight recorder")
def test_the_dumper_writes_through_no_planted_name(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    d = owned_subdir(run_dir, "flightrec")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = trace_file(run_dir, 0)
    # the temporary names an earlier dumper used (pids are in the heartbeat file names)
    for name in (f".{out.name}.{os.getpid()}.tmp", f".rank_0.{os.getpid()}.tmp"):
        (d / name).symlink_to(victim)
    out.symlink_to(victim)
    TraceDumper(run_dir, 0).dump()
    assert victim.read_text() == "precious"
    st = os.lstat(out)
    assert not os.path.islink(out) and st.st_mode & 0o777 == 0o640
    assert isinstance(json.loads(out.read_bytes()), dict)
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_the_file_the_finding_names_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchfrtrace runs after the kill: its file exists from the verdict on, says it
    runs, and the launcher's exit leaves its output or that it did not finish."""
    run_dir = _run_dir(tmp_path)
    _hang(run_dir)
    release = [False]

    def slow(d: Path, timeout_s: float) -> str:
        assert sorted(p.name for p in d.iterdir()) == ["rank_0", "rank_1"]
        assert os.stat(d).st_mode & 0o777 == 0o700
        while not release[0]:
            time.sleep(0.01)
        return "torchfrtrace: the output"

    monkeypatch.setattr(flightrec, "_run_torchfrtrace", slow)
    v = collect_verdict(run_dir, [0, 1], timeout_s=2)
    assert v is not None and v.torch_analysis is not None
    named = Path(v.torch_analysis)
    assert named.read_text().startswith("torchfrtrace: running over the traces of rank(s) 0, 1")
    wait_for_analysers(0.2)  # the exit does not wait for ever
    assert "did not finish" in named.read_text()
    release[0] = True
    time.sleep(0.3)
    assert "did not finish" in named.read_text()  # the exit's word is the last
    # a run that finishes in time leaves its output
    release[0] = True
    v = collect_verdict(run_dir, [0, 1], timeout_s=2)
    wait_for_analysers(10)
    assert v is not None and Path(str(v.torch_analysis)).read_text() == "torchfrtrace: the output\n"
    assert not [p for p in (run_dir / "flightrec").iterdir() if p.name.startswith(".")]


# ---- the verdict without fault tolerance --------------------------------------------


def test_a_hang_gets_the_verdict_with_no_action(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _hang(run_dir)
    host = "this-host"
    recs = {
        r: SimpleNamespace(
            record=SimpleNamespace(
                pid=os.getpid(), ended=False, hostname=host, main_frame=None, extra={}
            ),
            collectives=None,
            inside_of=None,
        )
        for r in (0, 1)
    }
    monitor = SimpleNamespace(rules=SimpleNamespace(ranks=recs))
    sink = HangTraces(run_dir, monitor, here=lambda rec: rec.hostname == host)  # type: ignore[arg-type]
    finding = Finding(
        finding_type=FindingType.PROGRESS_TIMEOUT,
        run_id="r",
        rank=1,
        reason=Reason.NOT_ADVANCING,
        message="rank 1: alive but no step completed",
    )
    sink.before_write(finding)
    fr = finding.detail["flight_recorder"]
    assert fr["missing_ranks"] == [1] and fr["collective"] == "all_reduce" and fr["seq"] == 4
    assert "flight recorder: rank(s) 1 did not join all_reduce #4" in finding.message
    # another rank's finding of the same hang: the same verdict, no second request
    (run_dir / "flightrec" / "request.json").unlink()
    other = Finding(
        finding_type=FindingType.PROGRESS_TIMEOUT,
        run_id="r",
        rank=0,
        reason=Reason.NOT_ADVANCING,
        message="rank 0: alive but no step completed",
    )
    sink.before_write(other)
    assert other.detail["flight_recorder"] == fr
    assert not (run_dir / "flightrec" / "request.json").exists()
    wait_for_analysers(10)


def test_a_torch_without_the_json_dump_is_converted_without_globals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._C._distributed_c10d as c10d

    marker = tmp_path / "ran"
    monkeypatch.delattr(c10d, "_dump_fr_trace_json", raising=False)
    plain = {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": 3}}}
    monkeypatch.setattr(c10d, "_dump_fr_trace", lambda **kw: pickle.dumps(plain), raising=False)
    assert json.loads(flightrec._trace_json()) == plain
    monkeypatch.setattr(c10d, "_dump_fr_trace", lambda **kw: _evil(marker), raising=False)
    with pytest.raises(pickle.UnpicklingError):
        flightrec._trace_json()
    assert not marker.exists()
