"""One condition matcher, for routing rules (``where:``) and workflow transitions (``when:``).

A condition is ``field op value``. The value found at ``field`` is compared with
``value``; a field that is absent matches only ``exists: false``, and values of two JSON
types (a number and a string, ``true`` and ``1``) are only ever unequal: they match ``!=``
and nothing else.
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

    def not_compared(self, found: Any) -> str | None:
        """Why ``found`` did not match for want of a comparison (a string against a
        number: ``"5000" >= 1000`` is no match, and says nothing), or None."""
        if self.op in ("exists", "in") or found is MISSING or found is None:
            return None
        if self.value is None or _kind(found) == _kind(self.value):
            return None
        return (
            f"{self.field} is {_shown(found)} ({_kind(found)}), not compared with"
            f" {_shown(self.value)} ({_kind(self.value)}) by {self.op}"
        )

    def holds_for(self, found: Any) -> bool:
        """Whether the condition holds when ``found`` (or MISSING) stands at its field."""
        if self.op == "exists":
            return (found is not MISSING) == (self.value is not False)
        if found is MISSING:
            return False
        if self.op == "in":
            kind = _kind(found)
            return isinstance(self.value, list) and any(
                kind == _kind(v) and found == v for v in self.value
            )
        if _kind(found) != _kind(self.value):  # JSON's types: true is not 1, "5" is not 5
            return self.op == "!="
        try:
            return bool(_COMPARE[self.op](found, self.value))
        except TypeError:  # "<" between two objects: simply not a match
            return False


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    said = repr(value)
    return said if len(said) <= 40 else f"{said[:37]}..."
