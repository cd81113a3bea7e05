"""The README's two set-up commands: the demo's installs what the demo needs (rankguard
alone: the nvrx extra's deprecated ``pynvml`` printed a FutureWarning in every process),
the tests' installs what the tests need, and CI installs at least as much."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _extras(command: str) -> set[str]:
    found = re.findall(r"-e '\.\[([a-z,]+)\]'", command)
    return {e for group in found for e in group.split(",")}


def test_the_demo_installs_rankguard_alone_and_the_tests_install_their_extras() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme[readme.index("## Set-up") :]
    demo, tests = _bash_blocks(setup)[:2]
    assert "rankguard demo" in demo and "pip install -e . " in demo
    assert _extras(demo) == set(), demo
    assert {"dev", "hf", "lightning", "trackers", "nvrx"} <= _extras(tests)
    # .ci/run runs the README's pytest line as written and installs the extras itself
    assert re.search(r"^python -m pytest ", tests, flags=re.M), tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert _extras(tests) <= _extras(ci)
