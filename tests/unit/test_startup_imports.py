"""What a process imports before it works: ``import rankguard`` and a rank's config
(JSON from the launcher) load neither PyYAML nor the rank side of the package; the
rank's API still resolves on first use. The check runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

_PROBE = """
import json, sys
import rankguard
from rankguard.config import RankguardConfig, dumps_config, loads_config
cfg = loads_config(dumps_config(RankguardConfig()))
before = {m: m in sys.modules for m in ("yaml", "rankguard.bootstrap", "rankguard.session")}
api = [rankguard.init.__name__, rankguard.Session.__name__, rankguard.current.__name__]
from rankguard import NullSession, RankSession
api += [NullSession.__name__, RankSession.__name__]
try:
    rankguard.nope
except AttributeError as exc:
    api.append(str(exc))
api.append({"init", "Session", "__version__"} <= set(dir(rankguard)))
print(json.dumps({"before": before, "api": api, "ok": cfg == RankguardConfig()}))
"""


def _probe() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=50
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_rank_config_and_the_package_root_import_neither_yaml_nor_the_rank_side() -> None:
    got = _probe()
    assert got["ok"] is True
    assert got["before"] == {
        "yaml": False,
        "rankguard.bootstrap": False,
        "rankguard.session": False,
    }
    assert got["api"] == [
        "init",
        "Session",
        "current",
        "NullSession",
        "RankSession",
        "module 'rankguard' has no attribute 'nope'",
        True,
    ]
