"""Control characters from records never reach the terminal raw."""

from __future__ import annotations

import pytest

from rankguard.util.textsafe import safe_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("node-a", "node-a"),
        ("n\x1b[2J\x1b]0;owned\x07", "n\\x1b[2J\\x1b]0;owned\\x07"),
        ("ok\rFAKE", "ok\\rFAKE"),
        ("a\tb\nc", "a\\tb\\nc"),
        ("\x00\x7f\x9b31m", "\\x00\\x7f\\x9b31m"),
        ("abc\u202edef\u2066", "abc\\u202edef\\u2066"),
        ("line\u2028sep", "line\\u2028sep"),
        ("ünïcødé ✓ 节点", "ünïcødé ✓ 节点"),
        (42, "42"),
    ],
)
def test_control_characters_are_escaped(raw: object, shown: str) -> None:
    assert safe_text(raw) == shown


def test_newlines_can_be_kept_where_lines_are_meant() -> None:
    assert safe_text("one\x1b\ntwo\r", keep_newlines=True) == "one\\x1b\ntwo\\r"
