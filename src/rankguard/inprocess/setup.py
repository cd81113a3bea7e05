"""A round's process-group set-up that goes on on every rank or on none.

``init_process_group`` exchanges the ranks' addresses through the store (each rank
publishes its own, then waits for every other's), then connects. Each rank's wait times
out on its own: a rank held up past the others' timeout (stopped, starved of CPU)
publishes its address after a peer gave up, reads the addresses, and goes on to connect
to a rank that is no longer there. gloo's side of a pair that waits for its peer to
connect (the lower address of the two) waits five times the group's timeout
(``tcp/pair.h``, ``Connect timeout``), inside C++, where no interrupt reaches; its peers
meanwhile wait for it at the next round's barrier. One rank's set-up timing out then
cost every rank that much, in the next round as well when the same race comes again.

:class:`SetupStore` gives the round one decision in the store, made once with
``compare_set``: ``go`` by the last rank to publish its address, ``gave up`` by the first
whose wait for an address timed out. A rank reads no address before ``go``, so no rank
starts connecting unless every rank has published; and once a rank gave up, every rank
fails the set-up at once (a late rank as it publishes, the others in their wait), none
is left waiting for a connection in gloo."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

_CHUNK_S = 0.2  # longest single wait on the inner store: the decision is read between
GO = b"go"


def _store_base() -> Any:
    import torch.distributed as dist  # here: `import rankguard` stays torch-free

    return dist.Store


class SetupStore(_store_base()):  # type: ignore[misc]
    """The round's prefixed store, through which ``init_process_group`` exchanges the
    addresses; the decision and the ranks that published live in the job's store under
    ``prefix`` (outside the group's own prefix). Only gloo's exchange fits (every rank
    publishes one address, then reads every rank's): NCCL's (rank 0 alone publishes the
    communicator's id) must not go through it, nor gloo's lazy connections
    (``TORCH_GLOO_LAZY_INIT``: pairs set up at their first use). A wait or a read before
    this rank published is passed through as it is."""

    def __init__(
        self, inner: Any, job_store: Any, prefix: str, *, rank: int, world: int, timeout_s: float
    ) -> None:
        super().__init__()
        self.inner = inner
        self.job = job_store
        self.prefix = prefix  # of the decision's keys in the job's store
        self.decision_key = prefix + "decision"
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        self.published = False
        self.go = False

    # ---- the decision -----------------------------------------------------------------

    def _decide(self, value: str) -> bytes:
        """``value`` as the round's decision unless one was made: the decision."""
        got = self.job.compare_set(self.decision_key, "", value)
        return bytes(got)

    def _given_up(self, decision: bytes) -> Exception:
        import torch.distributed as dist

        why = decision.decode(errors="replace")[:500]
        return dist.DistStoreError(f"the set-up of this round's group was given up: {why}")

    def _await_go(self, timeout: timedelta | None) -> None:
        """Until the decision is ``go``; the round given up (by this rank, its wait
        past ``timeout`` (default: the group's), or by a peer) raises."""
        if self.go or not self.published:
            return
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        deadline = time.monotonic() + limit
        while True:
            try:
                self.job.wait([self.decision_key], timedelta(seconds=_CHUNK_S))
            except Exception:  # not decided yet
                if time.monotonic() > deadline:
                    mine = f"rank {self.rank} waited {limit:g}s for {self._missing()}"
                    decision = self._decide(mine)
                    if decision == GO:
                        continue  # every rank published just now: the keys are there
                    raise self._given_up(decision) from None
                continue
            decision = bytes(self.job.get(self.decision_key))
            if decision == GO:
                self.go = True
                return
            raise self._given_up(decision)

    def _missing(self) -> str:
        """Whose addresses this rank waits for (the first 20 ranks not published)."""
        missing: list[int] = []
        for p in range(self.world):
            if not self.job.check([f"{self.prefix}here/{p}"]):
                missing.append(p)
                if len(missing) == 20:
                    return f"the addresses of rank(s) {missing} and more"
        return f"the addresses of rank(s) {missing}"

    # ---- the store ----------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)
        if self.published:
            return
        self.published = True
        self.job.set(f"{self.prefix}here/{self.rank}", "")
        if int(self.job.add(self.prefix + "published", 1)) >= self.world:
            decision = self._decide(GO.decode())
            if decision != GO:
                raise self._given_up(decision)
            self.go = True

    def get(self, key: str) -> bytes:
        self._await_go(None)
        return bytes(self.inner.get(key))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        started = time.monotonic()
        self._await_go(timeout)
        if timeout is None:
            self.inner.wait(keys)
            return
        left = timeout.total_seconds() - (time.monotonic() - started)
        self.inner.wait(keys, timedelta(seconds=max(left, 0.001)))

    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check(keys))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return bytes(self.inner.compare_set(key, expected, desired))

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)
