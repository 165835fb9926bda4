"""Act on what agents report: a failed or expired task ends in the dead-letter stream."""

from __future__ import annotations

import msgspec
import structlog
from nats.aio.msg import Msg

import envelopes
from broker import Broker
from coordinator.ending import end_with_error
from envelopes import DecodeError, ErrorInfo, Event, Task

log = structlog.get_logger("coordinator.outcomes")

OUTCOME_EVENTS = ("failed", "expired")


class Outcomes:
    """Turns ``failed`` and ``expired`` events into dead letters and error replies."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def handle(self, msg: Msg) -> None:
        try:
            event = envelopes.decode_event(msg.data)
            task = msgspec.convert(event.detail.get("task"), Task)
            error = msgspec.convert(event.detail.get("error"), ErrorInfo)
        except (DecodeError, msgspec.ValidationError) as exc:
            # Agents publish these; one that cannot be read is a bug to see, not to retry.
            log.error("unreadable outcome event", subject=msg.subject, error=str(exc))
            return
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, agent_id=event.agent_id
        ):
            await end_with_error(self._broker, task, _reason(event, error), error)


def _reason(event: Event, error: ErrorInfo) -> str:
    if event.event == "expired":
        return "expired"
    return "retries_exhausted" if error.retryable else "rejected"
