"""Text from records, findings and hostnames made safe to print on a terminal.

Anything a rank, a relay or a file on disk wrote can hold control characters: ESC starts
a terminal escape sequence (recolour, move the cursor, retitle the window, rewrite what
was printed), CR overwrites the line, BEL rings. :func:`safe_text` shows each such
character as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``) instead, so what is printed
is what was recorded, and only rankguard's own codes reach the terminal.
"""

from __future__ import annotations

import re

__all__ = ["safe_text"]

# C0 controls and DEL, C1 controls, line/paragraph separators and the bidirectional
# overrides/isolates (which reorder what is displayed).
_UNSAFE = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(value: object, *, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control character escaped (``keep_newlines``: a ``\\n``
    stays a line break, for text that is meant to span lines)."""
    text = value if isinstance(value, str) else str(value)
    if keep_newlines:
        return "\n".join(_UNSAFE_RE.sub(_escape, line) for line in text.split("\n"))
    return _UNSAFE_RE.sub(_escape, text)
