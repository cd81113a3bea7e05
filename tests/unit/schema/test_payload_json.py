"""``load_json`` parses a relay's payload with ``json.loads``'s own scanner: whatever the
bytes, it returns what ``json.loads`` returns, or refuses what it refuses with the same
message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rankguard.schema.payloads import PayloadError, load_json

PAYLOADS: list[Any] = [
    b'{"a":1,"b":[1,2.5,"x",null,true]}',
    b'{"epoch":"e","gen":3,"ranks":[[1,2,3]]}',
    b'{"a":1} ',  # whitespace after the object
    b'{"a":1}\n\t ',
    b' {"a":1}',
    b'{"a":1}x',  # something after it
    b'{"a":1}{"b":2}',
    b'{"a":1',  # cut short
    b'{"a":}',
    b'{"',
    b'{"a":"\xc3\xa9\xe2\x82\xac"}',  # UTF-8 text: characters are not bytes
    b'{"a":"\xc3\xa9"}  ',
    b'{"a":"\xff"}',  # not UTF-8
    b'{"a":"\\ud800"}',  # a lone surrogate, escaped
    b'{"a":"\xed\xa0\x80"}',  # a lone surrogate, raw
    b'{"a":NaN,"b":-Infinity}',
    b'{"a":1,"a":2}',
    b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deeper than the parser goes
    b'{"a":' + b"[" * 50 + b"]" * 50 + b"}",
    b"\xef\xbb\xbf" + b'{"a":1}',  # a UTF-8 byte order mark
    '{"a":1}'.encode("utf-16"),
    '{"a":1}'.encode("utf-32-le"),
    b"[1,2]",
    b"null",
    b"",
    '{"a":1}',  # text, not bytes
    '{"a":1} x',
    bytearray(b'{"a":1}'),
    None,
    7,
]


def _reference(raw: Any) -> Any:
    """What ``load_json`` gave with ``json.loads`` alone."""
    if raw is None:
        return ("error", "no value")
    try:
        return ("value", json.loads(raw))
    except RecursionError:
        return ("error", "nested too deeply")
    except (ValueError, TypeError) as exc:
        return ("error", f"not JSON ({type(exc).__name__})")


@pytest.mark.parametrize("raw", PAYLOADS, ids=range(len(PAYLOADS)))
def test_load_json_is_json_loads(raw: Any) -> None:
    want = _reference(raw)
    try:
        got: Any = ("value", load_json(raw))
    except PayloadError as exc:
        got = ("error", str(exc))
    if want[0] == "value" and isinstance(want[1], dict) and "a" in want[1]:
        # NaN is not equal to itself: compare the text of what was parsed
        assert got[0] == "value" and repr(got[1]) == repr(want[1])
    else:
        assert got == want
