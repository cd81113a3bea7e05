"""Values read from a file or the store into the type a reader expects, or None: one
module for every reader of run files (a value of the wrong type is never trusted, never
raised on).

``as_int``: an int (not a bool); ``as_number``: an int or float as it is (not a bool);
``as_float``: any number as a float; ``as_finite``: a finite number as a float;
``as_str``, ``as_dict``, ``as_list``: that type, else None (``as_list``: else []).
``as_dict`` and ``as_list`` return JSON types (:mod:`rankguard.schema.jsontypes`): a value
taken out of them is narrowed again before use.
"""

from __future__ import annotations

import math

from rankguard.schema.jsontypes import JsonObject, JsonValue

__all__ = ["as_dict", "as_finite", "as_float", "as_int", "as_list", "as_number", "as_str"]


def as_int(value: object) -> int | None:
    return value if type(value) is int else None


def as_number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def as_float(value: object) -> float | None:
    number = as_number(value)
    return None if number is None else float(number)


def as_finite(value: object) -> float | None:
    number = as_float(value)
    return number if number is not None and math.isfinite(number) else None


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def as_dict(value: object) -> JsonObject | None:
    return value if isinstance(value, dict) else None


def as_list(value: object) -> list[JsonValue]:
    return value if isinstance(value, list) else []
