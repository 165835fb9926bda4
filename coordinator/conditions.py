"""One condition matcher, for routing rules (``where:``) and workflow transitions (``when:``).

A condition is ``field op value``. The value found at ``field`` is compared with
``value``; a field that is absent matches only ``exists: false``, and values that
cannot be compared (a number and a string under ``<``) simply do not match.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

import msgspec

Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "exists"]
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def lookup(value: Any, path: str) -> Any:
    """The value at dotted ``path`` ("" = ``value`` itself; digits index lists), or MISSING."""
    for key in filter(None, path.split(".")):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return MISSING
    return value


class Comparison(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``field op value``; what ``field`` names is up to the subclass."""

    field: str = ""
    op: Op = "=="
    value: Any = None

    def __post_init__(self) -> None:
        if self.op == "in" and not isinstance(self.value, list):
            raise ValueError(f"op 'in' needs a list value, got {self.value!r}")
        if self.op == "exists" and not isinstance(self.value, bool | None):
            raise ValueError(f"op 'exists' takes true or false, got {self.value!r}")

    def holds_for(self, found: Any) -> bool:
        """Whether the condition holds when ``found`` (or MISSING) stands at its field."""
        if self.op == "exists":
            return (found is not MISSING) == (self.value is not False)
        if found is MISSING:
            return False
        if self.op == "in":
            return isinstance(self.value, list) and found in self.value
        try:
            return bool(_COMPARE[self.op](found, self.value))
        except TypeError:  # "<" between a number and a string: simply not a match
            return False
