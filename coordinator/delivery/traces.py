"""``reach.ctl.trace.<caller>``: a caller reads the events of its own messages, by a message
id or a trace id, through the coordinator (under permissions a caller cannot read
``REACH_EVENTS``, which holds every caller's results, nor ``REACH_TASKS``); of a message it
sent that is not routed yet, that it waits in the intake."""

from __future__ import annotations

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, Inbound
from agentreach.broker.lifecycle import own_events
from agentreach.coordinator.delivery.unrouted import unrouted
from agentreach.envelopes import (
    DecodeError,
    TraceReply,
    TraceRequest,
    Unrouted,
    decode_as,
    is_token,
)

log = structlog.get_logger("coordinator.status")

HEADROOM = 1024  # bytes kept free under the server's max payload


class TraceDesk:
    """Answers a caller with the events of a message it sent, or of the messages it sent in a
    trace, and nothing of anyone else's."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def on_request(self, msg: Inbound) -> None:
        caller = msg.subject.rsplit(".", 1)[-1]
        try:
            request = decode_as(msg.data, TraceRequest)
        except DecodeError:
            return  # nobody to tell what: the asking client times out and says so
        names, wanted = self._broker.names, request.message_id
        if not is_token(wanted):  # a wildcard would have every event read
            await msg.respond(self._fitted(TraceReply()))
            return
        waiting: list[Unrouted] = []
        try:
            events, others = await own_events(self._broker, caller, names.events_of_message(wanted))
            if not events:  # none of the caller's messages has that id: a trace may
                events, _ = await own_events(self._broker, caller, names.events_of_trace(wanted))
            if not events:  # nothing recorded: it may wait in the intake, not routed yet
                waiting = await unrouted(self._broker, wanted, caller=caller)
        except BrokerError as exc:
            log.warning("status not answered", message_id=wanted, error=str(exc))
            return
        others = others and not events
        reply = TraceReply(events=events, others=others, unrouted=waiting)
        await msg.respond(self._fitted(reply))

    def _fitted(self, reply: TraceReply) -> bytes:
        """``reply`` encoded, without its oldest events (or tasks not routed yet) when all
        would not fit one message."""
        limit = self._broker.max_payload - HEADROOM
        while len(data := envelopes.encode(reply)) > limit:
            reply = _shortened(reply)
        return data


def _shortened(reply: TraceReply) -> TraceReply:
    """``reply`` without the oldest quarter of its events, or, with none, of its tasks not
    routed yet (a trace may have thousands waiting)."""
    if reply.events:
        events = reply.events[len(reply.events) // 4 + 1 :]
        return msgspec.structs.replace(reply, events=events, truncated=True)
    waiting = reply.unrouted[len(reply.unrouted) // 4 + 1 :]
    return msgspec.structs.replace(reply, unrouted=waiting, truncated=True)
