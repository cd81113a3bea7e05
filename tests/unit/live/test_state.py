"""``live_state``: the optimizer's state as JSON plus tensors, and two gloo ranks where
a newcomer gets a survivor's model, optimizer, RNG and step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.live.state import decode_state, encode_state, live_state
from tests.factories import DictStore, run_ranks


def _trained(steps: int, seed: int) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1, betas=(0.8, 0.9))
    for _ in range(steps):
        net(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return net, opt


def test_the_optimizer_state_round_trips_without_pickle() -> None:
    _, opt = _trained(3, 0)
    tensors: list[Any] = []
    data = encode_state(opt.state_dict(), tensors)

    back = decode_state(json.loads(json.dumps(data)), tensors)
    _, fresh = _trained(0, 1)
    fresh.load_state_dict(back)
    got, want = fresh.state_dict(), opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    for i, state in want["state"].items():
        for name, value in state.items():
            assert torch.equal(got["state"][i][name], value)


class _OneRankDist:
    """A receiving rank's torch.distributed: each broadcast counted, the buffer set to
    the source's values (``fill``)."""

    def __init__(self, fill: float) -> None:
        self.fill, self.calls = fill, 0

    def get_rank(self) -> int:
        return 1

    def get_backend(self) -> str:
        return "gloo"

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        assert src == 0
        self.calls += 1
        t.fill_(self.fill)


def test_the_model_and_optimizer_state_cross_in_one_broadcast_per_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rankguard.live.state as state

    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(10)])  # 20 tensors
    net.register_buffer("count", torch.zeros(3, dtype=torch.int64))
    fake = _OneRankDist(7.0)
    monkeypatch.setattr(state, "_dist", lambda: fake)
    state._broadcast_model(net, 0)
    assert fake.calls == 2  # float32 and int64: not one per tensor
    for t in net.state_dict().values():
        assert bool((t == 7).all())


def test_a_bad_entry_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_state({"x": 1, "y": 2}, [])
    with pytest.raises(ValueError):
        decode_state({"q": 1}, [])
    with pytest.raises(TypeError):
        encode_state({"f": object()}, [])


def test_outside_a_wrapped_call_the_step_is_unchanged() -> None:
    net, opt = _trained(0, 0)
    assert live_state(model=net, optimizer=opt, step=7) == 7


def _newcomer_rank(rank: int, world: int) -> dict[str, Any]:
    from rankguard.live.keys import LiveKeys
    from rankguard.live.link import LiveLink, bind
    from rankguard.live.plan import Assignment

    steps = 5 if rank == 0 else 0  # rank 1 is a standby that has just taken its rank
    net, opt = _trained(steps, seed=rank)
    torch.manual_seed(100 + rank)
    link = LiveLink(LiveKeys("t", 0), standby=rank == 1)
    link.store = DictStore()
    link.current_round, link.newcomers = 1, [1]
    if rank == 1:
        link.assignment = Assignment(
            rank=1, local_rank=1, lost_pid=1, standby_pid=2, cause="x", fault_t=0.0
        )
    bind(link)
    agreed = live_state(model=net, optimizer=opt, step=steps)
    again = live_state(model=net, optimizer=opt, step=steps)  # the same round: no transfer
    rng = torch.get_rng_state().clone()
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    net(torch.ones(2, 4)).sum().backward()
    opt.step()
    return {
        "agreed": agreed,
        "again": again,
        "declared": link.store.check([link.keys.declared]),
        "weights": weights,
        "after": {k: v.clone() for k, v in net.state_dict().items()},
        "rng": rng,
        "resumed": link._resumed,
    }


@pytest.mark.ranks
def test_a_newcomer_gets_the_survivors_state(tmp_path: Path) -> None:
    survivor, newcomer = run_ranks(2, _newcomer_rank, store_dir=tmp_path)
    assert survivor["agreed"] == newcomer["agreed"] == 5
    assert newcomer["again"] == 0 and survivor["again"] == 5  # once per round
    assert survivor["declared"] and newcomer["declared"]
    for name, value in survivor["weights"].items():
        assert torch.equal(newcomer["weights"][name], value)
    for name, value in survivor["after"].items():  # the optimizer's moments came too
        assert torch.equal(newcomer["after"][name], value)
    assert torch.equal(newcomer["rng"], survivor["rng"])
    assert survivor["resumed"] is None
    assert newcomer["resumed"].step == 6 and newcomer["resumed"].steps_redone == 0
    assert newcomer["resumed"].source == "replica on rank 0"


def _relay_rank(rank: int, world: int) -> dict[str, Any]:
    """Round 1: rank 1 is a newcomer and gets rank 0's state. Round 2: rank 0 is lost in
    turn and its newcomer must get that state from rank 1, the only rank left holding
    it (a newcomer of an earlier round)."""
    from rankguard.live.keys import LiveKeys
    from rankguard.live.link import LiveLink, bind
    from rankguard.live.plan import Assignment

    def newcomer_link(of: int) -> LiveLink:
        link = LiveLink(LiveKeys("t", 0), standby=True)
        link.store = DictStore()
        link.assignment = Assignment(
            rank=of, local_rank=of, lost_pid=1, standby_pid=2, cause="x", fault_t=0.0
        )
        return link

    steps = 5 if rank == 0 else 0
    net, opt = _trained(steps, seed=rank)
    if rank == 0:
        link = LiveLink(LiveKeys("t", 0), standby=False)
        link.store = DictStore()
    else:
        link = newcomer_link(1)
    link.current_round, link.newcomers = 1, [1]
    bind(link)
    first = live_state(model=net, optimizer=opt, step=steps)
    if rank == 0:  # its process is lost: a standby with a fresh model takes rank 0
        net, opt = _trained(0, seed=7)
        link = newcomer_link(0)
        bind(link)
        steps = 0
    else:
        steps = first
    link.current_round, link.newcomers = 2, [0]
    second = live_state(model=net, optimizer=opt, step=steps)
    return {
        "first": first,
        "second": second,
        "weights": {k: v.clone() for k, v in net.state_dict().items()},
    }


@pytest.mark.ranks
def test_a_newcomer_of_an_earlier_round_is_the_source_for_the_next(tmp_path: Path) -> None:
    zero, one = run_ranks(2, _relay_rank, store_dir=tmp_path)
    assert zero["first"] == one["first"] == 5
    # every rank of the job has been replaced once: the state still comes from a rank
    # that holds it, not each rank's own (the new rank 0 would train from step 0)
    assert zero["second"] == one["second"] == 5
    for name, value in one["weights"].items():
        assert torch.equal(zero["weights"][name], value)
