"""What a process imports before it works: ``import rankguard`` and a rank's config
(JSON from the launcher) load neither PyYAML nor the rank side of the package, nor the
in-process restart's wrapper; the rank's API and the wrapper's still resolve on first
use. The check runs in a fresh interpreter."""

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
before = {
    m: m in sys.modules
    for m in (
        "yaml",
        "rankguard.bootstrap",
        "rankguard.session",
        "rankguard.inprocess.wrapper",
        "rankguard.live.state",
    )
}
api = [rankguard.init.__name__, rankguard.Session.__name__, rankguard.current.__name__]
from rankguard import NullSession, RankSession
api += [NullSession.__name__, RankSession.__name__]
import rankguard.inprocess as ip
from rankguard.inprocess import live_state
api += [ip.wrap.__name__, live_state.__name__, ip.interrupt.__name__]
try:
    ip.nope
except AttributeError as exc:
    api.append(str(exc))
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
        "rankguard.inprocess.wrapper": False,
        "rankguard.live.state": False,
    }
    assert got["api"] == [
        "init",
        "Session",
        "current",
        "NullSession",
        "RankSession",
        "wrap",
        "live_state",
        "rankguard.inprocess.interrupt",
        "module 'rankguard.inprocess' has no attribute 'nope'",
        "module 'rankguard' has no attribute 'nope'",
        True,
    ]
