"""Fixtures shared by the unit and end-to-end tests (builders live in tests/factories.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.factories import FAKE_BIN, Children


@pytest.fixture
def fake_smi(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Put the fake nvidia-smi (tests/fakes/bin) first on PATH and clear its knobs."""
    for name in list(os.environ):
        if name.startswith("FAKE_SMI_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return monkeypatch


@pytest.fixture
def children() -> Iterator[Children]:
    """Start child processes; every one is killed and reaped at the end."""
    kids = Children()
    try:
        yield kids
    finally:
        kids.close()
