"""The integrations are optional: the core never imports a framework, and a missing one
gives an error naming the extra to install."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("rankguard.integrations.hf", ("transformers",), "rankguard[hf]"),
        (
            "rankguard.integrations.lightning",
            ("lightning", "lightning.pytorch"),
            "rankguard[lightning]",
        ),
    ],
)
def test_a_missing_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, blocked: tuple[str, ...], extra: str
) -> None:
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=re.escape(f"pip install '{extra}'")):
        importlib.import_module(module)


def test_the_core_imports_no_framework() -> None:
    code = (
        "import sys, rankguard, rankguard.integrations, rankguard.session; "
        "print([m for m in ('transformers', 'lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
