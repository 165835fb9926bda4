"""A dispatched message that JetStream gave up on (max deliveries) becomes a dead letter.

The advisory is captured in a stream, so it waits for a coordinator that is down.
Dispatch streams are work queues: the message stays until removed, so it is
read, dead-lettered, and only then deleted — never the other way round.
"""

from __future__ import annotations

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, Delivery
from agentreach.broker.lifecycle import dead_letter
from agentreach.broker.streams import delete_message, get_message
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.envelopes import DecodeError, ErrorInfo, decode_as

log = structlog.get_logger("coordinator.advisories")


class MaxDeliveries(msgspec.Struct, frozen=True):
    """The parts of ``io.nats.jetstream.advisory.v1.max_deliver`` we use."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int


class Advisories:
    """Turns max-deliveries advisories of dispatch streams into ``retries_exhausted``."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def handle(self, msg: Delivery) -> None:
        try:
            advisory = decode_as(msg.data, MaxDeliveries)
        except DecodeError as exc:
            log.error("unreadable advisory", subject=msg.subject, error=str(exc))
            return
        stored = await get_message(self._broker, advisory.stream, advisory.stream_seq)
        if stored is None:
            return  # acknowledged or removed since: nothing was lost
        error = ErrorInfo(
            type="max_deliveries",
            message=f"delivered {advisory.deliveries} times to {advisory.consumer}"
            " without an acknowledgement",
            retryable=False,
        )
        await self._dead_letter(stored.data, stored.headers, error)
        await delete_message(self._broker, advisory.stream, advisory.stream_seq)

    async def _dead_letter(self, data: bytes, headers: dict[str, str], error: ErrorInfo) -> None:
        try:
            task = envelopes.decode_task(data)
        except DecodeError:
            message_id = headers.get("Nats-Msg-Id", "unknown").replace(".", "_")
            await dead_letter(
                self._broker,
                reason="retries_exhausted",
                message_id=message_id,
                trace_id=message_id,
                topic="_invalid",
                error=error,
                raw=data,
                headers=headers,
            )
            return
        log.warning("max deliveries reached", message_id=task.message_id, error=error.message)
        await end_with_error(self._broker, task, "retries_exhausted", error)
