"""What the property-based fuzz tests share: JSON values of any shape, texts that break
naive parsers, and the per-input bound on time and memory every reader must hold to."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import strategies as st

__all__ = ["MAX_BYTES", "MAX_S", "bounded", "dumps", "json_values", "nasty_text"]

MAX_S = 2.0  # per input, on a loaded CI machine
MAX_BYTES = 64 << 20  # allocated at the peak, per input

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
nasty_text = st.sampled_from(
    [
        "[" * 100_000,
        '{"a":' * 50_000,
        "1" * 5000,
        "1e999999",
        "\x00\x1b[2J\x07",
        "\ud800",
        "",
        "null",
        "NaN",
        '"' + "x" * 200_000 + '"',
    ]
)


def dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


@contextmanager
def bounded(what: str) -> Iterator[None]:
    """The block takes under :data:`MAX_S` and allocates under :data:`MAX_BYTES`."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < MAX_S, f"{what}: {elapsed:.2f}s"
    assert peak < MAX_BYTES, f"{what}: {peak} bytes"
