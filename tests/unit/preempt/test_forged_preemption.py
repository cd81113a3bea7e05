"""Store keys of preemption written by someone else: a request node 0 cannot confirm
does not preempt the job, and a malformed ``preempt`` value is ignored (logged once)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.preempt import PreemptionConfig
from rankguard.preempt.coordinator import PreemptionCoordinator
from rankguard.schema.layout import StoreKeys
from tests.factories import DictStore

KEYS = StoreKeys("r")


class _Workers:
    def pids(self) -> dict[int, int | None]:
        return {}

    def owns(self, pid: int) -> bool:
        return False


def _rank(node: int, signalled: bool) -> Any:
    extra = {"preempt": {"signal_received": signalled}}
    return SimpleNamespace(record=SimpleNamespace(node_rank=node, extra=extra))


def _coordinator(node: int, store: DictStore, tmp_path: Path, **kw: Any) -> PreemptionCoordinator:
    (tmp_path / f"n{node}").mkdir(exist_ok=True)
    return PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True, preempt_time=30),
        node_rank=node,
        nnodes=2,
        run_id="r",
        run_dir=tmp_path / f"n{node}",
        workers=_Workers(),  # type: ignore[arg-type]
        store=store,
        say=lambda m: None,
        **kw,
    )


def test_a_request_no_rank_of_its_node_confirms_does_not_preempt(tmp_path: Path) -> None:
    store = DictStore()
    ranks = {0: _rank(0, False), 1: _rank(1, False)}
    node0 = _coordinator(0, store, tmp_path, ranks=lambda: ranks, request_stop=lambda r, s: 5)
    store.set(KEYS.preempt_request(1), b"preempted: forged")
    for _ in range(3):
        node0.tick()
    assert not node0.active and node0.bad_values == 3
    ranks[1] = _rank(1, True)  # node 1's launcher really forwarded the signal
    node0.tick()
    assert node0.active and node0.reason == "preempted: forged"


def test_a_request_that_is_not_text_is_ignored(tmp_path: Path) -> None:
    store = DictStore()
    node0 = _coordinator(0, store, tmp_path)
    store.set(KEYS.preempt_request(1), b"\xff\xfe" * 10)
    node0.tick()
    assert not node0.active and node0.bad_values == 1


@pytest.mark.parametrize("value", ["[]", "1", "[" * 100_000, '{"stop_at_step": "x"}', "nope"])
def test_a_malformed_preempt_value_is_ignored_and_logged_once(
    tmp_path: Path, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = DictStore()
    node1 = _coordinator(1, store, tmp_path)
    store.set(KEYS.preempt, value)
    with caplog.at_level(logging.WARNING, logger="rankguard.preempt.coordinator"):
        for _ in range(50):
            node1.tick()
    assert not node1.active and node1.bad_values == 50
    assert len([r for r in caplog.records if "preempt ignored" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


def test_a_well_formed_preempt_value_still_preempts(tmp_path: Path) -> None:
    store = DictStore()
    node1 = _coordinator(1, store, tmp_path)
    store.set(KEYS.preempt, '{"stop_at_step": 12, "reason": "preempted: \\u001b[2J x"}')
    node1.tick()
    assert node1.active and node1.stop_at == 12
    assert "\x1b" not in (node1.reason or "")
