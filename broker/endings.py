"""What a message ended with, as its recorded lifecycle events say: for a caller that sends
a message id the stream holds already (a retry within the duplicate window). The stream
drops such a publish, so no agent answers the new reply address; the earlier message's
events are read instead until they end it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from agentreach.envelopes import ErrorInfo, Event, PayloadRef

FIRST_PAUSE_S = 0.05  # between two reads while the earlier message runs, doubling
LONGEST_PAUSE_S = 1.0


class OthersMessage(Exception):
    """The id is another caller's message: its end is not this caller's to hear."""


class ReusedId(OthersMessage):
    """The id is this caller's earlier message of another request (another topic, or
    another payload): its end is not the answer to this one."""


@dataclass(frozen=True, slots=True)
class Sent:
    """What a caller sent again under an earlier message's id: its topic, and the SHA-256
    of its payload as JSON (None: not compared). The first attempt's ``routed`` event
    records the first message's (``sent_topic``, ``input.sha256``)."""

    topic: str
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class Ended:
    """A result (inline, or where it is kept) or the error its sender was given."""

    result: Any = None
    result_ref: PayloadRef | None = None
    error: ErrorInfo | None = None
    reason: str | None = None  # how an error ended it, as an error reply's ``reason`` says
    ran: bool | None = None  # whether its work began, as an error reply's ``ran`` says
    attempt: int | None = None  # the attempt its ending event is about
    attempts: int | None = None  # those that ran, as an error reply's ``attempts`` says


def ending_of(events: Iterable[Event]) -> Ended | None:
    """How ``events`` (one message's, oldest first) end it, or None while it has not ended."""
    for event in events:
        detail = event.detail
        match event.event:
            case "completed" | "workflow_completed":
                ref = detail.get("result_ref")
                return Ended(
                    result=detail.get("result"),
                    result_ref=msgspec.convert(ref, PayloadRef) if isinstance(ref, dict) else None,
                )
            case "dead_lettered" | "rejected" | "workflow_failed" | "workflow_cancelled":
                ran, attempts = detail.get("ran"), detail.get("attempts")
                return Ended(
                    error=_error(detail),
                    reason=_reason(event.event, detail),
                    ran=ran if isinstance(ran, bool) else None,
                    attempt=event.attempt,
                    attempts=attempts if type(attempts) is int else None,
                )
    return None


def _reason(kind: str, detail: dict[str, Any]) -> str | None:
    """The ``reason`` the error reply of an ending of ``kind`` carries."""
    match kind:
        case "rejected":
            return "refused"  # a refusal that leaves no dead letter
        case "workflow_cancelled":
            return "cancelled"
        case _:
            reason = detail.get("reason")
            return reason if isinstance(reason, str) else None


async def wait_for_ending(
    read: Callable[[], Awaitable[list[Event]]],
    *,
    within_s: float,
    caller: str | None = None,
    sent: Sent | None = None,
) -> Ended | None:
    """Read a message's events (``read``) until they end it; None after ``within_s``.
    Raises OthersMessage when ``caller`` is given and the events are of another caller's
    message (a reused id: its result must not reach this caller, nor need it wait), and
    ReusedId when ``sent`` is not the request the events are of."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within_s
    pause = FIRST_PAUSE_S
    while (ended := ending_of(_same_request(_own(await read(), caller), sent))) is None:
        left = until - loop.time()
        if left <= 0:
            return None
        await asyncio.sleep(min(pause, left))  # nothing to await: the events are polled
        pause = min(pause * 2, LONGEST_PAUSE_S)
    return ended


def _own(events: list[Event], caller: str | None) -> list[Event]:
    # A message of no caller (an operator's bare form) is not this caller's either.
    if caller is not None and events and caller not in {e.caller for e in events}:
        raise OthersMessage(f"message id {events[0].message_id!r} is another caller's message")
    return events


def _same_request(events: list[Event], sent: Sent | None) -> list[Event]:
    """``events``, unless their first ``routed`` event (a workflow's ``workflow_started``)
    says they are of another request than ``sent`` (before that event, and from a
    coordinator that does not record what was sent, nothing is compared)."""
    first = next((e for e in events if _first_of_request(e)), None)
    if sent is not None and first is not None and (differs := difference(first, sent)):
        raise ReusedId(
            f"message id {first.message_id!r} is of an earlier request of yours, which"
            f" {differs}: under this id it would only hear that request's outcome (the stream"
            " drops a message id it has seen within its duplicate window)"
        )
    return events


def _first_of_request(event: Event) -> bool:
    return (event.event == "routed" and event.attempt == 1) or event.event == "workflow_started"


def difference(routed: Event, sent: Sent) -> str | None:
    """What differs between ``sent`` and the request whose first ``routed`` event (or
    ``workflow_started``: the workflow's name is its topic) is ``routed``, said of the latter
    ("was sent on topic …"); None when nothing recorded does."""
    topic, digest = routed.detail.get("sent_topic"), _digest(routed.detail.get("input"))
    if routed.event == "workflow_started":
        topic = routed.topic
    # The topic it was routed on is the same request too (a rule's or the resolution's: the
    # task as dispatched, met again in an agent's queue).
    if isinstance(topic, str) and sent.topic not in (topic, routed.topic):
        return f"was sent on topic {topic!r}, this one on {sent.topic!r}"
    if sent.sha256 is not None and digest is not None and digest != sent.sha256:
        return f"had another payload (SHA-256 {digest[:12]}…, this one's {sent.sha256[:12]}…)"
    return None


def _digest(summary: object) -> str | None:
    digest = summary.get("sha256") if isinstance(summary, dict) else None
    return digest if isinstance(digest, str) else None


def _error(detail: dict[str, Any]) -> ErrorInfo:
    error = detail.get("error")
    if isinstance(error, dict):
        try:
            return msgspec.convert(error, ErrorInfo)
        except msgspec.ValidationError:
            pass
    reason = str(detail.get("reason", "failed"))
    return ErrorInfo(type=reason, message=f"the message ended as {reason}", retryable=False)
