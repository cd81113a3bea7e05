"""The JSON types: what a file, the store or a payload holds before it is parsed into a typed block.

A reader narrows a ``JsonValue`` (``isinstance`` or :mod:`rankguard.schema.coerce`) before it
uses it; nothing read from outside the process is trusted as a ``dict[str, Any]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
"""One JSON value, as ``json.loads`` returns it."""

JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object: a block or a record as written, or as read before parsing."""

JsonInput: TypeAlias = "Mapping[str, object]"
"""A JSON object read from outside the process, read-only: every value is narrowed before use."""

__all__ = ["JsonInput", "JsonObject", "JsonValue"]
