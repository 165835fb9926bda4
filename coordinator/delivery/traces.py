"""``reach.ctl.trace.<caller>``: a caller reads the trace of its own message through the
coordinator (under permissions a caller cannot read ``REACH_EVENTS``, which holds every
caller's results)."""

from __future__ import annotations

import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, Inbound
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.lifecycle import authentic
from agentreach.broker.names import COORDINATOR
from agentreach.envelopes import DecodeError, Event, TraceReply, TraceRequest, decode_as

log = structlog.get_logger("coordinator.status")

HEADROOM = 1024  # bytes kept free under the server's max payload


class TraceDesk:
    """Answers a caller with the events of a message it sent, and nothing of anyone else's."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def on_request(self, msg: Inbound) -> None:
        caller = msg.subject.rsplit(".", 1)[-1]
        try:
            request = decode_as(msg.data, TraceRequest)
        except DecodeError:
            return  # nobody to tell what: the asking client times out and says so
        names = self._broker.names
        try:
            stored = await indexed_messages_on(  # not a scan of every event: see broker.direct
                self._broker, names.events_stream, names.events_of_message(request.message_id)
            )
        except BrokerError as exc:
            log.warning("status not answered", message_id=request.message_id, error=str(exc))
            return
        trace = authentic(names, stored)
        # Only the coordinator's own events say who the caller was.
        sent_by_caller = any(
            event.caller == caller and names.sender_of(m.subject) == COORDINATOR
            for m, event in trace
        )
        events = [event for _, event in trace] if sent_by_caller else []
        await msg.respond(self._fitted(events))

    def _fitted(self, events: list[Event]) -> bytes:
        """The reply, without its oldest events when all would not fit one message."""
        limit = self._broker.max_payload - HEADROOM
        kept, truncated = list(events), False
        while len(data := envelopes.encode(TraceReply(events=kept, truncated=truncated))) > limit:
            kept, truncated = kept[len(kept) // 4 + 1 :], True
        return data
