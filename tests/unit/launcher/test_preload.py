"""``--preload``'s fork server: what it imports before it forks the ranks."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

import pytest

from rankguard.launcher import run


def _preloaded(monkeypatch: pytest.MonkeyPatch, modules: tuple[str, ...]) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", seen.extend)
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: None)
    run.start_fork_server(modules)
    return seen


def test_preloading_torch_imports_what_every_optimizer_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.optim's Optimizer imports torch._dynamo at its construction: a rank forked
    # with torch alone paid that import (as long as torch's own) at every restart
    seen = _preloaded(monkeypatch, ("torch",))
    assert seen[-2:] == ["torch", "torch._dynamo"]


def test_other_modules_are_preloaded_as_given_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _preloaded(monkeypatch, ("json", "torch", "json", "torch._dynamo"))
    assert seen[3:] == ["json", "torch", "torch._dynamo"]
    assert seen[:3] == [
        "__main__",
        "rankguard.launcher.forkserver_guard",
        "rankguard.launcher.worker",
    ]
