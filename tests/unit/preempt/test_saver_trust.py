"""TorchFileSaver: a planted file runs no code; a failed write leaves no temporary."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.preempt import TorchFileSaver


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_planted_save_runs_no_code(tmp_path: Path) -> None:
    saver = TorchFileSaver(tmp_path, 0, lambda: {"w": torch.ones(2)})
    saver.save(1)
    marker = tmp_path / "ran"
    torch.save({"step": 2, "state": _Payload(marker)}, saver.directory / "step_2.pt")
    with pytest.raises(ValueError, match=r"step_2\.pt"):
        saver.load_latest()
    assert not marker.exists()
    (saver.directory / "step_2.pt").unlink()
    step, state = saver.load_latest() or (None, None)
    assert step == 1 and torch.equal(state["w"], torch.ones(2))  # type: ignore[index]


def test_a_save_of_another_shape_is_named(tmp_path: Path) -> None:
    saver = TorchFileSaver(tmp_path, 0, dict)
    saver.directory.mkdir(parents=True)
    torch.save([1, 2], saver.directory / "step_3.pt")
    with pytest.raises(ValueError, match="not a save of TorchFileSaver"):
        saver.load_latest()


def test_a_full_disk_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = TorchFileSaver(tmp_path, 0, lambda: {"w": 1})
    saver.save(1)

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        saver.save(2)
    assert sorted(p.name for p in saver.directory.iterdir()) == ["step_1.pt"]
