"""A caller's arguments checked by the envelope's own rules, before anything is sent: a
task, or an invoke's deadlines. A wrong one is named as the caller wrote it, since the
envelope's path (``$.budget.ack_ms``) is not what the caller typed (``ack_deadline_ms``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from agentreach import envelopes
from agentreach.agents.errors import InvalidArgument
from agentreach.envelopes import MAX_TTL_MS, Budget, DecodeError, Task

T = TypeVar("T")
_TOKEN = "use 1-128 letters, digits, '_' or '-': it becomes part of NATS subjects"
_MS = f"whole milliseconds from 1 to {MAX_TTL_MS}, a day"
# What each field may hold, where msgspec's own words (a regular expression) say it badly.
_RULES = {
    "message_id": _TOKEN,
    "trace_id": _TOKEN,
    "topic": _TOKEN,
    "priority": "use P0, P1 or P2",
    "reply_to": "use a literal NATS subject, not a system one ($JS…, $SYS…)",
    "headers": "names and values are strings",
    "ttl_ms": _MS,
    "budget": _MS,
    "ack_ms": _MS,
    "execute_ms": _MS,
}
_UNENCODABLE = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)


def task_of(fields: dict[str, Any]) -> Task:
    """The task ``fields`` make, validated as the coordinator will validate it."""
    return _checked(fields, Task, {})


def budget_of(*, ack_deadline_ms: int, execute_deadline_ms: int) -> Budget:
    """An invoke's deadlines as the task's budget."""
    fields = {"ack_ms": ack_deadline_ms, "execute_ms": execute_deadline_ms}
    return _checked(
        fields, Budget, {"ack_ms": "ack_deadline_ms", "execute_ms": "execute_deadline_ms"}
    )


def _checked(fields: dict[str, Any], kind: type[T], named: Mapping[str, str]) -> T:
    try:
        data = envelopes.encode(fields)
    except _UNENCODABLE as exc:
        raise _unencodable(fields, exc, named) from None
    try:
        return envelopes.decode_as(data, kind)
    except DecodeError as exc:
        raise _wrong(fields, exc, named) from None


def _wrong(fields: dict[str, Any], exc: DecodeError, named: Mapping[str, str]) -> InvalidArgument:
    """``exc`` (about ``$.budget.ack_ms``) told as the argument it came from."""
    field = exc.path.removeprefix("$.").split("[", 1)[0]
    argument = named.get(field, field)
    reason = exc.message.removesuffix(f" - at `{exc.path}`")
    rule = _RULES.get(field.split(".", 1)[0])
    if rule and "matching regex" in reason:
        reason = rule
    elif rule:
        reason = f"{reason} ({rule})"
    given = _at(fields, field.split("."))
    return InvalidArgument(f"{argument}={given!r}: {reason}", argument=argument)


def _unencodable(
    fields: dict[str, Any], exc: BaseException, named: Mapping[str, str]
) -> InvalidArgument:
    """Which of ``fields`` has no JSON form (looked for only once encoding them failed)."""
    for field, value in fields.items():
        try:
            envelopes.encode(value)
        except _UNENCODABLE as own:
            argument = named.get(field, field)
            if argument == "payload":
                said = f"payload of {fields.get('topic')!r}"
            else:
                said = f"{argument}={value!r}"
            return InvalidArgument(f"{said} cannot be encoded as JSON: {own}", argument=argument)
    return InvalidArgument(f"cannot be encoded as JSON: {exc}", argument="")


def _at(value: Any, path: list[str]) -> Any:
    for part in path:
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value
